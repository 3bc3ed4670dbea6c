"""Small-m matmul (codegen/gemm_skinny.py) against NumPy, torch and lazycandle's other two
matmul paths, on the transformer shapes: x (m, k) @ w.T with w (n, k) row-major (nn.linear's
layout) and x @ w with w (k, n), for m in {1, 8, 32, 128}.

    PYTHONPATH=/work/peers python -m bench.skinny_gemm [--threads 1,2] [--repeats 15] [--mb 256] [--dtype bf16]
    python -m bench.skinny_gemm --gpt2        # the GPT-2 block: native / python, before / after

Per case: median ms (all implementations rotate in one loop, with "stream": bench/bandwidth.py's
read-only stream kernel over the weight itself, so the weight's bytes per second of "skinny" is
given as a % of what a pure read of the same bytes reaches in the same loop, cache state and
load; the weights, 2-9 MB, stay in the last-level cache in a loop like this).  The peak of a
--mb MiB array (256: DRAM) is printed first.  "skinny" is the kernel forced at every m; "lc" is
a compiled program under the auto backend.  --dtype bf16: NumPy is the user's way (an f32 product
of the bf16 operands), torch runs its own bf16 kernels."""
from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import lazycandle as lc
from bench import bandwidth, peers
from bench.timing import time_alternating
from lazycandle.dtype import DType
from lazycandle.layout import Layout
from lazycandle.runtime import matmul as MM
from lazycandle.runtime import matmul_skinny as SK

SHAPES = ((768, 768), (768, 2304), (768, 3072), (3072, 768))      # (k, n)
ROWS = (1, 8, 32, 128)


def _plans(x, w, form, threads, dtype):
    """{name: zero-argument call} of lazycandle's three matmul plans on x and w's storage."""
    m, k = x.shape
    n = w.shape[0] if form == "t" else w.shape[1]
    la = Layout((m, k), (k, 1))
    lb = Layout((k, n), (1, k)) if form == "t" else Layout((k, n), (n, 1))
    g = MM.geometry(la, lb, dtype)
    out = np.empty((m, n), dtype.numpy)
    addrs = (x.ctypes.data, w.ctypes.data, out.ctypes.data)
    plans = {"skinny": SK.SkinnyPlan(g, threads), "blas": MM.BlasPlan(g, threads), "tiled": MM.TiledPlan(g, threads)}
    return {name: (lambda p=p: p.run(*addrs) or out) for name, p in plans.items()}    # (keeps out alive)


def case(m, k, n, form, threads, mods, repeats, dtype):
    rng = np.random.default_rng(0)
    npdt = dtype.numpy
    x = rng.standard_normal((m, k)).astype(npdt)
    w = rng.standard_normal((n, k) if form == "t" else (k, n)).astype(npdt)
    xp = lc.placeholder("x", x.shape, dtype)
    wp = lc.placeholder("w", w.shape, dtype)
    prog = lc.compile([xp @ wp.T if form == "t" else xp @ wp])
    fns = {"lc": lambda: prog.run(x=x, w=w)}
    fns.update(_plans(x, w, form, threads, dtype))
    stream, units = bandwidth.Stream(), np.empty(w.nbytes // 4 // bandwidth.BLOCK, np.int32)
    fns["stream"] = lambda: stream.run(w.reshape(-1).view(np.float32), units, threads)
    x32, w32 = x.astype(np.float32), w.astype(np.float32)        # bf16: the NumPy user's f32 product
    fns["numpy"] = (lambda: (x32 @ w32.T).astype(npdt)) if form == "t" else (lambda: (x32 @ w32).astype(npdt))
    if "torch" in mods:
        torch = mods["torch"]
        tx, tw = (torch.from_numpy(a) if npdt == np.float32 else torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
                  for a in (x, w))
        fns["torch"] = (lambda: tx @ tw.T) if form == "t" else (lambda: tx @ tw)
    ref = x.astype(np.float64) @ (w.T if form == "t" else w).astype(np.float64)
    got = prog.run(x=x, w=w)[0].astype(np.float64)
    tol = 1e-4 * np.sqrt(k) if npdt == np.float32 else 2 ** -7
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max(), "wrong result"
    return time_alternating(fns, repeats=repeats, warmup=2), w.nbytes


GPT2_MODES = {              # name: (LAZYCANDLE_EXEC, matmul backend)
    "native": ("native", "auto"), "python": ("python", "auto"),
    "python+blas": ("python", "blas"), "python+tiled": ("python", "tiled")}


def gpt2_block(seq, threads, repeats):
    """bench/dispatch.py's GPT-2 block program on (1, seq, 768): the native program and the
    per-kernel path under auto (both with the small-m kernel), and the per-kernel path with the
    BLAS or tiled matmul (what auto chose before the small-m kernel), in one loop."""
    from bench import gpt2_block as G
    prog, feeds = G.block_program(seq)

    def mode(exec_mode, backend):
        def run():
            os.environ["LAZYCANDLE_EXEC"] = exec_mode
            lc.set_matmul_backend(backend)
            return prog.run(**feeds)
        return run
    old = lc.get_matmul_backend()
    try:
        with lc.num_threads(threads):
            fns = {name: mode(*m) for name, m in GPT2_MODES.items()}
            ref = fns["python+blas"]()[0]
            np.testing.assert_allclose(fns["native"]()[0], ref, rtol=1e-4, atol=1e-4)
            st = time_alternating(fns, repeats=repeats, warmup=2)
    finally:
        lc.set_matmul_backend(old)
    base = min(st["python+blas"].median, st["python+tiled"].median)
    print(f"  GPT-2 block (1, {seq}, 768), {threads} thread(s): "
          + "  ".join(f"{name} {s.median * 1e3:6.2f} ms" for name, s in st.items())
          + f"  | native vs best python+blas/tiled {base / st['native'].median:.2f}x", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--mb", type=int, default=256, help="array size of the bandwidth peak, MiB")
    ap.add_argument("--forms", default="t,n")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--gpt2", action="store_true", help="only the GPT-2 block figures")
    ap.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    a = ap.parse_args(argv)
    mods, _ = peers.load_peers(("torch",))
    threads = [int(t) for t in a.threads.split(",")]
    if a.gpt2:
        print(f"load average {os.getloadavg()[0]:.2f}")
        for seq in (8, 128):
            for t in threads:
                gpt2_block(seq, t, a.repeats)
        print(f"load average {os.getloadavg()[0]:.2f}")
        return 0
    if a.mb:
        peak = bandwidth.measure(a.mb, tuple(threads), reps=9)
        print(f"read peak ({a.mb} MiB): " + ", ".join(f"{t} thr {peak[t]['read']:.1f} GB/s" for t in threads))
    print(f"load average {os.getloadavg()[0]:.2f}")
    for t in threads:
        with peers.threads(t, mods):
            for form in a.forms.split(","):
                print(f"\n{t} thread(s), x @ {'w.T, w (n, k)' if form == 't' else 'w, w (k, n)'}: median ms "
                      f"(skinny: GB/s of w, % of the stream read of w)")
                for k, n in SHAPES:
                    for m in [int(r) for r in a.rows.split(",")]:
                        st, nbytes = case(m, k, n, form, t, mods, a.repeats, DType.from_name(a.dtype))
                        sk = st["skinny"].median
                        best_peer = min(st[p].median for p in ("numpy", "torch") if p in st)
                        cells = "  ".join(f"{name} {s.median * 1e3:7.3f}" for name, s in st.items())
                        gbs = nbytes / sk / 1e9
                        print(f"  m={m:4d} k={k:4d} n={n:4d}  {cells}  | skinny {gbs:5.1f} GB/s "
                              f"{100 * st['stream'].median / sk:3.0f}% of stream  "
                              f"lc/best peer {best_peer / st['lc'].median:4.2f}x", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
