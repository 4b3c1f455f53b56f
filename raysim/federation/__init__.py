"""The simulated federation: everything about the clients that is not their model.

- ``fleet``: devices, availability and the virtual clock (systems heterogeneity).
- ``traces``: readers and converters of device and availability traces (FedScale's included);
  ``plain_pickle``: the plain data of a pickle file, read without unpickling (FedScale's traces).
- ``privacy``: clipping, noise and the accountant (client- and sample-level DP).
- ``compression``: what an upload costs and how it is compressed (QSGD, top-k, ...).
- ``topology``: the graphs of decentralized training.
- ``robust`` (its math in ``robust_rules``): Byzantine-robust aggregation rules (Krum, median,
  trimmed mean, geometric median, Bulyan, centered clipping, DnC, SignGuard, FLTrust, FLAME...),
  the pre-aggregators (bucketing, NNM) and robust gossip mixing (ClippedGossip, BRIDGE).
- ``attacks``: Byzantine clients' model poisoning (ALIE, IPM, Min-Max/Min-Sum, Fang, Mimic...);
  ``poisoning``: data poisoning (label flipping, BadNets triggers, DBA) and the backdoor metrics.
- ``robust`` (arithmetic in ``robust_rules``): Byzantine-robust aggregation rules, pre-aggregators and
  robust gossip mixing (Krum, Bulyan, RFA, centered clipping, DnC, SignGuard, FLTrust, FLAME, ...).

May import ``raysim.core`` and the foundation modules only.
"""
