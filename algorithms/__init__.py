"""Algorithms: pure tensor math behind one contract (see base.py). Never imports Ray.

REGISTRY holds the built-in methods by name. The engine finds a scenario's method through
``resolve``, which reads REGISTRY first and otherwise resolves a plugin (an entry point of the
group ``raysim.algorithms``, or ``module:Name``) through ``raysim.plugins``. This package
imports nothing of raysim's but ``raysim.core`` and ``raysim.plugins``.
"""

from raysim import plugins

from .afl import AFL
from .apfl import APFL
from .base import Algorithm
from .cfl import CFL
from .ditto import Ditto
from .fedavg import FedAvg
from .fedavg_plus import FedAvgPlus
from .fedbabu import FedBABU
from .fedbn import FedBN
from .feddyn import FedDyn
from .fedem import FedEM
from .fedlc import FedLC
from .fednova import FedNova
from .fedntd import FedNTD
from .fedper import FedPer
from .fedproto import FedProto
from .fedprox import FedProx
from .fedrep import FedRep
from .fedrod import FedRoD
from .fedsoft import FedSoft
from .floco import Floco, FlocoPlus
from .ifca import IFCA
from .lg_fedavg import LGFedAvg
from .local import Local
from .mocha import Mocha
from .moon import MOON
from .perfedavg import PerFedAvg
from .pfedhn import PFedHN
from .pfedme import PFedMe
from .qffl import QFFL
from .scaffold import Scaffold
from .sosicfl import SosicFL, SosicFLPlus
from .superfed import SuPerFedLM, SuPerFedMM
from .term import TERM

REGISTRY: dict[str, type[Algorithm]] = {
    a.name: a
    for a in (
        FedAvg,
        FedProx,
        Local,
        FedAvgPlus,
        FedEM,
        IFCA,
        Ditto,
        FedSoft,
        CFL,
        SuPerFedMM,
        SuPerFedLM,
        APFL,
        PFedMe,
        SosicFL,
        SosicFLPlus,
        Floco,
        FlocoPlus,
        Scaffold,
        FedPer,
        FedRep,
        LGFedAvg,
        Mocha,
        FedDyn,
        MOON,
        PFedHN,
        FedBN,
        FedBABU,
    )
}
REGISTRY.update({a.name: a for a in (PerFedAvg, FedRoD, FedNova, FedLC, FedNTD, QFFL, TERM, AFL, FedProto)})


def get(name: str) -> type[Algorithm]:
    """A built-in method by name (a plugin's too: ``resolve``)."""
    return REGISTRY[name]


PLUGINS = plugins.Kind(
    "raysim.algorithms", "algorithm", REGISTRY, Algorithm, "raysim.algorithms.REGISTRY", subclass=True
)


def resolve(name: str) -> type[Algorithm]:
    """The algorithm class ``name``: built-in, ``module:Name`` or an entry point."""
    return plugins.resolve(PLUGINS, name)
