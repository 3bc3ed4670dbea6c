"""One KV-cache update, (1, 12, max_len, 64) f32: slice_set (a fused copy of the whole cache)
against slice_set_ (buffer donation: the new row written in place), rotating in one loop
(median of the rounds after a warm-up), 2 threads.

    python bench/slice_set_inplace.py [--max-len 1024] [--rounds 15]"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if __package__ in (None, ""):          # run as a script: import this checkout's lazycandle
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lazycandle as lc  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    lc.set_num_threads(2)
    shape = (1, 12, args.max_len, 64)
    row = lc.ones((1, 12, 1, 64)).realize()
    copied, donated = lc.zeros(shape).realize(), lc.zeros(shape).realize()
    times = {"slice_set (copy)": [], "slice_set_ (in place)": []}
    for r in range(args.rounds + 3):
        pos = r % args.max_len
        t0 = time.perf_counter()
        copied = copied.slice_set(row, 2, pos).realize()
        t1 = time.perf_counter()
        donated.slice_set_(row, 2, pos)
        t2 = time.perf_counter()
        if r >= 3:
            times["slice_set (copy)"].append((t1 - t0) * 1e3)
            times["slice_set_ (in place)"].append((t2 - t1) * 1e3)
    for name, ts in times.items():
        print(f"{name:24s} {statistics.median(ts):8.3f} ms  (cache {shape}, median of {len(ts)})")


if __name__ == "__main__":
    main()
