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


def time_alternating(fns: dict, repeats: int = 9, warmup: int = 1, slow_s: float = 3.0,
                     slow_repeats: int = 3, setup: dict | None = None) -> dict:
    """Time each `fns[name]()` `repeats` times, interleaved: round r calls every implementation
    once (the order rotates each round).  `warmup` untimed rounds come first; the first warm-up
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
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        for k in order:
            if len(stats[k].times) < budget[k]:
                if k in setup:
                    setup[k]()
                stats[k].times.append(time_call(fns[k]))
    return stats
