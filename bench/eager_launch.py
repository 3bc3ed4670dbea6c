"""The eager launcher against the ctypes path it replaces (runtime/native_exec.LAUNCH on / off),
on the caches an eager call usually meets: each call timed right after a NumPy reduction over
`--flush` MiB has streamed them out, the two paths alternating round by round, NumPy's own
call beside them (the three take turns going first):

    python -m bench.eager_launch [--threads 1] [--flush 32] [--rounds 41]

Each row is an eager `expr(x).numpy()` on a tensor made once (median microseconds)."""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import lazycandle as lc
from lazycandle.runtime import native_exec

def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


CASES = {   # name -> (shape, lazycandle expression, NumPy's)
    "sum(0) 256x256": ((256, 256), lambda t: t.sum(0), lambda x: x.sum(0)),
    "sum(-1) 256x256": ((256, 256), lambda t: t.sum(-1), lambda x: x.sum(-1)),
    "exp 64x64": ((64, 64), lambda t: t.exp(), np.exp),
    "x*2+1 64x64": ((64, 64), lambda t: t * 2.0 + 1.0, lambda x: x * np.float32(2) + np.float32(1)),
    "sum(0) 4096x1024": ((4096, 1024), lambda t: t.sum(0), lambda x: x.sum(0)),
    "sum(-1) 4096x1024": ((4096, 1024), lambda t: t.sum(-1), lambda x: x.sum(-1)),
    "softmax 1024x1024": ((1024, 1024), lambda t: t.softmax(-1), _softmax),
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--flush", type=int, default=32, help="MiB a NumPy sum reads before each timed call")
    ap.add_argument("--rounds", type=int, default=41)
    args = ap.parse_args(argv)
    lc.set_num_threads(args.threads)
    flush = np.ones(max(args.flush << 18, 1), np.float32)
    print(f"{args.threads} thread(s), {args.flush} MiB streamed before each call, median of {args.rounds} (us), "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"  {'case':<20}{'launcher':>10}{'ctypes':>10}{'numpy':>10}")
    for name, (shape, expr, np_expr) in CASES.items():
        x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
        t = lc.tensor(x)
        runs = {"launcher": lambda: expr(t).numpy(), "ctypes": lambda: expr(t).numpy(),
                "numpy": lambda: np_expr(x)}
        for _ in range(6):
            expr(t).numpy()
        times = {k: [] for k in runs}
        try:
            order = list(runs)
            for r in range(args.rounds):
                for k in order[r % 3:] + order[:r % 3]:       # each first in turn after the flush
                    f = runs[k]
                    native_exec.LAUNCH = k != "ctypes"
                    flush.sum()
                    t0 = time.perf_counter()
                    f()
                    times[k].append(time.perf_counter() - t0)
        finally:
            native_exec.LAUNCH = True
        print(f"  {name:<20}" + "".join(f"{np.median(v) * 1e6:>10.1f}" for v in times.values()))


if __name__ == "__main__":
    main()
