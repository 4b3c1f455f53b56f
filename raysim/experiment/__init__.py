"""Running experiments: one run, a sweep of them, and what happens around them.

- ``runner``: one scenario end to end (MLflow run, checkpoints, the engine's rounds, the
  crash and resume paths).
- ``sweep``: a file's variants and seeds, one after another, side by side, or on Ray Tune.
- ``preflight``: the checks that run before Ray starts, without torch or MLflow.

May import every wing below it: ``raysim.scenario``, ``raysim.engine``, ``raysim.results`` and
what they stand on. Only ``raysim.api`` and ``raysim.cli`` import it.
"""
