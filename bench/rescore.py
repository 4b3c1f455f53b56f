"""Score a run's last checkpoint again, as the run scored it and with other options.

    python bench/rescore.py CHECKPOINT_DIR/RUN_ID --set algorithm.eval_stats=refit

Reads the run's last complete checkpoint (``raysim.engine.checkpoint``: the manifest, the server
state and every host's client states, each verified) and its resolved scenario, rebuilds the data
source and the method, and has the method's own ``evaluate`` score every training client twice:
with the run's options, then with the ``--set`` overrides (options of the evaluation only, such
as FedBN's ``algorithm.eval_stats``: training is not redone, so an option that changes training
makes no sense here). Prints both summaries (the test-size-weighted mean over clients and the
bottom decile, as the run logs them) side by side. The first must equal the run's final metrics.

For methods whose evaluation is a plain function of the client's state and the server's message
(FedBN, FedPer, FedRep, LG-FedAvg and the other split methods, FedAvg's family without
``eval.finetune``); one that trains to evaluate (a local update) is refused.
"""
from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from raysim import config, setup  # noqa: E402
from raysim.algorithms.base import Received  # noqa: E402
from raysim.engine import checkpoint  # noqa: E402
from raysim.engine.driver import split_unseen, summarize  # noqa: E402
from raysim.engine.trees import tree_to_state  # noqa: E402


def scores(folder: str, overrides: list[str]) -> tuple[dict[str, float], int]:
    """(the summary of every training client's scores, the checkpoint's round) with ``overrides``."""
    doc, server = checkpoint.read(folder)
    raw = server["scenario"]
    for item in overrides:
        config.apply_override(raw, item, folder)
    sc = config.validate(raw, folder)
    source = config.make_source(sc)
    algo = setup.make_algorithm(sc, source)
    train, _ = split_unseen(sc)
    states = checkpoint.read_clients(folder, doc, train)
    message = algo.message(server["server"], server["round"])
    ctx = SimpleNamespace(device=torch.device("cpu"), round=server["round"], rounds=sc.rounds)
    results = {}
    for cid in (int(c) for c in train):
        data = source.client(cid)
        tree = states.get(cid, {}).get("state")
        state = None if tree is None else tree_to_state(algo.ClientState, tree)
        got = algo.evaluate(state, Received(message.shared), data, ctx)
        if inspect.isgenerator(got):
            raise SystemExit(f"rescore: {sc.algorithm.name} trains to evaluate (a local update); "
                             f"rescoring it would redo training")
        results[cid] = (got, data.num_test)
    return summarize(results), server["round"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="a run's checkpoint folder (checkpoint.dir/RUN_ID)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="KEY=VALUE of the evaluation")
    ap.add_argument("--metric", default="accuracy")
    a = ap.parse_args(argv)
    before, round_ = scores(a.folder, [])
    after, _ = scores(a.folder, a.overrides)
    m = a.metric
    pct = 100.0 if "accuracy" in m else 1.0
    label = " ".join(a.overrides) or "as run"
    width = max(len(label), len("as run")) + 2
    print(f"round {round_}: {m} (mean over clients / bottom decile)")
    for name, got in (("as run", before), (label, after)):
        print(f"  {name + ':':<{width}} {pct * got[m]:.1f} / {pct * got[f'bottom_decile_{m}']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
