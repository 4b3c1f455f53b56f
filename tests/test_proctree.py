"""The benchmarks' measure of a command (bench/proctree.py): the peaks of its tree's USS and PSS,
a page two processes share counted in neither's USS and once in their PSS, and the time taken
from a run that does not sample."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import proctree  # noqa: E402

MB = 2**20
# a parent writes 48 MB, forks a child that holds them (shared, copy-on-write) and each writes
# 64 MB of its own; both wait, so the sampler sees them together. The shared block is the smaller
# so that no moment before the fork (the parent alone, its 48 MB its own, with or without its
# 64) reaches the peak of the two together: the peak is the moment the test is about.
FORKED = r"""
import os, time
shared = bytearray(os.urandom(1)) * (48 << 20)
pid = os.fork()
own = bytearray(b"x") * (64 << 20)
own[::4096] = b"y" * len(own[::4096])
time.sleep(1.5)
if pid:
    os.waitpid(pid, 0)
"""


def test_shared_pages_count_in_no_uss_and_once_in_the_pss():
    r = proctree.measure([sys.executable, "-c", FORKED], interval=0.1)
    assert r["rc"] == 0
    # USS: the two 64-MB blocks and the interpreters' own, not the shared 48 MB (once would be 176)
    assert 128 <= r["uss_peak_mb"] < 128 + 40
    # PSS: the 48 MB once (half to each), plus what USS counts, plus shares of libraries
    assert r["uss_peak_mb"] + 45 <= r["pss_peak_mb"] < r["uss_peak_mb"] + 48 + 30


def test_time_comes_from_an_unsampled_run_and_memory_from_a_second():
    cmd = [sys.executable, "-c", "import time; b = bytearray(b'x') * (40 << 20); time.sleep(0.6)"]
    timed = proctree.measure(cmd, memory=False)
    assert timed["uss_peak_mb"] is None and timed["cpu_tree"] is None  # nothing sampled
    both = proctree.measure_both(cmd)
    assert both["rc"] == 0 and both["wall"] >= 0.6 and both["sampled_wall"] >= 0.6
    assert 40 <= both["uss_peak_mb"] < 80
