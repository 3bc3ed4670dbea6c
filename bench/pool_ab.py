"""A/B of two lazycandle trees on the work the Python pool used to run (issue 38 item 3, one
pool): BLAS-backend GEMMs (one GEMM, a batch of small ones, a bf16 one through the operand
copies) at 1 and 2 threads, sort / argsort / cumsum rows, the per-kernel path
(LAZYCANDLE_EXEC=python) and slice_set_.  Two module versions cannot share a process, so each
round runs one child per tree, alternating A, B, A, B...; a child times every case (median of
`--reps` calls after a warm-up, cases rotating) in wall time and in the process's CPU time.
Printed: per case the median over rounds of each tree's medians, in microseconds, with the
load average.  On a loaded 2-CPU machine the CPU time is the steadier figure: wall time there
mostly says how often the process had a core.

    python bench/pool_ab.py --a /tmp/pool-base --b /work/wt-pool [--rounds 9] [--reps 9]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, sys, time, statistics
import numpy as np
import lazycandle as lc
reps = int(sys.argv[1])
rng = np.random.default_rng(0)
cases = {}

def blas_mm(shape_a, shape_b, dt, threads):
    a = lc.tensor(rng.standard_normal(shape_a).astype(np.float32)).astype(dt)
    b = lc.tensor(rng.standard_normal(shape_b).astype(np.float32)).astype(dt)
    lc.realize(a, b)
    def run():
        lc.set_matmul_backend("blas")
        with lc.num_threads(threads):
            (a @ b).realize()
    return run

for t in (1, 2):
    cases[f"blas f32 256^2 t{t}"] = blas_mm((256, 256), (256, 256), lc.f32, t)
    cases[f"blas f32 1024^2 t{t}"] = blas_mm((1024, 1024), (1024, 1024), lc.f32, t)
    cases[f"blas f32 batch 64x(48,64)@(64,48) t{t}"] = blas_mm((64, 48, 64), (64, 64, 48), lc.f32, t)
    cases[f"blas bf16 256^2 t{t}"] = blas_mm((256, 256), (256, 256), lc.bf16, t)
x = lc.tensor(rng.standard_normal((4096, 1024)).astype(np.float32)).realize()
xs = lc.tensor(rng.standard_normal((64, 256)).astype(np.float32)).realize()
def sort_big():
    with lc.num_threads(2):
        v, i = x.sort_last_dim(); lc.realize(v, i)
def sort_small():
    with lc.num_threads(2):
        v, i = xs.sort_last_dim(); lc.realize(v, i)
def cumsum_big():
    with lc.num_threads(2):
        x.cumsum(-1).realize()
cases["sort (4096,1024) t2"] = sort_big
cases["sort (64,256) t2"] = sort_small
cases["cumsum (4096,1024) t2"] = cumsum_big
x16 = lc.tensor(np.arange(16, dtype=np.float32)).realize()
xm = lc.tensor(rng.standard_normal((1024, 1024)).astype(np.float32)).realize()
def py_small():
    os.environ["LAZYCANDLE_EXEC"] = "python"
    try:
        ((x16 * 2.0) + 1.0).realize()
    finally:
        del os.environ["LAZYCANDLE_EXEC"]
def py_big():
    os.environ["LAZYCANDLE_EXEC"] = "python"
    try:
        with lc.num_threads(2):
            (xm * 2.0).exp().sum(-1).realize()
    finally:
        del os.environ["LAZYCANDLE_EXEC"]
cases["python exec 16 floats t1"] = py_small
cases["python exec (1024,1024) exp-sum t2"] = py_big
buf = lc.zeros((8, 512, 64)).realize()
row = lc.ones((8, 1, 64)).realize()
def sset():
    buf.slice_set_(row, 1, 7)
cases["slice_set_ (8,1,64) into (8,512,64)"] = sset
for f in cases.values():
    f(); f()
times = {k: [] for k in cases}
cpu = {k: [] for k in cases}
for _ in range(reps):
    for k, f in cases.items():
        t0, c0 = time.perf_counter(), time.process_time()
        f()
        times[k].append(time.perf_counter() - t0)
        cpu[k].append(time.process_time() - c0)
print(json.dumps({k: (statistics.median(times[k]) * 1e6, statistics.median(cpu[k]) * 1e6) for k in cases}))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args(argv)
    got = {"a": [], "b": []}
    loads = []
    for r in range(args.rounds):
        for side in (("a", "b") if r % 2 == 0 else ("b", "a")):      # neither always runs first
            env = dict(os.environ, PYTHONPATH=getattr(args, side))
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.reps)], env=env, capture_output=True,
                                 text=True, check=True, cwd="/tmp")
            got[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            loads.append(os.getloadavg()[0])
    print(f"load {min(loads):.2f}-{max(loads):.2f}; A = {args.a}, B = {args.b}; "
          f"median over {args.rounds} rounds of per-child medians ({args.reps} calls)")
    print("wall: elapsed time; cpu: the process's CPU time over all its threads (the work done,"
          " steadier than wall time when other processes share the cores)")
    print(f"{'case':44s} {'A wall':>9s} {'B wall':>9s} {'B/A':>5s} {'A cpu':>9s} {'B cpu':>9s} {'B/A':>5s}")
    for k in got["a"][0]:
        aw, ac, bw, bc = [statistics.median(r[k][i] for r in got[side]) for side in ("a", "b") for i in (0, 1)]
        print(f"{k:44s} {aw:9.1f} {bw:9.1f} {bw / aw:5.2f} {ac:9.1f} {bc:9.1f} {bc / max(ac, 1e-9):5.2f}")


if __name__ == "__main__":
    main()
