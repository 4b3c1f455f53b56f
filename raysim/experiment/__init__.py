"""Running experiments: one run, a sweep of them, and what happens around them.

- ``runner``: one scenario end to end (MLflow run, checkpoints, the engine's rounds, the
  crash and resume paths).
- ``summary``: a finished run's summary (headline metrics, ACC(T), the round picked on
  validation data, the time to a target).
- ``sweep``: a file's variants and seeds, one after another, side by side, or on Ray Tune.
- ``preflight``: the checks that run before Ray starts, without torch or MLflow.

May import every wing below it: ``raysim.scenario``, ``raysim.engine``, ``raysim.results`` and
what they stand on. Only ``raysim.api`` and ``raysim.cli`` import it.
"""
