"""Matmul benchmark: lazycandle's kernels (runtime.matmul on raw storage, as the executor calls
them) against NumPy in the same process.  Median of >= 9 runs after a warm-up.

    python bench/bench_matmul.py [--quick] [--threads N]
    from bench.bench_matmul import run; rows = run(quick=True)

Peer table (issue 10 item 6): the shapes a transformer runs, lazycandle through the Tensor API
(`(a @ b).numpy()`, plan cache warm) and on raw storage per backend, against NumPy and torch,
one process per thread count (NumPy's OpenBLAS reads OPENBLAS_NUM_THREADS at start):

    PYTHONPATH=/work/peers python -m bench.bench_matmul --peers --threads 1

Tile / blocking A/B at 1 thread on the calling thread's CPU time (steadier than wall time when
other processes share the cores), against NumPy and torch; a variant is MR,NV,KC,MC,NC with 0
for the host's default (e.g. the pre-AVX-512-tuning 6,4,128,318,8192 against 14,2,0,0,0):

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=/work/peers python -m bench.bench_matmul --ab 1024 6,4,128,318,8192 14,2,0,0,0

Per-call split of f32 n^2 at 1 thread (calling thread's CPU time and wall time, rotating): the
tiled kernel alone (parameter block ready), the tiled and BLAS plans (runtime.matmul), the
Tensor API `(a @ b).numpy()` (auto, and tiled), the same API on 16 x 16 (its fixed cost), NumPy
and torch:

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=/work/peers python -m bench.bench_matmul --split 256
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import math
import os
import statistics
import sys
import time

import numpy as np

from lazycandle import config
from lazycandle import dtype as D
from lazycandle.layout import Layout
from lazycandle.runtime import blas
from lazycandle.runtime.matmul import matmul


def numpy_blas_info() -> dict:
    """Core type NumPy's own OpenBLAS picked (threadpoolctl when installed, else ctypes)."""
    try:
        from threadpoolctl import threadpool_info
        for lib in threadpool_info():
            if lib.get("internal_api") == "openblas":
                return {"library": lib.get("filepath"), "corename": lib.get("architecture"),
                        "threads": lib.get("num_threads")}
    except ImportError:
        pass
    libdir = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in glob.glob(os.path.join(libdir, "*openblas*.so*")):
        lib = ctypes.CDLL(path)
        for sym in ("scipy_openblas_get_corename64_", "openblas_get_corename64_", "openblas_get_corename"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return {"library": os.path.basename(path), "corename": fn().decode()}
    return {"library": None, "corename": None}


def environment() -> dict:
    return {"OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
            "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
            "lazycandle_blas": blas.info(), "numpy_blas": numpy_blas_info(),
            "threads": config.get_num_threads(), "loadavg": os.getloadavg()}


SETTLE_S = 0.15    # NumPy's OpenBLAS worker threads spin ~0.1 s after a call: let them stop
WARM_S = 0.03      # then run the next side for this long untimed: an idle vCPU comes back slow


def _warm(fn) -> None:
    t0 = time.perf_counter()
    fn()
    while time.perf_counter() - t0 < WARM_S:
        fn()


def _median_ms_pair(fa, fb, reps: int, rounds: int = 8) -> tuple:
    """(median a, median b, min a, min b) in ms: fa and fb each timed in blocks of reps/rounds
    calls, blocks alternating, each block after a pause and an untimed warm-up.  Not
    call-by-call interleaving: NumPy's OpenBLAS threads keep spinning on the cores for a while
    after each call, which would slow down whatever runs next."""
    ta, tb = [], []
    per = max(1, -(-reps // rounds))
    for _ in range(rounds):
        for fn, acc in ((fa, ta), (fb, tb)):
            time.sleep(SETTLE_S)
            _warm(fn)
            for _ in range(per):
                t0 = time.perf_counter()
                fn()
                acc.append(time.perf_counter() - t0)
    return (statistics.median(ta) * 1e3, statistics.median(tb) * 1e3, min(ta) * 1e3, min(tb) * 1e3)


def _storage(x: np.ndarray, batch_broadcast: tuple = ()):
    """Flat buffer and Layout of a contiguous array, optionally broadcast to a leading batch."""
    lay = Layout.contiguous(x.shape)
    if batch_broadcast:
        lay = lay.broadcast_as(batch_broadcast + x.shape)
    return x.reshape(-1), lay


CASES = [
    # name, dtype, a shape, b shape, backend, target (ratio to numpy or GFLOP/s)
    ("f32 1024 blas", D.f32, (1024, 1024), (1024, 1024), "blas", ("ratio", 0.95)),
    ("f32 2048 blas", D.f32, (2048, 2048), (2048, 2048), "blas", ("ratio", 0.95)),
    ("f32 1024 tiled", D.f32, (1024, 1024), (1024, 1024), "tiled", ("ratio", 0.85)),
    ("f32 2048 tiled", D.f32, (2048, 2048), (2048, 2048), "tiled", None),
    ("f32 1024 auto", D.f32, (1024, 1024), (1024, 1024), "auto", None),
    ("f16 1024 auto", D.f16, (1024, 1024), (1024, 1024), "auto", ("gflops", 200)),
    ("f16 1024 tiled", D.f16, (1024, 1024), (1024, 1024), "tiled", None),
    ("f16 1024 blas", D.f16, (1024, 1024), (1024, 1024), "blas", None),
    ("bf16 1024 auto", D.bf16, (1024, 1024), (1024, 1024), "auto", ("gflops", 200)),
    ("bf16 1024 blas", D.bf16, (1024, 1024), (1024, 1024), "blas", None),
    ("f64 1024 auto", D.f64, (1024, 1024), (1024, 1024), "auto", None),
    ("i32 512 tiled", D.i32, (512, 512), (512, 512), "tiled", None),
    ("bmm 16x256^3 auto", D.f32, (16, 256, 256), (16, 256, 256), "auto", ("ratio", 1.2)),
    ("bmm 16x256^3 blas", D.f32, (16, 256, 256), (16, 256, 256), "blas", None),
    ("bmm 16x256^3 tiled", D.f32, (16, 256, 256), (16, 256, 256), "tiled", None),
    ("bcast-lhs 256^2@16x256^2 auto", D.f32, (256, 256), (16, 256, 256), "auto", ("ratio", 1.2)),
    ("bmm 256x32^3 auto", D.f32, (256, 32, 32), (256, 32, 32), "auto", None),
    ("f32 64 auto", D.f32, (64, 64), (64, 64), "auto", None),
]
QUICK = {"f32 1024 blas", "f32 1024 tiled", "f16 1024 auto", "bf16 1024 auto", "bmm 16x256^3 auto",
         "bcast-lhs 256^2@16x256^2 auto"}


def run(quick: bool = False, threads: int | None = 2, reps: int | None = None) -> list:
    """Benchmark rows: name, backend used, lazycandle ms, numpy ms, ratio (numpy / ours),
    GFLOP/s, and the target when there is one."""
    reps = reps or (10 if quick else 16)
    old = config.get_num_threads()
    if threads:
        config.set_num_threads(threads)
    rng = np.random.default_rng(0)
    rows = []
    try:
        for name, dt, a_shape, b_shape, backend, target in CASES:
            if quick and name not in QUICK:
                continue
            a = rng.standard_normal(a_shape).astype(dt.numpy) if dt.is_float else \
                rng.integers(-100, 100, a_shape).astype(dt.numpy)
            b = rng.standard_normal(b_shape).astype(dt.numpy) if dt.is_float else \
                rng.integers(-100, 100, b_shape).astype(dt.numpy)
            batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
            abuf, alay = _storage(a, batch if len(a_shape) - 2 < len(batch) else ())
            bbuf, blay = _storage(b, batch if len(b_shape) - 2 < len(batch) else ())
            out = np.empty(batch + (a_shape[-2], b_shape[-1]), dt.numpy)
            used = matmul(abuf, alay, bbuf, blay, out, dt, backend)
            # NumPy in the same dtype where it has a BLAS (f32/f64), else its f32 matmul
            na, nb_ = (a, b) if dt in (D.f32, D.f64) else (a.astype(np.float32), b.astype(np.float32))
            nout = np.empty(out.shape, na.dtype)
            ours, theirs, ours_min, theirs_min = _median_ms_pair(
                lambda: matmul(abuf, alay, bbuf, blay, out, dt, backend), lambda: np.matmul(na, nb_, out=nout), reps)
            flops = 2.0 * math.prod(out.shape) * a_shape[-1]
            row = {"name": name, "dtype": dt.name, "backend": used, "ms": round(ours, 3),
                   "numpy_ms": round(theirs, 3), "numpy_dtype": str(na.dtype),
                   "ratio": round(theirs / ours, 3), "gflops": round(flops / ours / 1e6, 1),
                   "ms_min": round(ours_min, 3), "numpy_ms_min": round(theirs_min, 3),
                   "ratio_of_mins": round(theirs_min / ours_min, 3)}
            if target:
                kind, value = target
                row["target"] = f"{kind} >= {value}"
                row["met"] = (row["ratio"] if kind == "ratio" else row["gflops"]) >= value
            rows.append(row)
    finally:
        config.set_num_threads(old)
    return rows


PEER_SHAPES = [
    # name, a shape, b shape (f32)
    ("256^2", (256, 256), (256, 256)),
    ("1024^2", (1024, 1024), (1024, 1024)),
    ("2048^2", (2048, 2048), (2048, 2048)),
    ("128x768 @ 768x768", (128, 768), (768, 768)),
    ("128x768 @ 768x3072", (128, 768), (768, 3072)),
    ("decode 1x768 @ 768x768", (1, 768), (768, 768)),
    ("bmm 12x128x64 @ 12x64x128", (12, 128, 64), (12, 64, 128)),
]


def run_peers(threads: int, repeats: int = 15, backends=("auto", "blas", "tiled")) -> list:
    """Rows of median ms per implementation for PEER_SHAPES at `threads` (NumPy's BLAS threads
    are whatever OPENBLAS_NUM_THREADS said at start).  Every implementation of a shape is timed
    in one rotating loop (bench/timing.py)."""
    import lazycandle as lc
    from bench.timing import time_alternating
    try:
        import torch
        torch.set_num_threads(threads)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    rows = []
    with lc.num_threads(threads):
        for name, sa, sb in PEER_SHAPES:
            a = rng.standard_normal(sa).astype(np.float32)
            b = rng.standard_normal(sb).astype(np.float32)
            ta, tb = lc.tensor(a).realize(), lc.tensor(b).realize()
            out = np.empty(np.broadcast_shapes(sa[:-2], sb[:-2]) + (sa[-2], sb[-1]), np.float32)
            (abuf, alay), (bbuf, blay) = _storage(a), _storage(b)
            fns = {"lc api": lambda: (ta @ tb).numpy()}
            for be in backends:
                fns[f"lc {be}"] = (lambda be=be: matmul(abuf, alay, bbuf, blay, out, D.f32, be))
            fns["numpy"] = lambda: np.matmul(a, b)
            if torch is not None:
                xa, xb = torch.from_numpy(a), torch.from_numpy(b)

                def tfn():
                    with torch.inference_mode():
                        return torch.matmul(xa, xb)
                fns["torch"] = tfn
            used = {be: matmul(abuf, alay, bbuf, blay, out, D.f32, be) for be in ("auto",)}
            stats = time_alternating(fns, repeats=repeats, warmup=2)
            row = {"name": name, "threads": threads, "auto": used["auto"],
                   "ms": {k: round(v.median * 1e3, 4) for k, v in stats.items()}}
            peers = [v for k, v in row["ms"].items() if not k.startswith("lc")]
            row["best_peer_ms"] = min(peers)
            row["ratio_api"] = round(min(peers) / row["ms"]["lc api"], 3)
            rows.append(row)
    return rows


EPILOGUE_SHAPES = [("(128x768 @ 768x3072 + b).gelu()", 128, 768, 3072),
                   ("(256^2 @ 256^2 + b).relu()", 256, 256, 256)]


def run_epilogue(threads: int, repeats: int = 15) -> list:
    """Bias + activation after a matmul through the Tensor API: lazycandle per backend (tiled
    applies the epilogue in the GEMM's store, BLAS runs it as a second pass), NumPy, torch."""
    import lazycandle as lc
    from bench.timing import time_alternating
    try:
        import torch
        torch.set_num_threads(threads)
    except ImportError:
        torch = None
    rng = np.random.default_rng(1)
    rows = []
    with lc.num_threads(threads):
        for name, m, k, n in EPILOGUE_SHAPES:
            x = rng.standard_normal((m, k)).astype(np.float32)
            w = (rng.standard_normal((k, n)) * k ** -0.5).astype(np.float32)
            bias = rng.standard_normal(n).astype(np.float32)
            gelu = "gelu" in name
            tx, tw, tb = (lc.tensor(v).realize() for v in (x, w, bias))

            def lc_fn(be):
                def run():
                    with _backend(lc, be):
                        h = tx @ tw + tb
                        return (h.gelu() if gelu else h.relu()).numpy()
                return run
            fns = {f"lc {be}": lc_fn(be) for be in ("auto", "tiled", "blas")}

            def np_fn():
                h = x @ w + bias
                return 0.5 * h * (1 + np.tanh(0.7978845608 * (h + 0.044715 * h ** 3))) if gelu else np.maximum(h, 0)
            fns["numpy"] = np_fn
            if torch is not None:
                xx, ww, bb = (torch.from_numpy(v) for v in (x, w, bias))

                def tfn():
                    with torch.inference_mode():
                        h = torch.addmm(bb, xx, ww)
                        return torch.nn.functional.gelu(h, approximate="tanh") if gelu else torch.relu(h)
                fns["torch"] = tfn
            stats = time_alternating(fns, repeats=repeats, warmup=2)
            row = {"name": name, "threads": threads, "auto": "-",
                   "ms": {k2: round(v.median * 1e3, 4) for k2, v in stats.items()}}
            peers = [v for k2, v in row["ms"].items() if not k2.startswith("lc")]
            row["best_peer_ms"] = min(peers)
            row["ratio_api"] = round(min(peers) / row["ms"]["lc auto"], 3)
            rows.append(row)
    return rows


def _add_torch_mm(fns, a, b) -> None:
    """fns["torch"]: torch.mm of a @ b into a preallocated output at 1 thread, when torch is installed."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)
    ta, tb, to = torch.from_numpy(a), torch.from_numpy(b), torch.empty(a.shape[0], b.shape[1])
    fns["torch"] = lambda: torch.mm(ta, tb, out=to)


def run_ab(n: int, variants, rounds: int = 21) -> list:
    """Rows (name, CPU-time median / min ms, GFLOP/s, x best peer) of tiled f32 n^3 plans built
    with each MR,NV,KC,MC,NC variant, and NumPy / torch, at 1 thread, rotating."""
    from lazycandle.codegen import gemm
    from lazycandle.runtime import matmul as M
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    out = np.empty((n, n), np.float32)
    g = M.geometry(Layout.contiguous((n, n)), Layout.contiguous((n, n)), D.f32)
    fns = {"numpy": lambda: np.matmul(a, b, out=out)}
    _add_torch_mm(fns, a, b)
    real_blocking, saved = M._blocking, dict(M._tile_kernels)
    old = config.get_num_threads()
    config.set_num_threads(1)
    try:
        for v in variants:
            mr, nv, kc, mc, nc = (int(x) for x in v.split(","))
            spec = gemm.GemmSpec(D.f32, mr, nv, gemm.choose_tile(D.f32)[2])
            M._tile_kernels["f32"] = (spec, gemm.get_kernel(spec), 4, False)
            M._blocking = lambda sp, ab, k, want=(mc, kc, nc): tuple(
                x or d for x, d in zip(want, real_blocking(sp, ab, k)))
            plan = M.TiledPlan(g, 1)
            fns[v] = lambda plan=plan: plan.run(a.ctypes.data, b.ctypes.data, out.ctypes.data)
        M._blocking = real_blocking
        M._tile_kernels.clear()
        M._tile_kernels.update(saved)
        reps = max(1, int(1e8 / n ** 3))
        cpu = {k: [] for k in fns}
        for _ in range(rounds):
            for k, fn in fns.items():
                fn()
                t0 = time.thread_time()
                for _ in range(reps):
                    fn()
                cpu[k].append((time.thread_time() - t0) / reps)
    finally:
        M._blocking = real_blocking
        M._tile_kernels.clear()
        M._tile_kernels.update(saved)
        config.set_num_threads(old)
    peer = min(statistics.median(cpu[k]) for k in ("numpy", "torch") if k in cpu)
    return [{"name": k, "cpu_ms": round(statistics.median(v) * 1e3, 3), "cpu_min_ms": round(min(v) * 1e3, 3),
             "gflops": round(2.0 * n ** 3 / statistics.median(v) / 1e9, 1),
             "x_best_peer": round(peer / statistics.median(v), 3)} for k, v in cpu.items()]


def run_split(n: int, rounds: int = 15) -> list:
    """Rows (name, CPU median ms, wall median / min ms, GFLOP/s on CPU time) of the per-call
    split of an f32 n x n matmul at 1 thread (see the module docstring)."""
    import lazycandle as lc
    from lazycandle.runtime import matmul as M
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    out = np.empty((n, n), np.float32)
    g = M.geometry(Layout.contiguous((n, n)), Layout.contiguous((n, n)), D.f32)
    old = config.get_num_threads()
    config.set_num_threads(1)
    try:
        tiled, blas_plan = M.TiledPlan(g, 1), M.BlasPlan(g, 1)
        ta, tb = lc.tensor(a).realize(), lc.tensor(b).realize()
        sa, sb = lc.tensor(a[:16, :16].copy()).realize(), lc.tensor(b[:16, :16].copy()).realize()
        addrs = (a.ctypes.data, b.ctypes.data, out.ctypes.data)
        tiled.run(*addrs)
        ws = M._workspace(tiled.ws_bytes)

        def api_tiled():
            with _backend(lc, "tiled"):
                return (ta @ tb).numpy()
        fns = {"tiled kernel alone": lambda: tiled.fn(tiled.params_addr, 0, tiled.ntask, ws),
               "tiled plan": lambda: tiled.run(*addrs), "blas plan": lambda: blas_plan.run(*addrs),
               "api (a @ b).numpy()": lambda: (ta @ tb).numpy(), "api, tiled": api_tiled,
               "api on 16 x 16": lambda: (sa @ sb).numpy(), "numpy": lambda: np.matmul(a, b, out=out)}
        _add_torch_mm(fns, a, b)
        reps = max(1, int(3e8 / n ** 3))
        cpu, wall = {k: [] for k in fns}, {k: [] for k in fns}
        for _ in range(rounds):
            for k, fn in fns.items():
                fn()
                t0, w0 = time.thread_time(), time.perf_counter()
                for _ in range(reps):
                    fn()
                cpu[k].append((time.thread_time() - t0) / reps)
                wall[k].append((time.perf_counter() - w0) / reps)
    finally:
        config.set_num_threads(old)
    return [{"name": k, "cpu_ms": round(statistics.median(cpu[k]) * 1e3, 4),
             "wall_ms": round(statistics.median(wall[k]) * 1e3, 4), "wall_min_ms": round(min(wall[k]) * 1e3, 4),
             "gflops_cpu": round(2.0 * n ** 3 / statistics.median(cpu[k]) / 1e9, 1)} for k in fns]


class _backend:
    """with _backend(lc, name): the matmul backend for the block."""

    def __init__(self, lc, name):
        self.lc, self.name = lc, name

    def __enter__(self):
        self.old = self.lc.get_matmul_backend()
        self.lc.set_matmul_backend(self.name)

    def __exit__(self, *exc):
        self.lc.set_matmul_backend(self.old)


def print_peers(rows) -> None:
    names = list(rows[0]["ms"]) if rows else []
    print(f"# loadavg={os.getloadavg()}")
    print(f"{'case':28s} {'thr':>3s} {'auto->':7s} " + " ".join(f"{n:>9s}" for n in names) + "  best/lc-api")
    for r in rows:
        print(f"{r['name']:28s} {r['threads']:3d} {r['auto']:7s} "
              + " ".join(f"{r['ms'][n]:9.3f}" for n in names) + f"  {r['ratio_api']:6.2f}")
    sys.stdout.flush()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--peers", action="store_true", help="the peer table of PEER_SHAPES (NumPy, torch)")
    ap.add_argument("--ab", nargs="+", metavar=("N", "MR,NV,KC,MC,NC"),
                    help="tile / blocking A/B at 1 thread on CPU time: size, then variants")
    ap.add_argument("--split", type=int, metavar="N", help="per-call split of f32 N^2 at 1 thread")
    args = ap.parse_args(argv)
    if args.split:
        print(f"# f32 {args.split}^2, 1 thread, loadavg={os.getloadavg()}")
        for r in run_split(args.split, args.reps or 15):
            print(f"{r['name']:22s} cpu {r['cpu_ms']:9.4f} ms ({r['gflops_cpu']:6.1f} GFLOP/s)  "
                  f"wall median {r['wall_ms']:9.4f}  min {r['wall_min_ms']:9.4f}")
        return
    if args.ab:
        print(f"# n={args.ab[0]} threads=1 CPU time, loadavg={os.getloadavg()}")
        for r in run_ab(int(args.ab[0]), args.ab[1:], args.reps or 21):
            print(f"{r['name']:20s} cpu median {r['cpu_ms']:9.3f} ms  min {r['cpu_min_ms']:9.3f}  "
                  f"{r['gflops']:7.1f} GFLOP/s  x{r['x_best_peer']:.3f} best peer")
        return
    if args.peers:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
        print_peers(run_peers(args.threads, args.reps or 15))
        print_peers(run_epilogue(args.threads, args.reps or 15))
        return
    env = environment()
    print(f"# threads={args.threads} loadavg={env['loadavg']} OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']} "
          f"OPENBLAS_L2_SIZE={env['OPENBLAS_L2_SIZE']}")
    print(f"# lazycandle BLAS: {env['lazycandle_blas'].get('corename')} "
          f"({env['lazycandle_blas'].get('config')}); numpy BLAS: {env['numpy_blas'].get('corename')}")
    print(f"{'case':32s} {'backend':7s} {'ms':>9s} {'numpy ms':>9s} {'ratio':>6s} {'GFLOP/s':>8s} "
          f"{'(min ratio)':>11s}  target on the median ratio")
    for r in run(args.quick, args.threads, args.reps):
        tgt = f"{r['target']} {'ok' if r['met'] else 'MISSED'}" if "target" in r else ""
        np_note = "" if r["numpy_dtype"] == {"f32": "float32", "f64": "float64"}.get(r["dtype"]) else " (np f32)"
        print(f"{r['name']:32s} {r['backend']:7s} {r['ms']:9.3f} {r['numpy_ms']:9.3f} {r['ratio']:6.2f} "
              f"{r['gflops']:8.1f} {r['ratio_of_mins']:11.2f}  {tgt}{np_note}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
