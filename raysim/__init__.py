"""raysim: a federated-learning simulator on Ray.

The Python API (``raysim.api``): ``raysim.run`` runs a scenario and returns its results,
``raysim.load`` reads a finished run back from MLflow. They are imported on first use, so
``import raysim`` (and the ``raysim`` command's start) imports neither torch, Ray nor MLflow.
"""
__version__ = "0.1.0"

_API = ("run", "load", "shutdown", "Result", "SweepResult", "ScenarioError")
__all__ = [*_API, "__version__"]


def __getattr__(name: str):
    if name in _API:
        from raysim import api
        return getattr(api, name)
    raise AttributeError(f"module 'raysim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
