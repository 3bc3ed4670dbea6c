"""Timing helpers: the seed's method (warm-up, then the median of N runs with min–max), with
every implementation of a case timed inside the SAME loop, one call each per round, so that a
noisy shared machine disturbs all of them alike."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


@dataclass
class Stats:
    """Wall-clock times of one implementation, in seconds."""
    times: list = field(default_factory=list)
    first: float = float("nan")          # the warm-up call (for lazycandle: includes compiling)

    @property
    def n(self) -> int:
        return len(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def min(self) -> float:
        return min(self.times) if self.times else float("nan")

    @property
    def max(self) -> float:
        return max(self.times) if self.times else float("nan")

    def as_dict(self) -> dict:
        """Milliseconds, for JSON output."""
        ms = 1e3
        return {"median_ms": self.median * ms, "min_ms": self.min * ms, "max_ms": self.max * ms,
                "n": self.n, "first_ms": self.first * ms}


def time_call(fn) -> float:
    """Seconds taken by one call of `fn()`."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def round_orders(names: list) -> list:
    """Orders of `names` for successive rounds, in which every implementation directly follows
    every other one equally often (a Williams design: rows of 0, 1, n-1, 2, n-2, ... shifted
    by the row number, and their reverses when n is odd).  A plain rotation keeps one cyclic
    order, so one implementation would always run right after the same peer -- after XLA's
    pool, whose idle threads keep spinning on the cores, or after a single-threaded NumPy
    call, which leaves the other CPU idle long enough for its wake-up to cost tens of us."""
    n = len(names)
    base, lo, hi = [0], 1, n - 1
    while len(base) < n:
        base.append(lo)
        lo += 1
        if len(base) < n:
            base.append(hi)
            hi -= 1
    rows = [[(x + r) % n for x in base] for r in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return [[names[x] for x in row] for row in rows]


def time_alternating(fns: dict, repeats: int = 9, warmup: int = 1, slow_s: float = 3.0,
                     slow_repeats: int = 3, setup: dict | None = None) -> dict:
    """Time each `fns[name]()` `repeats` times, interleaved: round r calls every implementation
    once, in the order `round_orders` gives round r.  `warmup` untimed rounds come first; the first warm-up
    call of each implementation is kept as `Stats.first`.  An implementation whose warm-up took
    longer than `slow_s` seconds is timed only `slow_repeats` times (its `Stats.n` says so), which
    keeps a very slow peer from blowing the suite's time budget.  `setup[name]()`, when given,
    runs untimed right before each call of `fns[name]` (e.g. selecting an execution mode)."""
    names = list(fns)
    stats = {k: Stats() for k in names}
    setup = setup or {}
    for w in range(warmup):
        for k in names:
            if k in setup:
                setup[k]()
            t = time_call(fns[k])
            if w == 0:
                stats[k].first = t
    budget = {k: (slow_repeats if stats[k].first > slow_s else repeats) for k in names}
    orders = round_orders(names)
    for r in range(repeats):
        for k in orders[r % len(orders)] if orders else ():
            if len(stats[k].times) < budget[k]:
                if k in setup:
                    setup[k]()
                stats[k].times.append(time_call(fns[k]))
    return stats
