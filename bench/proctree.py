"""Measure a command as the user waits for it: wall seconds from exec to exit, CPU seconds of
every process it starts (Ray's GCS, raylet, agents and workers included), and the peak of the
summed memory of those processes (USS and PSS).

    python bench/proctree.py -- CMD ARGS...        # one run: time, then memory in a second run
    python bench/proctree.py --same-run -- CMD ...   # both from one run (the sampling weighs on it)

CPU seconds come from the machine's own counters (/proc/stat: busy time of every CPU, from
start to exit), so processes that end between two samples are still counted; run it on an
otherwise idle machine. The measuring process's own CPU time (its sampling) is taken off.

Memory comes in two sums over the tree (psutil's memory_full_info, from smaps_rollup). USS, the
measure the issues use, counts the pages only that process maps: the pages several of the
run's processes share (the libraries each PyTorch process maps, and a forked worker's pages it
shares with the process it was forked from, raysim's zygote) are counted in none of them, where
a single-process peer has the same kind of pages counted as its own. PSS splits each page
between the processes that map it, so the tree's sum counts a page shared within it once: the
memory the run holds, like for like with a single process. Linux only.

Sampling memory is not free: reading a process's USS and PSS walks its page tables, about
9 ms for a PyTorch process on a 2-core machine, so one sample of a Ray run's nine processes
took 0.07 to 0.09 CPU-s, about 30 % of a core at one sample every 0.2 s. On 2 cores that slows
a run that keeps both busy (raysim's two hosts) more than one that uses one (a single-process
peer). Measured on the MLPs 784-100-10 of bench/pfl_workload.py, Ray's engine, median rounds:
Ditto 0.88 to 1.08 s a round without sampling against 1.18 to 1.64 s with it, FedAvg 0.42 to
0.48 s against 0.49 to 0.62 s. So the figures of time come from a run without sampling
(``memory=False``) and the memory from a second run (``measure_both``), for every side alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import psutil

TICK = os.sysconf("SC_CLK_TCK")


def _busy_seconds() -> float:
    """Busy CPU seconds of the machine since boot (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def measure(
    cmd: list[str], *, cwd: str | None = None, env: dict | None = None, interval: float = 0.2, memory: bool = True
) -> dict:
    """Run ``cmd``; return wall, cpu (the machine's busy seconds less this process's own),
    cpu_tree (the tree's own times, sampled: a check; with ``memory`` only), uss_peak_mb and
    pss_peak_mb (with ``memory``: the peaks of the tree's summed USS and PSS, sampled every
    ``interval`` s; else None), rc, stdout, stderr."""
    busy0, own0 = _busy_seconds(), time.process_time()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    state = {"peak": 0, "pss": 0, "cpu": {}}
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.Error:
                procs = []
            uss = pss = 0
            for p in procs:
                try:
                    with p.oneshot():
                        t = p.cpu_times()
                        state["cpu"][p.pid] = t.user + t.system
                        m = p.memory_full_info()
                        uss, pss = uss + m.uss, pss + m.pss
                except psutil.Error:
                    pass
            state["peak"] = max(state["peak"], uss)
            state["pss"] = max(state["pss"], pss)
            done.wait(interval)

    watcher = threading.Thread(target=watch, daemon=True)
    if memory:
        watcher.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    if memory:
        watcher.join()
    own = time.process_time() - own0
    return {
        "wall": wall,
        "cpu": _busy_seconds() - busy0 - own,
        "measurer_cpu": own,
        "cpu_tree": sum(state["cpu"].values()) if memory else None,
        "uss_peak_mb": state["peak"] / 2**20 if memory else None,
        "pss_peak_mb": state["pss"] / 2**20 if memory else None,
        "rc": proc.returncode,
        "stdout": out,
        "stderr": err,
    }


def measure_both(cmd: list[str], before=None, **kw) -> dict:
    """Time from a run without sampling, memory from a second run that samples: ``measure``'s
    figures, with uss_peak_mb, pss_peak_mb and cpu_tree from the second run (and its wall,
    sampled_wall); the first failing run's result where one fails. ``before(memory)``: called
    before each run, False for the first (to put files as the run needs them, or to keep what
    the timed run wrote)."""
    runs = []
    for memory in (False, True):
        if before is not None:
            before(memory)
        runs.append(measure(cmd, memory=memory, **kw))
        if runs[-1]["rc"]:
            return runs[-1]
    timed, sampled = runs
    return {
        **timed,
        "uss_peak_mb": sampled["uss_peak_mb"],
        "pss_peak_mb": sampled["pss_peak_mb"],
        "cpu_tree": sampled["cpu_tree"],
        "sampled_wall": sampled["wall"],
    }


def main(argv: list[str]) -> int:
    if "--" not in argv or argv[-1] == "--":
        print("usage: python bench/proctree.py [--same-run] -- CMD ARGS...", file=sys.stderr)
        return 2
    split = argv.index("--")
    same, cmd = "--same-run" in argv[:split], argv[split + 1 :]
    r = measure(cmd) if same else measure_both(cmd)
    sys.stdout.write(r["stdout"])
    sys.stderr.write(r["stderr"])
    print(
        f"wall {r['wall']:.1f} s, CPU {r['cpu']:.1f} s (machine busy, less the measuring's "
        f"{r['measurer_cpu']:.1f} s), peak USS {r['uss_peak_mb']:.0f} MB, PSS {r['pss_peak_mb']:.0f} MB"
        + ("" if same else f" (from a second run, sampled every 0.2 s: {r['sampled_wall']:.1f} s wall)")
        + f", exit {r['rc']}",
        file=sys.stderr,
    )
    return r["rc"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
