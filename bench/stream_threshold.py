"""From what output size non-temporal stores pay (codegen/elementwise.streaming_min_bytes):
each size compiled twice, with streamed and with plain stores, timed in one rotating loop
beside NumPy / torch, alone and followed by a sum of its output (the next kernel reading it):

    python -m bench.stream_threshold [--threads 1] [--kind add|softmax] [--sizes 1,2,4,6,8,12,16,32]

Sizes are the output's MiB (f32 rows of 1024).  The host's thresholds are printed first."""
from __future__ import annotations

import argparse
import os
import tempfile

os.environ["LAZYCANDLE_CACHE_DIR"] = tempfile.mkdtemp(prefix="lc-stream-")

import numpy as np  # noqa: E402

import lazycandle as lc  # noqa: E402
from bench.timing import time_alternating  # noqa: E402
from lazycandle.codegen import elementwise as ew  # noqa: E402

KINDS = {"add": (lambda x: x + x, lambda x: x + x),
         "softmax": (lc.nn.softmax_last_dim, None)}


def _programs(kind: str, shape: tuple) -> dict:
    """{"streamed": Program, "plain": Program}, each compiled with the threshold forced."""
    real = ew.streaming_min_bytes
    progs = {}
    try:
        for name, min_bytes in (("streamed", 1 << 10), ("plain", 1 << 62)):
            lc.clear_caches(disk=True)
            ew.streaming_min_bytes = lambda row=False, b=min_bytes: b
            progs[name] = lc.compile([KINDS[kind][0](lc.placeholder("x", shape))])
            progs[name].run(x=np.zeros(shape, np.float32))
    finally:
        ew.streaming_min_bytes = real
    return progs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kind", default="add", choices=list(KINDS))
    ap.add_argument("--sizes", default="1,2,4,6,8,12,16,32")
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args(argv)
    lc.set_num_threads(args.threads)
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    print(f"{args.kind}, {args.threads} thread(s), load {os.getloadavg()[0]:.2f}; host thresholds: "
          f"elementwise {ew.streaming_min_bytes() >> 10} KiB, row {ew.streaming_min_bytes(row=True) >> 10} KiB; "
          f"median ms of {args.repeats}")
    for mb in (int(s) for s in args.sizes.split(",")):
        shape = (mb * (1 << 20) // 4096, 1024)
        x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
        progs = _programs(args.kind, shape)
        fns = {}
        for name, p in progs.items():
            fns[name] = lambda p=p: p.run(x=x)
            fns[name + "+sum"] = lambda p=p: p.run(x=x)[0].sum()
        peer = KINDS[args.kind][1]
        if peer is not None:
            fns["numpy"], fns["numpy+sum"] = (lambda: peer(x)), (lambda: peer(x).sum())
        elif torch is not None:
            t = torch.from_numpy(x)
            fns["torch"] = lambda: torch.softmax(t, -1)
        st = time_alternating(fns, repeats=args.repeats, warmup=2)
        print(f"  {mb:3d} MiB: " + ", ".join(f"{k} {s.median * 1e3:.3f}" for k, s in st.items()), flush=True)


if __name__ == "__main__":
    main()
