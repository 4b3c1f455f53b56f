"""Ditto on the solution simplex, shared by SosicFL+ and Floco+ (``sosicfl.py``, ``floco.py``):
the ``Personal`` mixin, which gives a simplex method a personal copy per client, its client
state (``PersonalState``) and the two options both methods have (``lam_field``,
``personal_field``). The simplex model itself (``compose``, the α draws, the reply) is the
method's, which the mixin is put in front of."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .simplex import SimplexObjective


def lam_field():
    return field(default=1.0, metadata={"min": 0.0, "help": "λ, pull of the personal copy to the global one"})


def personal_field(default: str):
    return field(
        default=default,
        metadata={
            "choices": ("all", "endpoints"),
            "help": "what the personal copy holds: every parameter (the authors' Floco+ code) or only the "
            "simplex endpoints, the feature extractor being the received global one (the paper's "
            "objective read literally: argmin over the θ_m, regularizer over the endpoints)",
        },
    )


@dataclass
class PersonalState:
    params: list[torch.Tensor]  # SosicFL+'s personal copy: the server's layout (personal: all), or its endpoints


class Personal:
    """Ditto on the simplex (SosicFL+, Floco+): every client keeps a personal copy, trained each
    round it is selected, interleaved with the global update on the same batches, on the task
    loss at α from its subregion + (λ/2)‖θ − θ̂‖² (θ̂ the received global parameters); its
    personalized model is that copy at its subregion's point. ``personal: all`` (default): the
    copy holds every parameter, as the authors' code; ``endpoints``: only the simplex endpoints,
    trained on the received global feature extractor (frozen), the paper's objective read
    literally."""

    ClientState = PersonalState

    def personal_objective(self) -> SimplexObjective:
        if getattr(self, "_personal_obj", None) is None:
            n = len(self.plain) + len(self.simplex) * self.ends
            mask = None if self.hp.personal == "all" else tuple(i >= len(self.plain) for i in range(n))
            self._personal_obj = SimplexObjective(self.task, self.compose, mask, self.compose_grad)
        return self._personal_obj

    def personal_params(self, state, glob) -> list[torch.Tensor]:
        """The personal copy in the server's layout."""
        if state is None:
            return glob
        return state.params if self.hp.personal == "all" else list(glob[: len(self.plain)]) + list(state.params)

    def kept(self, params) -> PersonalState:
        return PersonalState(params if self.hp.personal == "all" else params[len(self.plain) :])

    def _personal_job(self, mine, received, data, ctx, orders=None):
        return self.job(
            mine,
            data,
            ctx,
            orders=orders,
            objective=self.personal_objective(),
            draws=self._draws(received.part, self.hp.personal_pool),
            consts={"anchor": received.shared, "mu": self.hp.lam},
        )

    def train(self, state, received, data, ctx):
        glob = received.shared
        g = self.job(glob, data, ctx, draws=self._draws(received.part, self.hp.alpha_pool))
        p = self._personal_job(self.personal_params(state, glob), received, data, ctx, orders=g.orders)
        fit, pers = yield [g, p]
        return self.kept(pers.params), self.reply(fit.params, glob, data.num_train), fit.loss

    def evaluate(self, state, received, data, ctx):
        return super().evaluate(
            None if state is None else PersonalState(self.personal_params(state, received.shared)), received, data, ctx
        )

    def personalize(self, received, data, ctx):
        (pers,) = yield [self._personal_job(received.shared, received, data, ctx)]
        return self.kept(pers.params)
