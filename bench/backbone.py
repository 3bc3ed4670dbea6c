"""Issue 2's "must show" figures, measured the way the issue asks:

    python bench/backbone.py            (or: python -m bench.backbone)

* `(a*b + c)*d - a` on 4,194,304 f32 against NumPy's same expression (target >= 4x);
* `(A.t() + B) * 2` on 2048x2048 f32 against NumPy's `(A.T + B) * 2` (target >= 8x);
  both with 2 threads, one warm-up then the median of 9, lazycandle and NumPy alternating, each
  lazycandle iteration building the graph afresh from realized inputs and realizing it;
* the first compile of a NEW 5-op fused chain in a warm process (target < 100 ms): a chain made
  structurally new by a fresh constant, timed from graph building to its first realized result;
* the same first compile in a cold process (import, LLVM initialisation and JIT set-up included),
  reported separately.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time

if __package__ in (None, ""):          # run as a script: make `bench` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from bench.timing import time_alternating

N_VEC = 4_194_304
N_MAT = 2048
TARGET_CHAIN, TARGET_T, TARGET_COMPILE_MS = 4.0, 8.0, 100.0

COLD_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import lazycandle as lc
t1 = time.perf_counter()
k = float(sys.argv[1])
x = [lc.tensor(np.full(4096, v, np.float32)).realize() for v in (1.0, 2.0, 3.0)]
t2 = time.perf_counter()
y = ((x[0] * x[1] + k) * x[2] - x[0]) * (k + 1.0)
y.numpy()
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_realize_s": t3 - t2}))
"""


def five_op_chain(a, b, c, k):
    """mul, add (constant k), mul, sub, mul (constant k+1): one fused kernel of 5 ops."""
    return ((a * b + k) * c - a) * (k + 1.0)


def _fmt(stats) -> str:
    return f"{stats.median * 1e3:7.2f} ms ({stats.min * 1e3:.2f}–{stats.max * 1e3:.2f})"


def compare(label, lc_fn, np_fn, target, repeats):
    """Alternate lazycandle and NumPy; print one line; return the ratio."""
    st = time_alternating({"lazycandle": lc_fn, "numpy": np_fn}, repeats=repeats, warmup=1)
    ratio = st["numpy"].median / st["lazycandle"].median
    verdict = "PASS" if ratio >= target else "MISS"
    print(f"{label:<34} lazycandle {_fmt(st['lazycandle'])}   NumPy {_fmt(st['numpy'])}   "
          f"{ratio:5.2f}x faster  (target >= {target:g}x: {verdict})", flush=True)
    return ratio


def warm_compile_ms(lc, trials: int = 5, n: int = 4096) -> list:
    """First-realize time (ms) of structurally new 5-op chains in this (warm) process."""
    rng = np.random.default_rng(7)
    a, b, c = (lc.tensor(rng.standard_normal(n, dtype=np.float32)).realize() for _ in range(3))
    times = []
    for _ in range(trials):
        k = round(random.uniform(1.0, 2.0), 9)          # a constant never seen: a new structure
        t0 = time.perf_counter()
        five_op_chain(a, b, c, k).numpy()
        times.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    five_op_chain(a, b, c, k).numpy()                   # the same structure again: cached
    times.append((time.perf_counter() - t0) * 1e3)
    return times


def cold_compile(trials: int = 3) -> list:
    """(import s, first realize s) in fresh processes, without a disk kernel cache."""
    env = dict(os.environ, LAZYCANDLE_CACHE_DIR="off")
    out = []
    for _ in range(trials):
        k = repr(round(random.uniform(3.0, 4.0), 9))
        res = subprocess.run([sys.executable, "-c", COLD_SCRIPT, k], capture_output=True, text=True, env=env,
                             timeout=300)
        if res.returncode != 0:
            raise RuntimeError(res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "cold run failed")
        d = json.loads(res.stdout.strip().splitlines()[-1])
        out.append((d["import_s"], d["first_realize_s"]))
    return out


def main(argv=None) -> int:
    """Print the figures; exit code 0 whatever they are (they are measurements, not tests)."""
    p = argparse.ArgumentParser(prog="python bench/backbone.py", description="issue 2's must-show figures")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--no-cold", action="store_true", help="skip the cold-process compile figure")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)     # tests: small sizes
    args = p.parse_args(argv)
    import lazycandle as lc
    from lazycandle.codegen import jit

    with contextlib.ExitStack() as stack:
        stack.enter_context(lc.num_threads(args.threads))
        try:
            from threadpoolctl import threadpool_limits
            stack.enter_context(threadpool_limits(args.threads, user_api="blas"))
        except ImportError:
            pass
        _figures(lc, jit, args)
    return 0


def _figures(lc, jit, args) -> None:
    n_vec, n_mat = (4099, 67) if args.tiny else (N_VEC, N_MAT)
    host = jit.host_info()
    print(f"lazycandle backbone figures (issue 2): {args.threads} threads, 1 warm-up then median of "
          f"{args.repeats} (min–max), lazycandle and NumPy alternating; CPU {host['cpu']}, "
          f"{len(os.sched_getaffinity(0))} CPUs; NumPy {np.__version__}", flush=True)
    env = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    if env:
        print(f"  environment: {env}")

    rng = np.random.default_rng(0)
    a, b, c, d = (rng.standard_normal(n_vec, dtype=np.float32) for _ in range(4))
    ta, tb, tc, td = (lc.tensor(x).realize() for x in (a, b, c, d))
    compare(f"(a*b + c)*d - a, {n_vec:,} f32", lambda: ((ta * tb + tc) * td - ta).numpy(),
            lambda: (a * b + c) * d - a, TARGET_CHAIN, args.repeats)

    A, B = (rng.standard_normal((n_mat, n_mat), dtype=np.float32) for _ in range(2))
    tA, tB = lc.tensor(A).realize(), lc.tensor(B).realize()
    compare(f"(A.t() + B) * 2, {n_mat}x{n_mat} f32", lambda: ((tA.t() + tB) * 2).numpy(),
            lambda: (A.T + B) * 2, TARGET_T, args.repeats)

    times = warm_compile_ms(lc)
    med = statistics.median(times[:-1])
    print(f"{'first compile, new 5-op chain, warm':<34} {med:7.1f} ms median of {len(times) - 1} fresh chains "
          f"({', '.join(f'{t:.1f}' for t in times[:-1])}); the same chain again: {times[-1]:.2f} ms  "
          f"(target < {TARGET_COMPILE_MS:g} ms: {'PASS' if med < TARGET_COMPILE_MS else 'MISS'})", flush=True)
    if not args.no_cold:
        try:
            cold = cold_compile()
            imp = statistics.median(c[0] for c in cold) * 1e3
            first = statistics.median(c[1] for c in cold) * 1e3
            print(f"{'first compile, cold process':<34} {first:7.1f} ms median of {len(cold)} processes "
                  f"(first realize incl. LLVM init and JIT set-up; `import lazycandle` {imp:.0f} ms more)")
        except Exception as e:
            print(f"first compile, cold process: failed ({e})")


if __name__ == "__main__":
    sys.exit(main())
