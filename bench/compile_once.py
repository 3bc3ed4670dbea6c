"""Compile once, run many (issue 9): what a new scalar value and a new size cost.

    python -m bench.compile_once [--calls 1000] [--max-len 256]

scalars: 1,000 calls of (a * float(i)).numpy() on 1,000 f32 against the same call with one
         fixed scalar; prints kernels compiled and ms per call.
decode:  attention over a growing KV cache, L = 1 .. max-len: q (1, 64) @ K.T (L, 64),
         softmax, @ V (L, 64); prints kernels compiled over the whole loop and, per L, the step
         time against a program compiled for that fixed L (lc.compile on placeholders).
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
    fixed_ms = _best_ms(lambda: (a * 0.5).numpy())
    before = jit.stats["compiled"]
    t0 = time.perf_counter()
    for i in range(calls):
        (a * float(i + 2)).numpy()
    loop_ms = (time.perf_counter() - t0) / calls * 1e3
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
    t0 = time.perf_counter()
    for L in range(1, max_len + 1):
        _attention(lc.tensor(qs[L - 1]), lc.tensor(kc[:L]), lc.tensor(vc[:L])).numpy()
    loop_s = time.perf_counter() - t0
    compiled = jit.stats["compiled"] - before
    rows = []
    for L in sample:
        if L > max_len:
            continue
        q, k, v = lc.tensor(qs[L - 1]), lc.tensor(kc[:L]), lc.tensor(vc[:L])
        dyn_ms = _best_ms(lambda: _attention(q, k, v).numpy())
        prog = lc.compile(_attention(lc.placeholder("q", (1, d)), lc.placeholder("k", (L, d)),
                                     lc.placeholder("v", (L, d))))
        feeds = {"q": qs[L - 1], "k": kc[:L], "v": vc[:L]}
        np.testing.assert_allclose(prog.run(**feeds)[0], _attention(q, k, v).numpy(), rtol=1e-5, atol=1e-6)
        fixed_ms = _best_ms(lambda: prog.run(**feeds))
        rows.append((L, dyn_ms, fixed_ms, dyn_ms / fixed_ms))
    return {"max_len": max_len, "kernels_compiled": compiled, "loop_ms_per_step": loop_s / max_len * 1e3,
            "rows": rows}


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
              f"compiled in the loop, {r['loop_ms_per_step']:.2f} ms per step including compiles")
        print("     L   eager ms   fixed-L program ms   ratio")
        for L, dyn, fixed, ratio in r["rows"]:
            print(f"  {L:4d}   {dyn:8.3f}   {fixed:18.3f}   {ratio:5.2f}")


if __name__ == "__main__":
    main()
