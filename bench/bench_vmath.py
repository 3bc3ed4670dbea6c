"""Speed of the vector math kernels against NumPy (issue 3 targets).

    .venv/bin/python bench/bench_vmath.py            # public API if lc.tensor works, else kernels
    .venv/bin/python bench/bench_vmath.py --kernel   # the vmath_run test kernels, 2 threads

4,194,304 float32 values, median of --reps runs after a warm-up, NumPy measured in the same
run.  Ratio = NumPy time / our time (higher is better); targets: exp >= 1.2, tanh / log / sin
>= 2, gelu >= 8 (against NumPy's 0.5*x*(1+tanh(0.7978845608*(x+0.044715*x^3)))).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

N = 4_194_304
TARGETS = {"exp": 1.2, "tanh": 2.0, "log": 2.0, "sin": 2.0, "gelu": 8.0}


def _numpy_gelu(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


NUMPY = {"exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
         "gelu": _numpy_gelu, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
         "silu": lambda x: x / (1 + np.exp(-x)), "erf": None, "sqrt": np.sqrt}


def _inputs(name, rng):
    if name == "log":
        return rng.uniform(1e-3, 100.0, N).astype(np.float32)
    if name in ("sin", "cos"):
        return rng.uniform(-100.0, 100.0, N).astype(np.float32)
    return rng.uniform(-10.0, 10.0, N).astype(np.float32)


def _median_ms(fn, reps):
    fn()
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def _public_api():
    """lc.tensor(x).<fn>().numpy() if the public API exists and works, else None."""
    try:
        import lazycandle as lc
        t = lc.tensor(np.ones(8, np.float32))
        t.exp().numpy()
        return lc
    except Exception:
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", action="store_true", help="time the vmath_run kernels (not the Tensor API)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("names", nargs="*", default=["exp", "tanh", "log", "sin", "cos", "gelu", "sigmoid", "silu"])
    args = ap.parse_args(argv)
    lc = None if args.kernel else _public_api()
    rng = np.random.default_rng(0)
    if lc is None:
        from lazycandle.codegen import vmath_run
        how = f"vmath_run kernels, {args.threads} threads"
        out = np.empty(N, np.float32)
        ours = lambda name, x: (lambda: vmath_run.run(name, x, threads=args.threads, out=out))
    else:
        how = "public Tensor API (t.fn().numpy() on a realized input tensor)"
        lc.set_num_threads(args.threads)

        def ours(name, x):
            t = lc.tensor(x)                      # the input is realized once, like NumPy's array
            return lambda: getattr(t, name)().numpy()
    print(f"{N} float32, median of {args.reps}, {how}\n")
    print("| function | numpy ms | ours ms | ratio | target |")
    print("|---|---|---|---|---|")
    for name in args.names:
        x = _inputs(name, rng)
        ref = NUMPY.get(name)
        t_np = _median_ms(lambda: ref(x), args.reps) if ref else float("nan")
        t_us = _median_ms(ours(name, x), args.reps)
        target = TARGETS.get(name)
        print(f"| {name} | {t_np:.2f} | {t_us:.2f} | {t_np / t_us:.1f}x | "
              f"{'>= %.1fx' % target if target else '-'} |")


if __name__ == "__main__":
    main()
