"""bf16 matmul on AMX tiles (issue 43 item 2) against torch (oneDNN) in one process, alternating:
lazycandle with AMX (the host's choice), lazycandle with AMX forced off (the AVX512-BF16 pair
form), torch; plus f32 rows (lazycandle, torch) to show the other forms unchanged.  Operands are
64-byte aligned NumPy arrays that torch views (torch.from_numpy) and lazycandle reads in place
(runtime.matmul on raw storage, as the executor calls it; a fresh output per call, as torch
makes one).  Median and min of >= 9 timed calls after a warm-up, GFLOP/s of the median, the
1-minute load average beside each row.

    OMP_WAIT_POLICY=PASSIVE KMP_BLOCKTIME=0 python -m bench.amx_bf16 [--sizes 1024,2048] [--threads 1,2] [--reps 11] [--cpu]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import ml_dtypes
import numpy as np

import lazycandle as lc
from lazycandle import dtype as D
from lazycandle.codegen import gemm_amx
from lazycandle.layout import Layout
from lazycandle.runtime import matmul as MM

BF = ml_dtypes.bfloat16


def aligned(x: np.ndarray) -> np.ndarray:
    raw = np.empty(x.nbytes + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    out = raw[off:off + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


def lc_plan(n: int, dt, threads: int, amx: str):
    """A tiled plan of n x n @ n x n under LAZYCANDLE_AMX=amx (a plan keeps its kernel)."""
    before = os.environ.get("LAZYCANDLE_AMX")
    os.environ["LAZYCANDLE_AMX"] = amx
    lc.clear_caches()
    try:
        lay = Layout.contiguous((n, n))
        plan = MM.TiledPlan(MM.geometry(lay, lay, dt), threads)
    finally:
        if before is None:
            os.environ.pop("LAZYCANDLE_AMX")
        else:
            os.environ["LAZYCANDLE_AMX"] = before
        lc.clear_caches()
    return plan


def contenders(n: int, dtname: str, threads: int) -> dict:
    import torch
    torch.set_num_threads(threads)
    rng = np.random.default_rng(n)
    npdt = BF if dtname == "bf16" else np.float32
    a, b = (aligned(rng.standard_normal((n, n)).astype(npdt)) for _ in range(2))
    if dtname == "bf16":
        ta, tb = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) for x in (a, b))
    else:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    dt = D.bf16 if dtname == "bf16" else D.f32
    runs = {}
    forms = (("lazycandle", "auto"), ("lazycandle AMX off", "off")) if dtname == "bf16" else (("lazycandle", "auto"),)
    want = a.astype(np.float32) @ b.astype(np.float32)
    for name, amx in forms:
        plan = lc_plan(n, dt, threads, amx)

        def run(plan=plan):
            out = np.empty((n, n), npdt)
            MM.run_plan(plan, a, 0, b, 0, out)
            return out
        got = run().astype(np.float32)
        assert np.abs(got - want).max() <= 2 ** -7 * np.abs(want).max() + 1e-3, name
        runs[name] = run
    runs["torch"] = lambda: torch.mm(ta, tb)
    return runs


def measure(runs: dict, reps: int, clock=time.perf_counter) -> dict:
    for f in runs.values():
        f()                                           # warm-up
    times = {k: [] for k in runs}
    for _ in range(reps):
        for k, f in runs.items():                     # alternating
            t = clock()
            f()
            times[k].append(clock() - t)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1024,2048")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--reps", type=int, default=11)
    p.add_argument("--f32", default="1024", help="f32 sizes to show as well ('' for none)")
    p.add_argument("--cpu", action="store_true",
                   help="1-thread rows on the calling thread's CPU time (both run there; steadier than wall "
                        "time when other processes share the cores)")
    args = p.parse_args(argv)
    print(f"host: {lc.codegen.jit.host_info()['cpu']}, {os.cpu_count()} CPUs; amx: {gemm_amx.status()}")
    print(f"1-thread rows on {'thread CPU' if args.cpu else 'wall'} time, 2-thread rows on wall time")
    print("| case | thr | impl | median ms | min ms | GFLOP/s (median) | × torch | load |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [("bf16", int(n)) for n in args.sizes.split(",")] + [("f32", int(n)) for n in args.f32.split(",") if n]
    for dtname, n in rows:
        for threads in (int(t) for t in args.threads.split(",")):
            lc.set_num_threads(threads)
            clock = time.thread_time if args.cpu and threads == 1 else time.perf_counter
            times = measure(contenders(n, dtname, threads), max(args.reps, 9), clock)
            load = os.getloadavg()[0]
            ref = statistics.median(times["torch"])
            for k, ts in times.items():
                med = statistics.median(ts)
                print(f"| {dtname} {n}² | {threads} | {k} | {med * 1e3:.2f} | {min(ts) * 1e3:.2f} | "
                      f"{2 * n ** 3 / med / 1e9:.0f} | {ref / med:.2f} | {load:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
