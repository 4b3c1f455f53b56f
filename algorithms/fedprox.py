"""FedProx — Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020.

FedAvg whose local objective adds the proximal term (μ/2)·‖w − w_global‖², which keeps local
models close to the broadcast global model under heterogeneous data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .fedavg import FedAvg, FedAvgHyper


@dataclass(frozen=True)
class FedProxHyper(FedAvgHyper):
    mu: float = field(default=0.01, metadata={"min": 0.0, "help": "proximal coefficient μ"})


class FedProx(FedAvg):
    name = "fedprox"
    summary = "FedProx (Li et al. 2020): FedAvg plus (mu/2)||w - w_global||^2 in the local loss"
    paper = "Li et al., MLSys 2020"
    family = "global model"
    personal = "nothing"
    sends = "its model, weighted by n_k"
    Hyper = FedProxHyper

    def consts(self, received) -> dict:
        return {"anchor": received.shared, "mu": self.hp.mu}
