"""A sweep's runs side by side on Ray Tune (the transport for sweeps; every Ray call stays in
``raysim/engine/ray_*.py``).

One Tune trial per run (a variant at a seed). A trial reserves, as one placement group, a
small bundle on the driver's node for the run's server (which writes its checkpoints and its
local tracking store where the user typed ``raysim``, as a run one after another would) and
one bundle per host actor; its hosts take those bundles (``ray_engine.adopt_trial_placement``),
so a trial holds exactly what its run uses. Tune starts a trial when the cluster has room for
all of it, queues the rest, and on an autoscaling cluster asks for the nodes the queued ones
need. Tune itself only schedules: its loggers, checkpoints and console tables are off; each run
records itself in MLflow as any run does, and the results come back to the caller.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import ray

from raysim.engine import ray_engine, ray_start
from raysim.scenario.config import Scenario

SERVER_SHARE = 0.001  # the server bundle's claim on the driver's node: a pin, not a CPU


def runs_at_once(scenarios: list[Scenario]) -> int | None:
    """How many of these runs the Ray this process joined holds at once, judged by the largest
    run's CPU and GPU; None on a cluster raysim did not start (an autoscaler may grow it)."""
    if not ray_start.embedded():
        return None
    total = ray.cluster_resources()
    fits = []
    for key, per in (("CPU", "cpus_per_host"), ("GPU", "gpus_per_host")):
        need = max(getattr(sc.resources, per) * sc.resources.hosts for sc in scenarios)
        if need > 0:
            fits.append(int(total.get(key, 0.0) / need + 1e-9))
    return max(1, min(fits))


def _trial(config: dict, jobs: list, run_one: Callable[[Any], dict], cwd: str) -> None:
    """One run in a Tune trial's process: its hosts in the trial's bundles (after the
    server's), in the driver's working directory (Tune starts trials in a folder of its own)."""
    from ray import tune

    ray_engine.adopt_trial_placement(first=1)
    if os.path.isdir(cwd):
        os.chdir(cwd)
    tune.report({"result": run_one(jobs[config["index"]])})


def run_trials(
    jobs: list,
    scenarios: list[Scenario],
    run_one: Callable[[Any], dict],
    at_once: int | None,
    done: Callable[[int, dict | str | None], None],
) -> list[dict | str | None]:
    """Run ``run_one(jobs[i])`` (which returns a dict, errors included) for every job in Tune
    trials, at most ``at_once`` together (None: as many as the cluster holds), ``scenarios[i]``
    giving job i's resources. Job i's outcome is what ``run_one`` returned, or a line saying
    why its trial's process was lost, or None when the sweep stopped before it (Ctrl-C);
    ``done(i, outcome)`` is called in this process as each one ends. Returns the outcomes in
    job order."""
    from ray import tune

    # Tune's own output: no result loggers, no console tables (the runs report themselves)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    pin = {f"node:{ray.util.get_node_ip_address()}": SERVER_SHARE}

    def resources(config: dict):
        sc = scenarios[config["index"]]
        return tune.PlacementGroupFactory([pin, *ray_engine.host_bundles(sc)], strategy="SPREAD")

    outcomes: dict[int, dict | str] = {}

    class Report(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            i = trial.config["index"]
            outcomes[i] = (trial.last_result or {}).get("result")
            done(i, outcomes[i])

        def on_trial_error(self, iteration, trials, trial, **info):
            i = trial.config["index"]
            outcomes[i] = "its trial's process was lost (killed, out of memory, or its node left)"
            done(i, outcomes[i])

    storage = tempfile.mkdtemp(prefix="raysim-sweep-")
    try:
        trainable = tune.with_resources(
            tune.with_parameters(_trial, jobs=jobs, run_one=run_one, cwd=os.getcwd()), resources
        )
        tuner = tune.Tuner(
            trainable,
            param_space={"index": tune.grid_search(list(range(len(jobs))))},
            tune_config=tune.TuneConfig(max_concurrent_trials=at_once, reuse_actors=False),
            run_config=tune.RunConfig(
                storage_path=storage,
                name="sweep",
                verbose=0,
                callbacks=[Report()],
                failure_config=tune.FailureConfig(max_failures=0),
            ),
        )
        tuner.fit()
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    return [outcomes.get(i) for i in range(len(jobs))]
