"""Speed of the vector math kernels through the public API against NumPy, torch and JAX.

    PYTHONPATH=/work/peers .venv/bin/python bench/bench_vmath.py [--threads 1,2] [names...]

4,194,304 float32 values; `t.fn().numpy()` on a realized tensor against NumPy's formula,
torch (its own thread count set to ours) and JAX (jitted; only at the machine's CPU count,
since XLA's pool always uses every CPU).  Every round calls each implementation once, in a
rotating order, so load changes hit all of them alike; the table gives medians and the
median of the per-round ratios (peer time / ours, > 1: we are faster).  Peers that are not
installed are skipped.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

if __package__ in (None, ""):          # run as a script: make `bench` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

N = 4_194_304
NAMES = ["exp", "tanh", "log", "sigmoid", "silu", "gelu", "gelu_erf", "erf", "sin"]


def _numpy_gelu(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


NUMPY = {"exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
         "gelu": _numpy_gelu, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
         "silu": lambda x: x / (1 + np.exp(-x)), "sqrt": np.sqrt}


def _inputs(name, rng):
    if name == "log":
        return rng.uniform(1e-3, 100.0, N).astype(np.float32)
    if name in ("sin", "cos"):
        return rng.uniform(-100.0, 100.0, N).astype(np.float32)
    return rng.uniform(-10.0, 10.0, N).astype(np.float32)


def _torch_fn(torch, name):
    F = torch.nn.functional
    return {"gelu": lambda t: F.gelu(t, approximate="tanh"), "gelu_erf": F.gelu, "silu": F.silu,
            "sigmoid": torch.sigmoid}.get(name, getattr(torch, name, None))


def _jax_fn(jax, name):
    jnp = jax.numpy
    f = {"gelu": lambda x: jax.nn.gelu(x, approximate=True), "gelu_erf": lambda x: jax.nn.gelu(x, approximate=False),
         "silu": jax.nn.silu, "sigmoid": jax.nn.sigmoid, "erf": jax.scipy.special.erf}.get(name, getattr(jnp, name, None))
    return None if f is None else jax.jit(f)


def _peers(threads):
    from bench.peers import FAIR_ENV
    for k, v in FAIR_ENV.items():   # torch's OpenMP team sleeps when idle (read when torch loads), as
        os.environ.setdefault(k, v)     # in `lazycandle bench`: spinning it would take the next call's core
    mods = {}
    try:
        import torch
        torch.set_num_threads(threads)
        mods["torch"] = torch
    except ImportError:
        pass
    if threads == os.cpu_count():
        try:
            import jax
            mods["jax"] = jax
        except ImportError:
            pass
    return mods


def _impls(lc, mods, name, x):
    t = lc.from_dlpack(x)       # the same memory the peers read (as bench/runner.py's _lc_input)
    fns = {"ours": lambda: getattr(t, name)().numpy()}
    if name in NUMPY:
        fns["numpy"] = lambda: NUMPY[name](x)
    if "torch" in mods and _torch_fn(mods["torch"], name) is not None:
        tf, tx = _torch_fn(mods["torch"], name), mods["torch"].from_numpy(x)
        fns["torch"] = lambda: tf(tx).numpy()
    if "jax" in mods and _jax_fn(mods["jax"], name) is not None:
        jf, jx = _jax_fn(mods["jax"], name), mods["jax"].numpy.asarray(x)
        fns["jax"] = lambda: np.asarray(jf(jx).block_until_ready())
    return fns


def time_rotating(fns: dict, reps: int) -> dict:
    """Seconds per call of each fn, `reps` rounds after two warm-up rounds, order rotating."""
    names, times = list(fns), {k: [] for k in fns}
    for r in range(reps + 2):
        for k in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            fns[k]()
            if r >= 2:
                times[k].append(time.perf_counter() - t0)
    return times


def run(quick: bool = False, threads=(1, 2), names=NAMES, reps: int | None = None):
    """Rows (dicts) of the table, per thread count and function; `lazycandle bench --extra`
    renders them."""
    import lazycandle as lc
    rng = np.random.default_rng(0)
    reps = reps or (5 if quick else 15)
    for th in threads:
        lc.set_num_threads(th)
        mods = _peers(th)
        for name in (names[:3] if quick else names):
            times = time_rotating(_impls(lc, mods, name, _inputs(name, rng)), reps)
            row = {"function": name, "threads": th, "load": os.getloadavg()[0]}
            row.update({f"{k} ms": statistics.median(v) * 1e3 for k, v in times.items()})
            row.update({f"{k}/ours": statistics.median(a / b for a, b in zip(v, times["ours"]))
                        for k, v in times.items() if k != "ours"})
            yield row


EXTREMES = {"-inf": -np.inf, "-200": -200.0, "-100": -100.0, "-88..-87": (-88.0, -87.0), "-30": -30.0,
            "+88.7": 88.7, "+200": 200.0, "+inf": np.inf, "nan": np.nan, "denormal": 1e-40, "1e-30": 1e-30,
            "ordinary": (-10.0, 10.0)}


def extremes(names=NAMES, reps: int = 9):
    """Rows {function, input, ms, x ordinary}: each function on 4M copies of one special input
    (a pair: uniform in that range), to catch microcode assists (denormal results or operands
    cost ~100+ cycles each): every row should take about the time of `ordinary`."""
    import lazycandle as lc
    rng = np.random.default_rng(0)
    for name in names:
        ts = {}
        for label, v in EXTREMES.items():
            x = (rng.uniform(*v, N) if isinstance(v, tuple) else np.full(N, v)).astype(np.float32)
            t = lc.tensor(x).realize()
            ts[label] = statistics.median(time_rotating({label: lambda: getattr(t, name)().numpy()}, reps)[label])
        for label, s in ts.items():
            yield {"function": name, "input": label, "ms": s * 1e3, "x ordinary": s / ts["ordinary"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--extremes", action="store_true",
                    help="time each function on special inputs (-inf, -200, denormals, ...) instead")
    ap.add_argument("names", nargs="*", default=NAMES)
    args = ap.parse_args(argv)
    if args.extremes:
        print("| function | input | ms | x ordinary |\n|---|---|---|---|")
        for r in extremes(args.names, args.reps):
            print(f"| {r['function']} | {r['input']} | {r['ms']:.2f} | {r['x ordinary']:.2f} |", flush=True)
        return
    print(f"{N:,} float32, median of {args.reps} rotating rounds; ratio = median over rounds of "
          f"peer time / ours (> 1: ours is faster)\n")
    print("| function | threads | load | ours ms | numpy ms | torch ms | jax ms | numpy/ours | torch/ours | jax/ours |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in run(threads=[int(s) for s in args.threads.split(",")], names=args.names, reps=args.reps):
        cells = [f"{r[k]:.3f}" if k in r else "-" for k in ("ours ms", "numpy ms", "torch ms", "jax ms")]
        cells += [f"{r[k]:.2f}x" if k in r else "-" for k in ("numpy/ours", "torch/ours", "jax/ours")]
        print(f"| {r['function']} | {r['threads']} | {r['load']:.1f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
