"""lc.dask against dask.array + NumPy chunks, on the same dask graph of inputs.

  python bench/bench_dask.py out-of-core [--gb 40]   # dask.array.random input, threaded scheduler
  python bench/bench_dask.py in-memory   [--gb 2]    # a persisted array on a 2-worker LocalCluster
  (--only lazycandle|numpy runs one engine; --rows-per-chunk, --workers)

Both compute s = exp(x*a + b).sum(-1) and the per-column mean and std over the chunked rows
(one pass: std = sqrt(mean(x^2) - mean^2)).  Each engine runs in its own child process so its
peak RSS (getrusage) is its own.  Prints one line per engine and the speed ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

COLS = 8192
A, B = 0.5, 0.25


def _input(gb, rows_per_chunk):
    import dask.array as da
    import numpy as np
    rows = int(gb * 2**30 / 4 / COLS)
    rng = da.random.default_rng(1)
    return rng.random((rows, COLS), dtype=np.float32, chunks=(rows_per_chunk, COLS))


def _graph(engine, x):
    import dask.array as da
    if engine == "numpy":
        m = x.mean(0)
        return [da.exp(x * A + B).sum(-1), m, da.sqrt((x * x).mean(0) - m * m)]
    import lazycandle as lc
    p = lc.placeholder("x", x.shape, lc.f32)
    m = p.mean(0)
    prog = lc.compile([((p * A + B).exp()).sum(-1), m, (p.sqr().mean(0) - m.sqr()).sqrt()])
    return lc.dask.run(prog, x=x)


def _child(args):
    import dask
    import numpy as np
    if args.mode == "out-of-core":
        x = _input(args.gb, args.rows_per_chunk)
        outs = _graph(args.engine, x)
        t = time.perf_counter()
        res = dask.compute(*outs, scheduler="threads", num_workers=args.workers)
        secs = time.perf_counter() - t
    else:
        import distributed
        cluster = distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                           dashboard_address=None, silence_logs=40)
        client = distributed.Client(cluster)
        x = client.persist(_input(args.gb, args.rows_per_chunk))
        distributed.wait(x)
        outs = _graph(args.engine, x)
        client.compute(outs, sync=True)            # warm-up: workers compile (lc) / import (both)
        t = time.perf_counter()
        res = client.compute(outs, sync=True)
        secs = time.perf_counter() - t
        client.close()
        cluster.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    np.save(args.out, np.concatenate([np.asarray(r, np.float64).ravel()[:4096] for r in res]))
    print(json.dumps({"engine": args.engine, "seconds": round(secs, 2), "peak_rss_gb": round(rss, 2)}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["out-of-core", "in-memory"])
    ap.add_argument("--gb", type=float, default=None)
    ap.add_argument("--rows-per-chunk", type=int, default=4096)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--engine", choices=["lazycandle", "numpy"], default=None)
    ap.add_argument("--only", choices=["lazycandle", "numpy"], default=None, help="run one engine")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.gb is None:
        args.gb = 40.0 if args.mode == "out-of-core" else 2.0
    if args.engine:
        return _child(args)
    import numpy as np
    print(f"{args.mode}: {args.gb} GB f32 ({COLS} columns, {args.rows_per_chunk}-row chunks), "
          f"{args.workers} workers, load {os.getloadavg()[0]:.1f}", flush=True)
    rows = {}
    for engine in [args.only] if args.only else ("lazycandle", "numpy"):
        out = f"/tmp/bench_dask_{engine}_{os.getpid()}.npy"
        cmd = [sys.executable, __file__, args.mode, "--gb", str(args.gb), "--rows-per-chunk",
               str(args.rows_per_chunk), "--workers", str(args.workers), "--engine", engine, "--out", out]
        line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        rows[engine] = json.loads(line)
        rows[engine]["values"] = np.load(out)
        os.unlink(out)
        print(f"  {engine:10s} {rows[engine]['seconds']:8.2f} s   peak RSS {rows[engine]['peak_rss_gb']:.2f} GB",
              flush=True)
    if args.only:
        return
    lc_v, np_v = rows["lazycandle"]["values"], rows["numpy"]["values"]
    err = float(np.max(np.abs(lc_v - np_v) / np.maximum(np.abs(np_v), 1e-3)))
    print(f"  speed-up {rows['numpy']['seconds'] / rows['lazycandle']['seconds']:.2f}x, "
          f"max rel. difference {err:.1e}")


if __name__ == "__main__":
    main()
