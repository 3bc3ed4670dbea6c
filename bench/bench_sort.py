"""Sort benchmark: lazycandle's sort_last_dim / arg_sort_last_dim (generated bitonic kernels,
rows over the thread pool) against NumPy's np.sort / np.argsort(kind="stable") along the last
dim, on the same f32 data.  Implementations alternate inside one loop (bench/timing.py), the
median of >= 9 runs after a warm-up; the load average is printed because the machine is shared.

    python -m bench.bench_sort [--shape 4096 1024] [--threads 2] [--repeats 9]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import lazycandle as lc
from bench.timing import time_alternating


def cases(x: np.ndarray) -> dict:
    t = lc.tensor(x)

    def lc_sort():
        v, i = t.sort_last_dim()
        lc.realize(v, i)

    def lc_sort_values():
        t.sort_last_dim()[0].realize()

    def lc_argsort():
        t.arg_sort_last_dim().realize()

    return {"lc sort_last_dim (values+ids)": lc_sort, "lc sort_last_dim values": lc_sort_values,
            "lc arg_sort_last_dim": lc_argsort, "np.sort(axis=-1)": lambda: np.sort(x, axis=-1),
            "np.argsort(kind=stable)": lambda: np.argsort(x, axis=-1, kind="stable")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=2, default=(4096, 1024))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args(argv)
    lc.set_num_threads(args.threads)
    x = np.random.default_rng(0).standard_normal(tuple(args.shape)).astype(np.float32)
    v, i = lc.tensor(x).sort_last_dim()
    assert np.array_equal(v.numpy(), np.sort(x, axis=-1)) and np.array_equal(i.numpy(), np.argsort(x, -1, kind="stable"))
    print(f"sort along the last dim of {tuple(args.shape)} f32, lazycandle threads {args.threads}, "
          f"load average before {os.getloadavg()[0]:.2f}")
    stats = time_alternating(cases(x), repeats=args.repeats, warmup=2)
    ref = stats["np.sort(axis=-1)"].median
    for name, s in stats.items():
        print(f"  {name:32s} median {s.median * 1e3:8.2f} ms  (min {s.min * 1e3:7.2f}, max {s.max * 1e3:7.2f}, "
              f"n {s.n})  np.sort / this = {ref / s.median:5.2f}x")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
