"""Compile once, run many (issue 9): what a new scalar value and a new size cost.

    python -m bench.compile_once [--calls 1000] [--max-len 256]

scalars: 1,000 calls of (a * float(i)).numpy() on 1,000 f32 against the same call with one
         fixed scalar; prints kernels compiled and ms per call.
decode:  attention over a growing KV cache, L = 1 .. max-len: q (1, 64) @ K.T (L, 64),
         softmax, @ V (L, 64), eagerly; prints kernels compiled over the whole loop and, per L,
         the first step at that L (a new size: the plan template is replayed, kernels come from
         the cache), the same eager step once its plan is cached, and a program compiled with
         lc.compile for that fixed L.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import lazycandle as lc
from lazycandle.codegen import jit


def _best_ms(fn, repeats=5, inner=20) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best * 1e3


def scalars(calls: int) -> dict:
    a = lc.tensor(np.random.default_rng(0).standard_normal(1000).astype(np.float32))
    (a * 0.5).numpy()
    before = jit.stats["compiled"]
    new_s = fixed_s = 0.0
    for chunk in range(0, calls, 100):      # alternate chunks so both see the same machine load
        t0 = time.perf_counter()
        for i in range(chunk, min(calls, chunk + 100)):
            (a * float(i + 2)).numpy()
        t1 = time.perf_counter()
        for i in range(chunk, min(calls, chunk + 100)):
            (a * 0.5).numpy()
        new_s, fixed_s = new_s + t1 - t0, fixed_s + time.perf_counter() - t1
    loop_ms, fixed_ms = new_s / calls * 1e3, fixed_s / calls * 1e3
    return {"calls": calls, "kernels_compiled": jit.stats["compiled"] - before,
            "ms_per_call_new_scalar": loop_ms, "ms_per_call_fixed_scalar": fixed_ms,
            "ratio": loop_ms / fixed_ms}


def _attention(q, k, v):
    s = q @ k.transpose(0, 1)
    return lc.nn.softmax_last_dim(s * 0.125) @ v


def decode(max_len: int, sample=(1, 2, 15, 16, 17, 64, 100, 255, 256)) -> dict:
    rng = np.random.default_rng(1)
    d = 64
    kc = rng.standard_normal((max_len, d)).astype(np.float32)
    vc = rng.standard_normal((max_len, d)).astype(np.float32)
    qs = rng.standard_normal((max_len, 1, d)).astype(np.float32)
    before = jit.stats["compiled"]
    first_ms = {}
    for L in range(1, max_len + 1):
        t0 = time.perf_counter()
        _attention(lc.tensor(qs[L - 1]), lc.tensor(kc[:L]), lc.tensor(vc[:L])).numpy()
        first_ms[L] = (time.perf_counter() - t0) * 1e3
    compiled = jit.stats["compiled"] - before
    rows = []
    for L in sample:
        if L > max_len:
            continue
        q, k, v = lc.tensor(qs[L - 1]), lc.tensor(kc[:L]), lc.tensor(vc[:L])
        warm_ms = _best_ms(lambda: _attention(q, k, v).numpy())
        prog = lc.compile(_attention(lc.placeholder("q", (1, d)), lc.placeholder("k", (L, d)),
                                     lc.placeholder("v", (L, d))))
        feeds = {"q": qs[L - 1], "k": kc[:L], "v": vc[:L]}
        np.testing.assert_allclose(prog.run(**feeds)[0], _attention(q, k, v).numpy(), rtol=1e-5, atol=1e-6)
        fixed_ms = _best_ms(lambda: prog.run(**feeds))
        rows.append((L, first_ms[L], warm_ms, fixed_ms))
    late = [first_ms[L] for L in range(max(2, max_len // 2), max_len + 1)]
    return {"max_len": max_len, "kernels_compiled": compiled, "rows": rows,
            "median_new_size_ms_second_half": sorted(late)[len(late) // 2]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--only", choices=("scalars", "decode"))
    args = ap.parse_args(argv)
    if args.only in (None, "scalars"):
        r = scalars(args.calls)
        print(f"scalars: {r['calls']} calls of (a * float(i)).numpy(), 1000 f32: {r['kernels_compiled']} kernel(s) "
              f"compiled; {r['ms_per_call_new_scalar']:.3f} ms/call vs {r['ms_per_call_fixed_scalar']:.3f} ms "
              f"with a fixed scalar ({r['ratio']:.2f}x)")
    if args.only in (None, "decode"):
        r = decode(args.max_len)
        print(f"decode: attention over a KV cache of L = 1..{r['max_len']}: {r['kernels_compiled']} kernel(s) "
              f"compiled in the whole loop; median step at a new L (second half): "
              f"{r['median_new_size_ms_second_half']:.3f} ms")
        print("     L   first step at this L ms   eager, same L again ms   fixed-L lc.compile program ms")
        for L, first, warm, fixed in r["rows"]:
            print(f"  {L:4d}   {first:23.3f}   {warm:22.3f}   {fixed:29.3f}")


if __name__ == "__main__":
    main()
