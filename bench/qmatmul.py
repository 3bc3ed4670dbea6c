"""qmatmul (GGML block formats, codegen/qmatmul.py) against lc.matmul in f32 and bf16 on the same
shapes: decode (1, 4096) x (4096, 4096)^T and a prompt tile (32, 4096) x (11008, 4096)^T.

    python bench/qmatmul.py [--repeats 9] [--threads 2] [--paths int8,f32] [--shapes 1x4096x4096,...]
                            [--decode-layers 4] [--kernels]

GFLOP/s counts 2*m*n*k; GB/s counts the weight bytes (blocks, or the dense matrix) read once per
call.  The dense weights are (out, in) like Linear's, multiplied as x @ w.T.  Each qmatmul path is timed with the path forced (lc.qtensor.set_qmatmul_path); "auto" is
the default choice.  Implementations alternate inside one loop (bench/timing.py); medians.

--decode-layers L: a decode-step proxy of a ~1B Llama (hidden 2048, GQA 32/8 heads of 64, FFN
8192): one token through L layers' linear maps only (q k v o, SiLU-gated MLP; no attention, no
norms), f32 / bf16 lc.matmul vs q8_0 / q4_0 qmatmul, reported per token scaled to 16 layers.

--kernels: the qmatmul kernels alone on one thread (no graph, no pool), int8 vs f32 path, min and
median of 15 alternating calls: the figure least disturbed by a loaded machine."""
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
    xb, wb = x.to_dtype(lc.bf16).realize(), w.to_dtype(lc.bf16).realize()
    # the weight in Linear's (out, in) layout, multiplied through its transposed view (x @ w.T)
    fns = {"f32 matmul": lambda: (x @ w.T).realize(), "bf16 matmul": lambda: (xb @ wb.T).realize()}
    sizes = {"f32 matmul": n * k * 4, "bf16 matmul": n * k * 2}
    setup = {}
    for kind in KINDS:
        q = lc.quantize(w, kind)
        for p in paths:
            name = f"{kind} {p}"
            fns[name] = (lambda q=q: lc.qmatmul(x, q).realize())
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


def bench_decode(layers, repeats):
    rng = np.random.default_rng(1)
    H, KV, F = 2048, 512, 8192
    shapes = {"q": (H, H), "k": (KV, H), "v": (KV, H), "o": (H, H), "gate": (F, H), "up": (F, H), "down": (H, F)}
    dense = [{k: (rng.standard_normal(s) * 0.02).astype(np.float32) for k, s in shapes.items()} for _ in range(layers)]
    x = lc.tensor(rng.standard_normal((1, H)).astype(np.float32))
    fns, nbytes = {}, {}
    for fmt in ("f32", "bf16", "q8_0", "q4_0"):
        if fmt in ("f32", "bf16"):
            dt = lc.f32 if fmt == "f32" else lc.bf16
            ws = [{k: lc.tensor(w).to_dtype(dt).realize() for k, w in layer.items()} for layer in dense]
            mm = (lambda a, w, dt=dt: (a.to_dtype(dt) @ w.T).to_dtype(lc.f32))
            nbytes[fmt] = sum(w.numpy().nbytes for layer in ws for w in layer.values())
        else:
            ws = [{k: lc.quantize(lc.tensor(w), fmt) for k, w in layer.items()} for layer in dense]
            mm = lc.qmatmul
            nbytes[fmt] = sum(w.nbytes for layer in ws for w in layer.values())

        def step(ws=ws, mm=mm):
            h = x
            for L in ws:
                a = mm(h, L["q"]) + mm(h, L["k"]).sum() + mm(h, L["v"]).sum()      # every projection read
                h = h + mm(a, L["o"])
                h = h + mm(lc.silu(mm(h, L["gate"])) * mm(h, L["up"]), L["down"])
                h = h.realize()
            return h
        fns[fmt] = step
    stats = time_alternating(fns, repeats=repeats)
    print(f"\ndecode-step proxy: {layers} layers of linear maps (hidden 2048, kv 512, ffn 8192), x (1, 2048)")
    print(f"{'':8s} {'ms/token (16 layers)':>22s} {'weight GB/s':>12s}")
    for name, st in stats.items():
        t = st.median
        print(f"{name:8s} {t * 1e3 * 16 / layers:22.2f} {nbytes[name] / t / 1e9:12.1f}")


def bench_kernels(shapes):
    from lazycandle.codegen import qmatmul as QM
    from lazycandle.runtime import qsteps
    rng = np.random.default_rng(2)
    lc.set_num_threads(1)
    for m, n, k in shapes:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = lc.tensor((rng.standard_normal((n, k)) * 0.02).astype(np.float32))
        print(f"\nkernels only, 1 thread: ({m}, {k}) x ({n}, {k})^T   min / median ms, weight GB/s at the min")
        mt = 1 if m == 1 else 4
        for kind in KINDS:
            q = lc.quantize(w, kind)
            blocks = np.empty(QM.act_bytes(m, k), np.uint8)
            out = np.empty(m * n, np.float32)
            act, fi = QM.act_kernel()[1], QM.kernel(kind, "int8", "avx2", mt, 1)[1]
            ff = QM.kernel(kind, "f32", "none", mt, 1)[1]
            calls = {"int8": lambda: (qsteps.run(act, [blocks, x], (k, m), m, 1.0),
                                      qsteps.run(fi, [out, q.buffer(), blocks], (m, n, k), n, 1.0)),
                     "f32": lambda: qsteps.run(ff, [out, q.buffer(), x], (m, n, k), n, 1.0)}
            st = time_alternating(calls, repeats=15)
            print(f"  {kind}: " + "   ".join(f"{p} {v.min * 1e3:.3f} / {v.median * 1e3:.3f} ({q.nbytes / v.min / 1e9:.1f} GB/s)"
                                           for p, v in st.items()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--paths", default="auto,int8,f32")
    ap.add_argument("--shapes", default="1x4096x4096,32x11008x4096", help="m x n x k (weight n x k)")
    ap.add_argument("--decode-layers", type=int, default=4, help="0: skip the decode-step proxy")
    ap.add_argument("--kernels", action="store_true", help="also time the kernels alone on one thread")
    a = ap.parse_args(argv)
    lc.set_num_threads(a.threads)
    load = os.getloadavg()
    print(f"cpu: {_cpu()}; threads: {a.threads}; load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for s in a.shapes.split(","):
        m, n, k = (int(v) for v in s.split("x"))
        bench_shape(m, n, k, a.paths.split(","), a.repeats)
    if a.decode_layers:
        bench_decode(a.decode_layers, a.repeats)
    if a.kernels:
        bench_kernels([tuple(int(v) for v in sh.split("x")) for sh in a.shapes.split(",")])


if __name__ == "__main__":
    main()
