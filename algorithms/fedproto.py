"""FedProto — Tan, Long, Liu, Zhou, Lu, Jiang & Zhang, "FedProto: Federated Prototype Learning
across Heterogeneous Clients", AAAI 2022.

Clients exchange class prototypes, never parameters. Client k's model (all of it personal) is
trained on

    ℓ(x, y) = CE(f_k(x), y) + λ·‖z(x) − C̄_y‖² / d,

z(x) its features (the input of its classifier head, d of them) and C̄_y the global prototype of
class y (the term is 0 for a class with no global prototype yet, and in the first round). After
training it sends its prototypes C_k^c, the mean of z over its train samples of class c; the
server's global prototype of class c is the mean of them over the clients that hold c. A
client predicts the class of the nearest global prototype (``predict: prototypes``) or with its
own classifier (``classifier``).

Choices (official code yuetan031/FedProto read at 97e42e2; PFLlib's ``clientproto.py`` /
``serverproto.py`` at d832e76; FL-bench's ``fedproto.py`` at 06e658b):

- the distance is the mean squared error over the d features (all three codes' ``MSELoss``),
  averaged over the batch; a sample whose class has no prototype adds 0 and still counts;
- λ = 1 (all three);
- a client's prototypes are taken after its training, from the trained model in evaluation
  mode, over its whole train split. The codes average the features of the training batches
  themselves, in training mode, as the model moves (the official code over the last local
  epoch, the ports over all of them); PFLlib has the after-training pass too, switched off.
  raysim's prototypes are those of the model the client keeps, which the loop's fused batches
  do not expose mid-training;
- the server averages each class over the clients holding it, each counted once
  (``weighting: clients``, all three codes); ``weighting: samples`` weighs client k's prototype
  by its count of the class (Σ_k n_kc·C_k^c / Σ_k n_kc). A class no client of the round holds
  keeps its previous global prototype;
- prediction: the nearest global prototype by squared distance (PFLlib; the official code's
  "with protos"), its scores those of the logits −‖z − C̄_c‖² (a class with no prototype set far
  below), so ``accuracy`` is the nearest-prototype accuracy and ``test_loss`` and ``ece`` those
  of a softmax over negative squared distances; the other predictor's scores come prefixed
  (``classifier_*`` or ``prototype_*``). FL-bench scores the classifier only; the official code
  reports both;
- every client starts from the run's one initial model (PFLlib; the official code initializes
  each client apart). Classification only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from raysim.core.features import Features, class_sums, prototype_reply, prototypes_of, squared_distances
from raysim.core.objectives import Objective

from .base import Algorithm, LocalTraining, Message, params_of

FAR = 1e4  # how far below the lowest logit a class with no prototype is put


@dataclass(frozen=True)
class FedProtoHyper(LocalTraining):
    lam: float = field(default=1.0, metadata={"min": 0.0, "help": "λ, the prototype regularizer's weight"})
    weighting: str = field(
        default="clients",
        metadata={
            "choices": ("clients", "samples"),
            "help": "a global prototype: the mean over the clients holding the class, or weighted by their counts",
        },
    )
    predict: str = field(
        default="prototypes",
        metadata={
            "choices": ("prototypes", "classifier"),
            "help": "what accuracy scores: the nearest global prototype or the client's own classifier",
        },
    )


@dataclass
class FedProtoState:
    model: list[torch.Tensor]  # the client's whole model (never averaged)


@dataclass
class Prototypes:
    table: torch.Tensor  # (C, d) the global prototypes (zero where none)
    held: torch.Tensor  # (C,) bool: the classes with a global prototype


class PrototypeRegularized(Objective):
    """CE + λ·Σ_b w_b·has[y_b]·‖z_b − P_{y_b}‖²/d per job; constants ``protos`` (K, C, d) and
    ``held`` (K, C) as floats."""

    def __init__(self, task, features: Features, lam: float):
        self.task, self.features, self.lam = task, features, lam

    def loss(self, forward, params, batch, consts, draws):
        z, out = self.features(params, batch.x)
        per = self.task.per_sample(out, batch.y)
        loss = (per * batch.weight).sum(1)
        z = z.flatten(2)
        y = batch.y.long()
        target = torch.gather(consts["protos"], 1, y.unsqueeze(-1).expand(*y.shape, z.shape[-1]))
        held = torch.gather(consts["held"], 1, y)
        mse = ((z - target) ** 2).mean(-1) * held
        return loss + self.lam * (mse * batch.weight).sum(1), (per.detach() * batch.valid).sum(1)


class FedProto(Algorithm):
    name = "fedproto"
    summary = "FedProto (Tan et al. 2022): clients share class prototypes, pulled towards the global ones"
    paper = "Tan et al., AAAI 2022"
    family = "personalized"
    personal = "its whole model"
    sends = "its class prototypes (the mean features of each class it holds)"
    Hyper = FedProtoHyper
    ClientState = FedProtoState
    no_gossip = "the global prototypes are a server's average"
    split = True

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        init = model_fn()
        g = self.groups
        self.classes = int(params_of(init)[g.head[-1]].shape[0])
        self.live = Features(init, g.body, g.head)
        self.frozen = Features(init, g.body, g.head, frozen=True)
        self.regularized = PrototypeRegularized(task, self.live, hyper.lam)

    def init_server(self, rng):
        return Prototypes(torch.zeros(self.classes, 0), torch.zeros(self.classes, dtype=torch.bool))

    def init_client(self, cid, rng):
        return FedProtoState(params_of(self.model_fn()))

    def message(self, server, round_):
        return Message(server)

    def features_of(self, params: list[torch.Tensor], x: torch.Tensor, device: torch.device) -> torch.Tensor:
        """z (n, d) of one parameter set on inputs x, in evaluation mode, in blocks."""
        carried = [p.to(device).unsqueeze(0) for p in self.frozen.carried(params)]
        out = []
        with torch.no_grad():
            for i in range(0, max(int(x.shape[0]), 1), 4096):
                xb = x[i : i + 4096].to(device)
                xb = self.decode(xb) if self.decode is not None else xb
                out.append(self.frozen.z(carried, xb.unsqueeze(0))[0].flatten(1))
        return torch.cat(out)

    def train(self, state, received, data, ctx):
        state = state or self.init_client(ctx.cid, None)
        protos = received.shared
        model = [p.to(ctx.device) for p in state.model]
        if bool(protos.held.any()) and self.hp.lam:
            consts = {"protos": protos.table.to(ctx.device), "held": protos.held.to(ctx.device, torch.float32)}
            (fit,) = yield [self.job(model, data, ctx, objective=self.regularized, consts=consts)]
        else:
            (fit,) = yield [self.job(model, data, ctx)]
        z = self.features_of(fit.params, data.train_x, ctx.device)
        sums, counts = class_sums(z, data.train_y, self.classes)
        return FedProtoState(fit.params), prototype_reply(sums.cpu(), counts.cpu(), self.hp.weighting), fit.loss

    def aggregate(self, server, reduced, round_):
        if not reduced:
            return server
        dim = next(iter(reduced.values())).values[0].shape[-1]
        table, held = prototypes_of(reduced, self.classes, dim)
        if server.table.shape[-1] == dim:  # keep the classes nobody of this round held
            table = torch.where(held.unsqueeze(1), table, server.table)
            held = held | server.held
        return Prototypes(table, held)

    def prototype_logits(self, z: torch.Tensor, protos: Prototypes) -> torch.Tensor:
        """−‖z − C̄_c‖² (n, C), a class with no prototype FAR below the lowest held one."""
        if protos.table.shape[-1] != z.shape[-1] or not bool(protos.held.any()):
            return torch.zeros(z.shape[0], self.classes, device=z.device)
        d = -squared_distances(z.unsqueeze(0), protos.table.to(z.device).unsqueeze(0))[0]
        held = protos.held.to(z.device)
        low = d[:, held].min(dim=1, keepdim=True).values - FAR
        return torch.where(held.unsqueeze(0), d, low)

    def evaluate(self, state, received, data, ctx):
        state = state or self.init_client(ctx.cid, None)
        model = [p.to(ctx.device) for p in state.model]
        out = self.outputs([model], data.test_x, ctx.device)[0]
        protos = self.prototype_logits(self.features_of(model, data.test_x, ctx.device), received.shared)
        by_classifier = self.hp.predict == "classifier"
        first, second = (out, protos) if by_classifier else (protos, out)
        other = "prototype_" if by_classifier else "classifier_"
        return {**self.task.scores(first, data.test_y), **self.task.scores(second, data.test_y, other)}

    personalize = Algorithm.personalize_by_training
