"""Score a run's last checkpoint again, as the run scored it and with other options.

    python bench/rescore.py CHECKPOINT_DIR/RUN_ID --set algorithm.eval_stats=refit

Reads the run's resolved scenario from its last complete checkpoint, applies the ``--set``
overrides, builds the serial engine's driver for it (every host in this process), restores the
checkpoint into it (``RoundDriver.restore``: server state and every client's state, each file
verified) and runs the driver's own evaluation of that round, once with the run's options and
once with the overrides. Prints both summaries (the test-size-weighted mean over clients and
the bottom decile, as the run logs them) side by side. The first equals the run's final
metrics. Training is not redone: the overrides should be options of the evaluation (FedBN's
``algorithm.eval_stats``, ``eval.finetune``); one that changes training makes no sense here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from raysim.engine import checkpoint  # noqa: E402
from raysim.engine.serial import serial_driver  # noqa: E402
from raysim.scenario import config  # noqa: E402


def scores(folder: str, overrides: list[str]) -> tuple[dict[str, float], int]:
    """(the evaluation's summary of the checkpoint's round with ``overrides``, that round)."""
    raw = checkpoint.server_part(folder)["scenario"]
    for item in overrides:
        config.apply_override(raw, item, folder)
    driver = serial_driver(config.validate(raw, folder))
    round_ = driver.restore(folder)
    return driver.evaluate(), round_


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
