"""Results: where a run's numbers go and how they come back.

- ``tracking``: the MLflow run of a scenario (parameters, metrics, tags, artifacts).
- ``store``: the MLflow tracking store (its URI, a new SQLite store seeded, the experiment).
- ``tracker_process``: MLflow in a helper process, so that its import does not delay a run.
- ``compare``: the table of several runs (``raysim compare``).
- ``tables``: that table written out, as Markdown and CSV.
- ``report``: ``raysim report``: runs read back from MLflow, their figures written and logged.
- ``figures``: one run's figures, drawn with matplotlib.
- ``curves``: several runs' curves compared (mean ± std over seeds, on rounds or virtual hours).
- ``result``: the Python API's ``Result`` and ``SweepResult`` (``raysim.run``, ``raysim.load``).

May import ``raysim.scenario`` and the wings below it; never the engine (the engine hands its
records to a tracker it is given) nor ``raysim.experiment``.
"""
