"""Reduction stream tuning (codegen/reduce.py _stream_tuning), timed in one rotating loop, in GB/s
of input read.  Last-dim reductions are compiled with each (ROWS, PREFETCH) choice; with
`--dim 0`, leading-dim reductions with a whole-row strip read one row per pass or ROW_BLOCK rows
per pass (ONE_ROW true or false), next to NumPy's:

    python -m bench.reduce_streams [--threads 1] [--op sum] [--dim -1] [--shapes 16384x1024,65536x256,4096x1024]

The variants are built as one reduction; `--dim 0 --split 8` adds the same reduction as two,
over 8 chunks of the rows and then over the 8 partials (`x.reshape((8, R // 8, C)).sum(1).sum(0)`),
which is how lazycandle builds a sum or mean over the first dim of a stored input of at least
32 MiB with short rows (tensor_reduce.SPLIT_CHUNKS): threads then take whole rows of chunks of
their own instead of halves of every row.

Each variant is compiled in this process after clearing the kernel caches (the disk cache too,
in a temporary LAZYCANDLE_CACHE_DIR), so each program holds its own kernel; every program reads
the same input array.  The host's own choice is marked with *."""
from __future__ import annotations

import argparse
import os
import tempfile

os.environ["LAZYCANDLE_CACHE_DIR"] = tempfile.mkdtemp(prefix="lc-streams-")

import numpy as np  # noqa: E402

import lazycandle as lc  # noqa: E402
from lazycandle import tensor_reduce  # noqa: E402
from bench.timing import time_alternating  # noqa: E402
from lazycandle.codegen import reduce as red  # noqa: E402
from lazycandle.codegen.jit import host_info  # noqa: E402

VARIANTS = {-1: (("ROWS", "PREFETCH"), [(1, 0), (1, 16384), (4, 0), (4, 16384)]),
            0: (("ONE_ROW",), [(True,), (False,)])}


def _programs(op: str, shape: tuple, dim: int) -> dict:
    names, variants = VARIANTS[dim]
    host = tuple(getattr(red, k) for k in names)
    progs = {}
    split_min, tensor_reduce.SPLIT_MIN_BYTES = tensor_reduce.SPLIT_MIN_BYTES, float("inf")     # one reduction
    try:
        for values in variants:
            lc.clear_caches(disk=True)
            for k, v in zip(names, values):
                setattr(red, k, v)
            name = " ".join(f"{k.lower()}={v}" for k, v in zip(names, values)) + (" *" if values == host else "")
            progs[name] = lc.compile(getattr(lc.placeholder("x", shape), op)(dim))
            progs[name].run(x=np.zeros(shape, np.float32))     # compiled while the constants hold
    finally:
        tensor_reduce.SPLIT_MIN_BYTES = split_min
        for k, v in zip(names, host):
            setattr(red, k, v)
    return progs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--op", default="sum", choices=["sum", "max", "min", "mean"])
    ap.add_argument("--dim", type=int, default=-1, choices=[-1, 0])
    ap.add_argument("--shapes", default="16384x1024,65536x256,4096x1024")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--split", type=int, default=0, help="with --dim 0: also time the two-level form over this many chunks")
    args = ap.parse_args(argv)
    lc.set_num_threads(args.threads)
    print(f"host cpu {host_info()['cpu']}, {args.threads} thread(s), "
          f"load {os.getloadavg()[0]:.2f}; {args.op}({args.dim}) f32, GB/s of input (median of {args.repeats})")
    for text in args.shapes.split(","):
        shape = tuple(int(s) for s in text.split("x"))
        x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
        progs = _programs(args.op, shape, args.dim)
        if args.op in ("max", "min"):       # exact whatever the order (sums may differ in the last bit)
            outs = [p.run(x=x)[0] for p in progs.values()]
            assert all(np.array_equal(o, outs[0]) for o in outs[1:])
        fns = {k: (lambda p=p: p.run(x=x)) for k, p in progs.items()}
        if args.dim == 0 and args.split and shape[0] % args.split == 0:
            k = args.split
            split = lc.compile(getattr(getattr(lc.placeholder("x", shape).reshape((k, shape[0] // k) + shape[1:]), args.op)(1),
                                       args.op)(0))
            fns[f"split{k}"] = lambda: split.run(x=x)
        if args.dim == 0:
            fns["numpy"] = lambda: getattr(x, args.op)(0)
        stats = time_alternating(fns, repeats=args.repeats, warmup=2)
        print(f"  {text:>12}: " + ", ".join(f"{k} {x.nbytes / s.median / 1e9:.1f}" for k, s in stats.items()))


if __name__ == "__main__":
    main()
