"""What binding a new size costs (issue 38): a program of ~30 kernels over a named dim `n`
(a residual MLP stack with layer norms and a softmax head), run once at each new n, against the
same program run again at an n it has seen; the difference is the binding.

    python bench/bind_new_size.py [--blocks 10] [--lo 3] [--hi 400] [--threads 2]

Prints the kernels in the program, the median run at a seen size, the median run at a new size
and their difference (target <= 50 us), the same on the calling thread's CPU time (what binding
costs, less disturbed by a busy host), and whether anything was compiled after the warm-up."""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import lazycandle as lc
from lazycandle.codegen import jit


def program(blocks, width=32):
    rng = np.random.default_rng(0)
    x = lc.placeholder("x", ("n", width))
    h = x
    for _ in range(blocks):
        w = lc.tensor(rng.standard_normal((width, width), np.float32) / 6)
        h = lc.nn.layer_norm(h + (h @ w).gelu(), lc.tensor(np.ones(width, np.float32)),
                             lc.tensor(np.zeros(width, np.float32)), 1e-5)
    return lc.compile([lc.nn.softmax(h, -1)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--lo", type=int, default=3)
    ap.add_argument("--hi", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    lc.set_num_threads(a.threads)
    prog = program(a.blocks)
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((n, 32), np.float32) for n in range(a.lo, a.hi + 1)}
    for n in (a.lo, a.lo + 1, a.lo + 2):
        for _ in range(3):
            prog.run(x=feeds[n])
    kernels = len(prog._instance({"n": a.lo}).plan.kernels)
    before = jit.stats["compiled"]
    new, seen, new_cpu, seen_cpu = [], [], [], []
    clock, cpu = time.perf_counter, time.thread_time
    for n in range(a.lo + 3, a.hi + 1):
        f = feeds[n]
        c0, t0 = cpu(), clock()
        prog.run(x=f)
        t1, c1 = clock(), cpu()
        prog.run(x=f)                        # the same size again: bound already
        t2, c2 = clock(), cpu()
        new.append(t1 - t0)
        seen.append(t2 - t1)
        new_cpu.append(c1 - c0)
        seen_cpu.append(c2 - c1)
    mn, ms = statistics.median(new), statistics.median(seen)
    cn, cs = statistics.median(new_cpu), statistics.median(seen_cpu)
    print(f"load {os.getloadavg()[0]:.2f}; {a.threads} thread(s); {kernels} kernels; n = {a.lo + 3}..{a.hi} each new once")
    print(f"run at a new n: median {mn * 1e6:.1f} us; again at that n: {ms * 1e6:.1f} us; "
          f"binding a new size: {(mn - ms) * 1e6:.1f} us (target <= 50); compiled after warm-up: "
          f"{jit.stats['compiled'] - before}")
    print(f"calling thread's CPU time: new n {cn * 1e6:.1f} us, again {cs * 1e6:.1f} us, "
          f"binding {(cn - cs) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
