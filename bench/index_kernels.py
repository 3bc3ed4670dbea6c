"""Steady-state run time of the node-step kernels (index, copy, scan, im2col, sort): each case
realizes one expression over fixed inputs (kernels already compiled), median of 9 after
warm-up, and the kernels compiled over a growing length L = 2 .. 39.

    python -m bench.index_kernels [--repeats 9]

Use it to compare two builds (run each in turn, same load) and to see that a growing length
compiles a constant number of kernels (issue 9)."""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import lazycandle as lc


def _cases():
    rng = np.random.default_rng(0)
    f = lambda *s: lc.tensor(rng.standard_normal(s).astype(np.float32))   # noqa: E731
    emb, ids = f(8192, 768), lc.tensor(rng.integers(0, 8192, 512).astype(np.int64))
    t2, ids2 = f(1024, 1024), lc.tensor(rng.integers(0, 1024, (1024, 64)).astype(np.int64))
    acc, ids3, src3 = f(4096, 256), lc.tensor(rng.integers(0, 4096, 8192).astype(np.int64)), f(8192, 256)
    a, b = f(2048, 1024), f(2048, 1024)
    x, img, w = f(1024, 1024), f(8, 16, 64, 64), f(32, 16, 3, 3)
    rows = f(256, 1000)
    return {
        "index_select (8192,768)[512 ids]": lambda: emb.index_select(ids, 0),
        "gather (1024,1024) by (1024,64) dim 1": lambda: t2.gather(ids2, 1),
        "index_add (4096,256) += 8192 rows": lambda: acc.index_add(ids3, src3, 0),
        "cat 2x(2048,1024) dim 0": lambda: lc.cat([a, b], 0),
        "cat 2x(2048,1024) dim 1": lambda: lc.cat([a, b], 1),
        "cat of transposed (1024,1024)": lambda: lc.cat([x.T, x], 0),
        "cumsum (1024,1024) dim 0": lambda: x.cumsum(0),
        "cumsum (1024,1024) dim 1": lambda: x.cumsum(1),
        "conv2d 8x16x64x64 * 32x16x3x3 (im2col)": lambda: img.conv2d(w, padding=1),
        "argsort (256,1000)": lambda: rows.arg_sort_last_dim(),
    }


def steady(repeats: int) -> dict:
    out = {}
    for name, fn in _cases().items():
        for _ in range(3):
            fn().numpy()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn().numpy()
            ts.append(time.perf_counter() - t0)
        out[name] = statistics.median(ts) * 1e3
    return out


def growing() -> dict:
    rng = np.random.default_rng(1)
    emb = lc.tensor(rng.standard_normal((1000, 64)).astype(np.float32))
    res = {}
    before = lc.cache_info()["kernels"]
    k = lc.tensor(rng.standard_normal((1, 64)).astype(np.float32))
    for _ in range(2, 40):
        k = lc.cat([k, lc.tensor(rng.standard_normal((1, 64)).astype(np.float32))], 0)
        k.numpy()
    res["cat KV cache L=2..39"] = lc.cache_info()["kernels"] - before
    before = lc.cache_info()["kernels"]
    for n in range(2, 40):
        emb.index_select(lc.tensor(rng.integers(0, 1000, n).astype(np.int64)), 0).numpy()
    res["index_select L=2..39"] = lc.cache_info()["kernels"] - before
    before = lc.cache_info()["kernels"]
    for n in range(2, 40):
        lc.tensor(rng.standard_normal((n, 64)).astype(np.float32)).cumsum(0).numpy()
    res["cumsum (L,64) L=2..39"] = lc.cache_info()["kernels"] - before
    return res


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--no-growing", action="store_true")
    args = p.parse_args(argv)
    for name, ms in steady(args.repeats).items():
        print(f"{name:42s} {ms:8.3f} ms")
    if not args.no_growing:
        for name, n in growing().items():
            print(f"{name:42s} {n:4d} kernels compiled")


if __name__ == "__main__":
    main()
