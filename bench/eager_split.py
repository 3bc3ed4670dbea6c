"""Where a bench row's time goes (issue 10's sum(-1), sum(0) and matmul 256^2 rows): each
implementation timed right after each peer's call on the same input, as `lazycandle bench`'s
rotation runs it -- the eager lazycandle call (`x.sum(0).numpy()`: node, plan lookup, kernel,
result), the same computation as a compiled Program (`prog.run`: the kernel and its native
call), NumPy and torch:

    python -m bench.eager_split [--threads 1] [--cases sum0,sum1,mm256] [--rounds 21]

"lc after numpy" is the median of lazycandle's eager call timed right after NumPy's call.  The
eager-minus-prog column is the Python an eager call runs on caches the previous call streamed
out; prog against the peers compares the kernels."""
from __future__ import annotations

import argparse
import os
import time

from bench.peers import fair_env_missing, threads

os.environ.update(fair_env_missing())

import numpy as np  # noqa: E402

import lazycandle as lc  # noqa: E402
from bench.runner import _aligned  # noqa: E402

CASES = {
    "sum0": ("sum(0), (4096, 1024) f32", lambda x: x.sum(0), ((4096, 1024),)),
    "sum1": ("sum(-1), (4096, 1024) f32", lambda x: x.sum(-1), ((4096, 1024),)),
    "mm256": ("matmul f32 256^2", lambda a, b: a @ b, ((256, 256), (256, 256))),
}


def _impls(fn, shapes, torch):
    rng = np.random.default_rng(1234)
    arrays = [_aligned(rng.standard_normal(s, dtype=np.float32)) for s in shapes]
    tensors = [lc.from_dlpack(a) for a in arrays]
    prog = lc.compile([fn(*(lc.placeholder(f"x{i}", s) for i, s in enumerate(shapes)))])
    feeds = {f"x{i}": a for i, a in enumerate(arrays)}
    impls = {"eager": lambda: fn(*tensors).numpy(), "prog": lambda: prog.run(**feeds),
             "numpy": lambda: fn(*arrays)}
    if torch is not None:
        ts = [torch.from_numpy(a) for a in arrays]
        impls["torch"] = lambda: fn(*ts).numpy()
    return impls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
    with threads(args.threads, {"torch": torch} if torch is not None else {}):
        for name in args.cases.split(","):
            _case(name, args, torch)


def _case(name, args, torch) -> None:
    """Time one case's implementations, each right after each other one; print the medians."""
    title, fn, shapes = CASES[name]
    impls = _impls(fn, shapes, torch)
    before = [k for k in impls if k != "prog"]
    times = {(a, b): [] for a in before for b in impls}
    for f in impls.values():
        f()
        f()
    for _ in range(args.rounds):
        for a, b in times:
            impls[a]()
            t0 = time.perf_counter()
            impls[b]()
            times[a, b].append(time.perf_counter() - t0)
    print(f"{title}, {args.threads} thread(s), median of {args.rounds} (ms), load {os.getloadavg()[0]:.2f}")
    print("  after      " + "".join(f"{b:>9s}" for b in impls) + "   eager-prog")
    for a in before:
        med = {b: np.median(times[a, b]) * 1e3 for b in impls}
        print(f"  {a:10s} " + "".join(f"{med[b]:9.3f}" for b in impls) + f"   {med['eager'] - med['prog']:+9.3f}")


if __name__ == "__main__":
    main()
