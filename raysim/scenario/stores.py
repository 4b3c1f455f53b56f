"""The tracking stores MLflow has, by URI scheme, known without importing MLflow where it is not
imported yet (a run's MLflow loads in a helper process, ``raysim.results.tracker_process``, and its
import costs a second or two before Ray starts): a tracking URI of a scheme MLflow cannot open
is refused at validation (one ScenarioError line, exit 2), not after the run's training."""

from __future__ import annotations

import sys
import urllib.parse

# MLflow's own tracking stores (``mlflow.tracking._tracking_service.utils._register_tracking_stores``):
# a path or file:, Databricks (databricks-uc and uc: MLflow's own refusal), an HTTP(S) server, and
# the SQL databases when SQLAlchemy is installed
_MLFLOW_STORES = ("", "file", "databricks", "databricks-uc", "uc", "http", "https")
_WHOLE_URIS = ("databricks", "databricks-uc", "uc")  # MLflow reads these URIs whole as schemes
_DATABASES = ("postgresql", "mysql", "sqlite", "mssql")
_PLUGIN_STORES = "mlflow.tracking_store"  # the entry points of MLflow's store plugins


def store_scheme(uri: str) -> str:
    """The scheme MLflow chooses ``uri``'s tracking store by (``mlflow.utils.uri.get_uri_scheme``):
    the URI itself for databricks, databricks-uc and uc; a database's without its driver
    (``postgresql+psycopg2`` is postgresql); none for a path."""
    if uri in _WHOLE_URIS:
        return uri
    scheme = urllib.parse.urlparse(uri).scheme
    base = scheme.split("+", 1)[0]
    if base in _DATABASES:
        return base
    return "" if len(scheme) == 1 else scheme  # a Windows drive letter is a path


def tracking_schemes() -> set[str]:
    """The schemes MLflow has a tracking store for. Where MLflow is imported, its registry's
    (stores registered at run time included); elsewhere, what MLflow's registry is made of as it
    loads: its own stores, and the plugins' entry points."""
    if "mlflow" in sys.modules:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        return set(_tracking_store_registry._registry)
    return _schemes_mlflow_loads()


def _schemes_mlflow_loads() -> set[str]:
    import importlib.metadata

    return {*_own_stores(), *(ep.name for ep in importlib.metadata.entry_points(group=_PLUGIN_STORES))}


def _own_stores() -> tuple[str, ...]:
    import importlib.util

    return _MLFLOW_STORES + (_DATABASES if importlib.util.find_spec("sqlalchemy") else ())


def unknown_store(uri: str) -> str | None:
    """What is wrong with a tracking URI whose scheme MLflow has no store for (the message,
    without the key), else None. MLflow's own schemes are taken without reading the installed
    distributions' entry points."""
    scheme = store_scheme(uri)
    if scheme in _own_stores():
        return None
    schemes = tracking_schemes()
    if scheme in schemes:
        return None
    return (
        f"{uri}: MLflow has no tracking store for the scheme {scheme!r}; give a file path or a URI of "
        f"scheme {', '.join(sorted(schemes - {''}))} (a plugin's scheme: install its package)"
    )
