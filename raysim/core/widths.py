"""How many jobs a stacked pass of the training loop holds (``loop.Trainer``), chosen by timing
passes as the loop trains: ``Widths`` and its rule for the choice, ``split_best``. The width
changes the speed only, never the numbers."""

from __future__ import annotations

import math


class Widths:
    """How many jobs a stacked pass trains at once, by measurement: per kind of pass (model
    shapes, batch size, objective), passes of 1, 2, 4, ... jobs are timed until a wider pass
    is slower per job-step than the best so far (or the jobs run out); then the best width
    is kept. Wide passes spread Python's and the step's fixed costs over more jobs; past some
    width the jobs' parameters, gradients and momentum no longer fit in cache. The width
    changes the speed only, never the numbers: a job's products are computed on their own.
    ``always``: every job in one pass (up to the memory budget).

    A width's cost is the fastest of its timings: a pass that another process preempted (a
    host's neighbours on the same cores, the driver, Ray's daemons) took longer than its work,
    never less. Before the choice is made, the best width and the widest one tried (the one that
    lost, or the top of the ladder) are each timed twice: a single preempted pass would
    otherwise settle the run on a narrower width for good. The choice is then the width whose
    passes cost least as ``pick`` will cut the jobs (``split_best``). Both matter on 2 cores:
    25 jobs a host of a 784-100-10 MLP in passes of 7 and 6 (a choice of 8) took 0.93 s a round
    against 0.72 s in passes of 13 and 12 (16), and one timing a width had kept 8 in 3 fresh
    processes of 10."""

    TIMINGS = 2  # timings of each width the choice rests on

    def __init__(self, mode: str):
        self.mode = mode
        self.best: dict = {}  # kind -> the chosen width
        self.seen: dict = {}  # kind -> {width: [seconds per job-step, ...]}
        self.plan: dict = {}  # kind -> the width the next timed pass is to have

    def pick(self, kind, left: int) -> int:
        """The width of the next pass, ``left`` jobs remaining. Once a kind's best width w is
        known, the remaining jobs go in ceil(left / w) passes of (nearly) equal width, at most
        w each: 25 jobs at w = 8 as 7, 6, 6, 6 rather than 8, 8, 8 and a pass of one, whose
        job-step costs three to four times a wide pass's."""
        if self.mode == "always":
            return left
        if kind in self.best:
            passes = -(-left // self.best[kind])
            return -(-left // passes)
        return min(left, self.plan.get(kind, 1))

    def record(self, kind, width: int, seconds: float, job_steps: int, jobs: int) -> None:
        """A pass of ``width`` jobs took ``seconds`` for ``job_steps`` steps in all, in a fit of
        ``jobs`` jobs. Only a pass of the planned width is a timing (not a fit's remainder)."""
        if self.mode == "always" or kind in self.best or job_steps == 0:
            return
        if width != self.plan.get(kind, 1):
            return
        tried = self.seen.setdefault(kind, {})
        tried.setdefault(width, []).append(seconds / job_steps)
        cost = {w: min(ts) for w, ts in tried.items()}
        best = min(cost, key=cost.get)
        last = max(tried)
        # stop where the last width lost, at the ladder's top, or where no fit has more jobs
        if cost[last] > 1.1 * cost[best] or last >= 4096 or 2 * last > jobs:
            again = [w for w in (last, best) if len(tried[w]) < self.TIMINGS]
            if again:
                self.plan[kind] = again[0]
            else:
                self.best[kind] = split_best(cost, jobs)
        else:
            self.plan[kind] = 2 * last


def split_best(cost: dict[int, float], jobs: int) -> int:
    """The measured width w (``cost``: seconds a job-step of a pass of w jobs) whose passes cost
    least once ``Widths.pick`` splits ``jobs`` jobs into ceil(jobs / w) passes of nearly equal
    width: 25 jobs at w = 8 go in passes of 7 and 6, at w = 16 in passes of 13 and 12, so two
    widths that cost the same as measured do not cost the same as used. A pass's cost at a
    width not measured is read off the line between the two measured widths around it, in
    log2 of the width; ties go to the wider."""
    ws = sorted(cost)

    def at(x: int) -> float:
        if x <= ws[0]:
            return cost[ws[0]]
        for lo, hi in zip(ws, ws[1:]):
            if x <= hi:
                f = (math.log2(x) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
                return cost[lo] + f * (cost[hi] - cost[lo])
        return cost[ws[-1]]

    def used(w: int) -> int:  # the widest pass pick makes of the jobs at best width w
        passes = -(-jobs // w)
        return -(-jobs // passes)

    return min(ws, key=lambda w: (at(used(w)), -w))
