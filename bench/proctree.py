"""Measure a command as the user waits for it: wall seconds from exec to exit, CPU seconds of
every process it starts (Ray's GCS, raylet, agents and workers included), and the peak of the
summed non-shared memory (USS) of those processes.

CPU seconds come from the machine's own counters (/proc/stat: busy time of every CPU, from
start to exit), so processes that end between two samples are still counted; run it on an
otherwise idle machine. The tree's own times, sampled every 0.2 s, are printed beside them as
a check. USS (psutil's memory_full_info) counts the pages only that process maps: the shared
libraries every torch process maps are counted once in none of them, as for a peer's single
process. Linux only.
"""
from __future__ import annotations

import os
import subprocess
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


def measure(cmd: list[str], *, cwd: str | None = None, env: dict | None = None, interval: float = 0.2) -> dict:
    """Run ``cmd``; return wall, cpu (machine), cpu_tree (sampled), uss_peak_mb, rc, stdout, stderr."""
    busy0 = _busy_seconds()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    state = {"peak": 0, "cpu": {}}
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.Error:
                procs = []
            uss = 0
            for p in procs:
                try:
                    with p.oneshot():
                        t = p.cpu_times()
                        state["cpu"][p.pid] = t.user + t.system
                        uss += p.memory_full_info().uss
                except psutil.Error:
                    pass
            state["peak"] = max(state["peak"], uss)
            done.wait(interval)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    watcher.join()
    return {"wall": wall, "cpu": _busy_seconds() - busy0, "cpu_tree": sum(state["cpu"].values()),
            "uss_peak_mb": state["peak"] / 2**20, "rc": proc.returncode, "stdout": out, "stderr": err}
