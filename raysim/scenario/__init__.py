"""The scenario: what a YAML file means, checked before anything runs.

- ``config``: load a scenario file (overrides, sweeps, seeds) and validate it into a frozen
  ``Scenario``; every refusal is one ``FILE: KEY: what is wrong; what is allowed`` line. The
  public names of the three modules below are re-exported there: callers import from config.
- ``validation``: ``validate``, the checks in order, one step a section.
- ``federation_checks``: the systems, privacy and communication sections' checks.
- ``probe``: what a scenario names, opened before the run (data, model, method, traces).
- ``schema``: the vocabulary those checks are written in (coercion, ranges, components).
- ``sections``: the dataclasses of the scenario's sections (resources, eval, ...; every
  section's dataclass can be imported from it).
- ``federation_sections``: those of topology, server, privacy, communication and systems.
- ``build``: turns a validated scenario into its parts (the model factory, the algorithm).
- ``stores``: which MLflow tracking URIs can be opened, known without importing MLflow.

May import: the foundation modules (``raysim.errors``, ``rng``, ``plugins``, ``cachedir``,
``signals``), ``raysim.core``, ``raysim.algorithms``, ``raysim.data``, ``raysim.models`` and
``raysim.federation``. Never the engine, results or experiment wings.
"""
