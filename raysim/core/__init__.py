"""The pure tensor layer under both the algorithms and the engine.

Nothing here imports Ray, MLflow, the engine or ``algorithms``: algorithms build on it, the
engine runs it inside host actors.

- ``data``: a client's shard (``ClientData``) and what a client step knows (``Context``);
- ``tasks``: classification and regression (per-sample loss, per-client scores);
- ``forward``: a model run for K parameter sets at once (stacked), and when that is possible;
- ``optim``: SGD and Adam on stacked parameters;
- ``loop``: the one local-training loop (``Job`` in, ``Fitted`` out) and ``drive``, every name
  of it importable from there; it lives in ``jobs`` (what the loop trains), ``batches`` (the
  batch schedule), ``trainer`` (``Trainer``: which jobs train together, a run prepared),
  ``passes`` (a run's passes and steps), ``steps`` and ``dpsgd`` (one step's gradients), with
  ``chain`` (gradients by hand), ``objectives`` and ``widths`` (how wide a pass);
- ``replies``: summable reply types and their grouping-independent reduction;
- ``mixing``: gossip mixing θ_i ← Σ_j W_ij θ_j and the consensus distance.
"""

# the local optimizers (optim.py), named here where the scenario's sections read them without
# importing torch (``raysim run`` checks the scenario file before Ray starts, torch-free)
OPTIMIZERS = ("sgd", "adam")
