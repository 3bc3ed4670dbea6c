"""qmatmul (GGML block formats, codegen/qmatmul.py) against lc.matmul in f32 and bf16 on the same
shapes: decode (1, 4096) x (4096, 4096)^T and a prompt tile (32, 4096) x (11008, 4096)^T.

    python bench/qmatmul.py [--repeats 9] [--threads 2] [--paths int8,f32] [--shapes 1x4096x4096,...]

GFLOP/s counts 2*m*n*k; GB/s counts the weight bytes (blocks, or the dense matrix) read once per
call.  Each qmatmul path is timed with the path forced (lc.qtensor.set_qmatmul_path); "auto" is
the default choice.  Implementations alternate inside one loop (bench/timing.py); medians."""
from __future__ import annotations

import argparse
import os
import platform
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import lazycandle as lc  # noqa: E402
from bench.timing import time_alternating  # noqa: E402
from lazycandle import qtensor as Q  # noqa: E402

KINDS = ("q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k")


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def bench_shape(m, n, k, paths, repeats):
    rng = np.random.default_rng(0)
    x = lc.tensor(rng.standard_normal((m, k)).astype(np.float32))
    w = lc.tensor((rng.standard_normal((n, k)) * 0.02).astype(np.float32))
    wt = w.T.contiguous().realize()
    xb, wtb = x.to_dtype(lc.bf16).realize(), wt.to_dtype(lc.bf16).realize()
    fns = {"f32 matmul": lambda: (x @ wt).realize(), "bf16 matmul": lambda: (xb @ wtb).realize()}
    sizes = {"f32 matmul": n * k * 4, "bf16 matmul": n * k * 2}
    setup = {}
    for kind in KINDS:
        q = lc.quantize(w, kind)
        for p in paths:
            name = f"{kind} {p}"
            fns[name] = (lambda q=q: lc.qmatmul(x, q))
            setup[name] = (lambda p=p: Q.set_qmatmul_path(p))
            sizes[name] = q.nbytes
    stats = time_alternating(fns, repeats=repeats, setup=setup)
    Q.set_qmatmul_path("auto")
    flops = 2.0 * m * n * k
    print(f"\n({m}, {k}) x ({n}, {k})^T")
    print(f"{'':18s} {'ms':>9s} {'GFLOP/s':>9s} {'weight GB/s':>12s}")
    for name, st in stats.items():
        t = st.median
        print(f"{name:18s} {t * 1e3:9.3f} {flops / t / 1e9:9.1f} {sizes[name] / t / 1e9:12.1f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--paths", default="auto,int8,f32,gemm")
    ap.add_argument("--shapes", default="1x4096x4096,32x11008x4096", help="m x n x k (weight n x k)")
    a = ap.parse_args(argv)
    lc.set_num_threads(a.threads)
    load = os.getloadavg()
    print(f"cpu: {_cpu()}; threads: {a.threads}; load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for s in a.shapes.split(","):
        m, n, k = (int(v) for v in s.split("x"))
        bench_shape(m, n, k, a.paths.split(","), a.repeats)


if __name__ == "__main__":
    main()
