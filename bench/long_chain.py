"""How the graph pipeline scales with graph size (issue 8, item 6):

    python bench/long_chain.py [--ops 10000] [--realize]

builds a chain of N elementwise ops, and a chain of N ops alternating elementwise steps and a
keepdim mean broadcast back, then prints the seconds spent in capture, graph passes and the
scheduler, the kernel count and the process's peak memory (`--realize` also compiles and runs it).
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

if __package__ in (None, ""):          # run as a script: import the checkout's lazycandle
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import lazycandle as lc  # noqa: E402
from lazycandle.ir.graph import capture  # noqa: E402
from lazycandle.ir.passes import optimize, recompute_into_reductions  # noqa: E402
from lazycandle.ir.schedule import schedule  # noqa: E402


def chain(kind, n):
    y = lc.tensor(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8))
    for i in range(n):
        if kind == "elementwise":
            y = y.tanh() if i % 2 == 0 else y * 0.999 + 0.001
        else:
            y = y * 1.5 + 0.25 if i % 2 == 0 else y - y.mean_keepdim(1).broadcast_as(y.shape)
    return y


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=10000)
    ap.add_argument("--realize", action="store_true")
    a = ap.parse_args(argv)
    for kind in ("elementwise", "alternating"):
        y = chain(kind, a.ops)
        t0 = time.perf_counter()
        cap = capture([y._node])
        cap.operands
        t1 = time.perf_counter()
        opt = recompute_into_reductions(optimize(cap))
        t2 = time.perf_counter()
        kernels, _, _ = schedule(opt)
        t3 = time.perf_counter()
        line = (f"{kind:12s} {a.ops} ops -> {len(cap.nodes)} nodes: capture {t1 - t0:.3f} s, passes {t2 - t1:.3f} s, "
                f"schedule {t3 - t2:.3f} s, {len(kernels)} kernels")
        if a.realize:
            t4 = time.perf_counter()
            y.numpy()
            line += f", realize {time.perf_counter() - t4:.1f} s"
        print(line + f"; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
