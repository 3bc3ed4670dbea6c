"""Choices of issue 10, each timed against its alternative in one rotating loop.

  --divide  row kernels (layer_norm, softmax, rms_norm over (rows, 1024) f32, compiled, 1 thread):
            an f32 division by a row value as a vector divide or as a multiply by its f64
            reciprocal (codegen/row.py RECIPROCAL_DIVIDE), in ns a row, beside torch.
  --wake    eager calls at 2 threads (matmul 256^2, sum(-1) and layer_norm of (4096, 1024)):
            the realize waking parked pool workers before its Python work or not
            (runtime/native_pool.wake made a no-op), rotating with NumPy, torch and jax.
  --sum     f32 sum(-1) and sum(0) of (rows, 1024) (compiled, 1 and 2 threads): every element
            widened to f64 (codegen/reduce.py PAIRED = 1) or PAIRED registers added in f32
            before each widening, rotating with NumPy and torch.

    python -m bench.host_choices --divide --wake --sum

Like `lazycandle bench` it runs with the peers' idle threads set to sleep (bench/peers.py
FAIR_ENV, set before NumPy, torch or jax load).  Medians of --repeats after a warm-up."""
from __future__ import annotations

import argparse
import os
import tempfile

from bench.peers import fair_env_missing

os.environ.update(fair_env_missing())
os.environ["LAZYCANDLE_CACHE_DIR"] = tempfile.mkdtemp(prefix="lc-host-choices-")

import numpy as np  # noqa: E402

import lazycandle as lc  # noqa: E402
from bench.timing import time_alternating  # noqa: E402
from lazycandle.codegen import reduce, row  # noqa: E402
from lazycandle.runtime import native_pool  # noqa: E402

EPS = 1e-5


def _optional(name):
    try:
        return __import__(name)
    except ImportError:
        return None


def _row_cases(lc_mod, x, g, b):
    return {"layer_norm": lambda: lc_mod.nn.layer_norm(x, g, b, EPS), "softmax": lambda: lc_mod.nn.softmax(x, -1),
            "rms_norm": lambda: lc_mod.nn.rms_norm(x, g, EPS)}


def divide(rows: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((rows, 1024)) * 2 + 0.5).astype(np.float32)
    g, b = (rng.standard_normal(1024).astype(np.float32) for _ in range(2))
    feeds = {"x": x, "g": g, "b": b}
    phs = {k: lc.placeholder(k, v.shape) for k, v in feeds.items()}
    host = row.RECIPROCAL_DIVIDE
    fns = {}
    try:
        for recip in (False, True):
            lc.clear_caches(disk=True)
            row.RECIPROCAL_DIVIDE = recip
            for name, build in _row_cases(lc, phs["x"], phs["g"], phs["b"]).items():
                prog = lc.compile(build())
                used = {name: feeds[name] for name, _, _ in prog.inputs}
                prog.run(**used)                     # compiled while the setting holds
                label = f"{name} {'f64 reciprocal' if recip else 'vector divide'}" + (" *" if recip == host else "")
                fns[label] = (lambda p=prog, u=used: p.run(**u))
    finally:
        row.RECIPROCAL_DIVIDE = host
    torch = _optional("torch")
    if torch is not None:
        torch.set_num_threads(1)
        tx, tg, tb = (torch.from_numpy(a) for a in (x, g, b))
        fns["layer_norm torch"] = lambda: torch.nn.functional.layer_norm(tx, (1024,), tg, tb, EPS)
        fns["softmax torch"] = lambda: torch.softmax(tx, -1)
        fns["rms_norm torch"] = lambda: torch.nn.functional.rms_norm(tx, (1024,), tg, EPS)
    with lc.num_threads(1):
        res = time_alternating(fns, repeats, 2)
    print(f"row kernels, ({rows}, 1024) f32, 1 thread, load {os.getloadavg()[0]:.1f} (* = this host's choice)")
    for k, v in sorted(res.items()):
        print(f"  {k:32s} {v.median * 1e9 / rows:6.0f} ns a row")


def wake(repeats: int) -> None:
    rng = np.random.default_rng(0)
    a256, b256 = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    x = rng.standard_normal((4096, 1024)).astype(np.float32)
    g, b = (rng.standard_normal(1024).astype(np.float32) for _ in range(2))
    la, lb, lx, lg, lbb = (lc.tensor(v).realize() for v in (a256, b256, x, g, b))
    lc_cases = {"matmul 256^2": lambda: la.matmul(lb).numpy(), "sum(-1)": lambda: lx.sum(-1).numpy(),
                "layer_norm": lambda: lc.nn.layer_norm(lx, lg, lbb, EPS).numpy()}
    peers = {"matmul 256^2": {"numpy": lambda: a256 @ b256}, "sum(-1)": {"numpy": lambda: x.sum(-1)},
             "layer_norm": {}}
    torch = _optional("torch")
    if torch is not None:
        torch.set_num_threads(2)
        ta, tb, tx, tg, tbb = (torch.from_numpy(v) for v in (a256, b256, x, g, b))
        peers["matmul 256^2"]["torch"] = lambda: (ta @ tb).numpy()
        peers["sum(-1)"]["torch"] = lambda: tx.sum(-1).numpy()
        peers["layer_norm"]["torch"] = lambda: torch.nn.functional.layer_norm(tx, (1024,), tg, tbb, EPS).numpy()
    jax = _optional("jax")
    if jax is not None:
        import jax.numpy as jnp
        ja, jb = jnp.asarray(a256), jnp.asarray(b256)
        mm = jax.jit(lambda p, q: p @ q)
        peers["matmul 256^2"]["jax"] = lambda: np.asarray(mm(ja, jb))
    real = native_pool.wake

    def woken(fn, on):
        def call():
            native_pool.wake = real if on else (lambda: None)
            return fn()
        return call
    try:
        with lc.num_threads(2):
            from threadpoolctl import threadpool_limits
            with threadpool_limits(2, user_api="blas"):
                for case, fn in lc_cases.items():
                    fns = {"lazycandle, wake": woken(fn, True), "lazycandle, no wake": woken(fn, False),
                           **peers[case]}
                    res = time_alternating(fns, repeats, 3)
                    print(f"{case}, 2 threads, load {os.getloadavg()[0]:.1f}: "
                          + "  ".join(f"{k} {v.median * 1e3:.3f} ms" for k, v in res.items()))
    finally:
        native_pool.wake = real


def paired_sum(rows: int, repeats: int) -> None:
    x = np.random.default_rng(0).standard_normal((rows, 1024)).astype(np.float32)
    ph = lc.placeholder("x", x.shape)
    host = reduce.PAIRED
    progs = {}
    try:
        for paired in sorted({1, host}):
            lc.clear_caches(disk=True)
            reduce.PAIRED = paired
            for dim in (-1, 0):
                prog = lc.compile([ph.sum(dim)])
                prog.run(x=x)                        # compiled while the setting holds
                progs[dim, paired] = prog
    finally:
        reduce.PAIRED = host
    torch = _optional("torch")
    for threads in (1, 2):
        for dim in (-1, 0):
            fns = {f"PAIRED={p}" + (" *" if p == host else ""): (lambda pr=progs[dim, p]: pr.run(x=x))
                   for (d, p) in progs if d == dim}
            fns["numpy"] = lambda: x.sum(dim)
            if torch is not None:
                torch.set_num_threads(threads)
                tx = torch.from_numpy(x)
                fns["torch"] = lambda: tx.sum(dim)
            with lc.num_threads(threads):
                res = time_alternating(fns, repeats, 2)
            print(f"sum({dim}) ({rows}, 1024) f32, {threads} thread(s), load {os.getloadavg()[0]:.1f}: "
                  + "  ".join(f"{k} {v.median * 1e3:.3f} ms" for k, v in res.items()))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--divide", action="store_true")
    ap.add_argument("--wake", action="store_true")
    ap.add_argument("--sum", action="store_true")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=41)
    args = ap.parse_args(argv)
    if not (args.divide or args.wake or args.sum):
        args.divide = args.wake = args.sum = True
    if args.divide:
        divide(args.rows, args.repeats)
    if args.wake:
        wake(args.repeats)
    if args.sum:
        paired_sum(args.rows, args.repeats)


if __name__ == "__main__":
    main()
