"""Attention benchmark: lc.nn.scaled_dot_product_attention (the fused flash-attention kernel)
against torch's F.scaled_dot_product_attention (when installed: PYTHONPATH=/work/peers) and
lazycandle's graph version (matmul, softmax, matmul), on the same f32 data, causal by default.
Implementations alternate inside one loop (bench/timing.py), the median of >= 9 runs after a
warm-up; the load average is printed because the machine is shared.

    PYTHONPATH=/work/peers python -m bench.sdpa [--shape 1 12 512 64] [--threads 2] [--no-causal]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import lazycandle as lc
from bench.peers import load_peers, threads
from bench.timing import time_alternating
from lazycandle.nn_attention import _graph_sdpa


def cases(q, k, v, causal, mods) -> dict:
    tq, tk, tv = lc.tensor(q), lc.tensor(k), lc.tensor(v)
    scale = 1.0 / np.sqrt(q.shape[-1])
    fns = {"lc fused sdpa": lambda: lc.nn.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).realize(),
           "lc graph sdpa": lambda: _graph_sdpa(tq, tk, tv, None, causal, scale).realize()}
    if "torch" in mods:
        torch = mods["torch"]
        pq, pk, pv = (torch.from_numpy(x) for x in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        fns["torch F.sdpa"] = lambda: sdpa(pq, pk, pv, is_causal=causal)
    return fns


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=4, default=(1, 12, 512, 64), metavar=("B", "H", "L", "E"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--no-causal", action="store_true")
    args = ap.parse_args(argv)
    causal = not args.no_causal
    mods, notes = load_peers(("torch",))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(tuple(args.shape)).astype(np.float32) for _ in range(3))
    with threads(args.threads, mods):
        got = lc.nn.scaled_dot_product_attention(lc.tensor(q), lc.tensor(k), lc.tensor(v), is_causal=causal).numpy()
        if "torch" in mods:
            torch = mods["torch"]
            want = torch.nn.functional.scaled_dot_product_attention(
                *(torch.from_numpy(x) for x in (q, k, v)), is_causal=causal).numpy()
            assert np.allclose(got, want, atol=1e-4), np.abs(got - want).max()
        print(f"sdpa {tuple(args.shape)} f32{' causal' if causal else ''}, {args.threads} threads, "
              f"load average before {os.getloadavg()[0]:.2f}")
        for n in notes:
            print(f"  note: {n}")
        stats = time_alternating(cases(q, k, v, causal, mods), repeats=args.repeats, warmup=2)
    mine = stats["lc fused sdpa"].median
    for name, s in stats.items():
        print(f"  {name:16s} median {s.median * 1e3:8.2f} ms  (min {s.min * 1e3:7.2f}, max {s.max * 1e3:7.2f}, "
              f"n {s.n})  this / lc fused = {s.median / mine:5.2f}x")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
