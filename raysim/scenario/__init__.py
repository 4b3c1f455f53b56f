"""The scenario: what a YAML file means, checked before anything runs.

- ``config``: load a scenario file (overrides, sweeps, seeds) and validate it into a frozen
  ``Scenario``; every refusal is one ``FILE: KEY: what is wrong; what is allowed`` line.
- ``schema``: the vocabulary those checks are written in (coercion, ranges, components).
- ``sections``: the dataclasses of the scenario's sections (privacy, systems, resources, ...).
- ``build``: turns a validated scenario into its parts (the model factory, the algorithm).
- ``stores``: which MLflow tracking URIs can be opened, known without importing MLflow.

May import: the foundation modules (``raysim.errors``, ``rng``, ``plugins``, ``cachedir``,
``signals``), ``raysim.core``, ``raysim.algorithms``, ``raysim.data``, ``raysim.models`` and
``raysim.federation``. Never the engine, results or experiment wings.
"""
