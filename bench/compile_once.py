"""Compile once, run many (issue 9): what a new scalar value and a new size cost.

    python -m bench.compile_once [--calls 1000] [--max-len 256]

scalars: 1,000 calls of (a * float(i)).numpy() on 1,000 f32 against the same call with one
         fixed scalar; prints kernels compiled and ms per call.
decode:  attention over a growing KV cache, L = 1 .. max-len: q (1, 64) @ K.T (L, 64),
         softmax, @ V (L, 64); prints kernels compiled over the whole loop and, per L, the
         first step at that L eagerly and through a named-dim program (a new size: the size
         class's plan is bound symbolically and runs its one native program at once), the
         same eager and named-dim steps again, and a program compiled with lc.compile for
         that fixed L (see `decode`).  The load average is printed with the figures.
"""
from __future__ import annotations

import argparse
import os
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
    for i in range(3):     # warm-up: the plan, its symbolic binder and its native program are built once
        (a * 0.5).numpy()
        (a * float(-i - 2)).numpy()
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


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _once_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def decode(max_len: int, sample=(2, 15, 16, 17, 64, 100, 255, 256)) -> dict:
    """One loop over L = 1 .. max_len, rotating at each L (same machine load for all):
    new_eager   the eager step, the first time at this L;
    new_prog    a named-dim program (k, v of ("L", 64)), the first run at this L;
    fixed_prog  a program compiled for this fixed L (median of 9 runs, each right after an
                eager step, like every named-dim run here: the same cache state);
    fixed_once  that program once, right after an eager step and a cleared matmul plan cache
                (where new_prog runs: a like-for-like single run, caches as cold);
    same_eager  the eager step at this L again (median of 9);
    same_prog   the named-dim program at this L again (median of 9)."""
    rng = np.random.default_rng(1)
    d = 64
    kc = rng.standard_normal((max_len, d)).astype(np.float32)
    vc = rng.standard_normal((max_len, d)).astype(np.float32)
    qs = rng.standard_normal((max_len, 1, d)).astype(np.float32)
    from lazycandle.runtime.matmul import _plans as mm_plans
    before = jit.stats["compiled"]
    prog = lc.compile(_attention(lc.placeholder("q", (1, d)), lc.placeholder("k", ("L", d)),
                                 lc.placeholder("v", ("L", d))))
    rows = {}
    for L in range(1, max_len + 1):
        q, k, v = qs[L - 1], kc[:L], vc[:L]
        feeds = {"q": q, "k": k, "v": v}
        mm_plans.clear()        # each path meets this L's GEMM shapes for the first time
        new_eager = _once_ms(lambda: _attention(lc.tensor(q), lc.tensor(k), lc.tensor(v)).numpy())
        mm_plans.clear()
        new_prog = _once_ms(lambda: prog.run(**feeds))
        fixed = lc.compile(_attention(lc.placeholder("q", (1, d)), lc.placeholder("k", (L, d)),
                                      lc.placeholder("v", (L, d))))
        fixed.run(**feeds)
        _attention(lc.tensor(q), lc.tensor(k), lc.tensor(v)).numpy()
        mm_plans.clear()
        fixed_once = _once_ms(lambda: fixed.run(**feeds))
        fixed_ms, same_ms, again_ms = [], [], []
        for _ in range(9):      # each program run right after an eager step, as the new-L runs are
            same_ms.append(_once_ms(lambda: _attention(lc.tensor(q), lc.tensor(k), lc.tensor(v)).numpy()))
            fixed_ms.append(_once_ms(lambda: fixed.run(**feeds)))
            _attention(lc.tensor(q), lc.tensor(k), lc.tensor(v)).numpy()
            again_ms.append(_once_ms(lambda: prog.run(**feeds)))
        rows[L] = (new_eager, new_prog, _median(fixed_ms), _median(same_ms), _median(again_ms), fixed_once)
        if L in sample:
            np.testing.assert_array_equal(prog.run(**feeds)[0], fixed.run(**feeds)[0])
    compiled = jit.stats["compiled"] - before
    late = [rows[L] for L in range(max(2, max_len // 2), max_len + 1)]
    med = [_median([r[i] for r in late]) for i in range(6)]
    return {"max_len": max_len, "kernels_compiled": compiled, "rows": [(L,) + rows[L] for L in sample if L <= max_len],
            "median_second_half": med, "plans": lc.cache_info()["plans"]}


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
        new_eager, new_prog, fixed, same, again, fixed_once = r["median_second_half"]
        print(f"decode: attention over a KV cache of L = 1..{r['max_len']}: {r['kernels_compiled']} kernel(s) "
              f"compiled in the whole loop, {r['plans']} plan(s) cached; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"  medians over L = {max(2, r['max_len'] // 2)}..{r['max_len']}: named-dim program at a new L "
              f"{new_prog:.3f} ms vs fixed-L program {fixed:.3f} ms ({new_prog / fixed:.2f}x; the same L again "
              f"{again:.3f} ms); against the fixed-L program run once where the new L runs {fixed_once:.3f} ms "
              f"({new_prog / fixed_once:.2f}x); eager step at a new L {new_eager:.3f} ms vs the same L again "
              f"{same:.3f} ms ({new_eager / same:.2f}x)")
        print("     L   eager new L ms   eager same L ms   named-dim new L ms   named-dim same L ms"
              "   fixed-L program ms   fixed-L once ms")
        for L, ne, npg, fx, sm, ag, fo in r["rows"]:
            print(f"  {L:4d}   {ne:14.3f}   {sm:15.3f}   {npg:18.3f}   {ag:19.3f}   {fx:18.3f}   {fo:15.3f}")


if __name__ == "__main__":
    main()
