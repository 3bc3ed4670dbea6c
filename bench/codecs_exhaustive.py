"""Exhaustive check of the dtype codecs: every one of the 2^32 float bit patterns through the
vectorised encode and roundtrip kernels, compared bit for bit with NumPy / ml_dtypes astype
(the comparison itself is tests/test_codecs.py:check_chunk).

    python bench/codecs_exhaustive.py [codec ...] [--chunk-log2 24] [--threads 2]

Prints, per codec, the mismatch counts, the wall time and the time spent in the JIT kernels and
in the oracle.  Exit status 1 if anything differs."""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import test_codecs as T  # noqa: E402  (kernel harness and oracles)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("codecs", nargs="*", default=list(T.CODECS))
    ap.add_argument("--chunk-log2", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    chunk = 1 << args.chunk_log2
    failed = False
    t_all = time.perf_counter()
    for codec in args.codecs:
        T.check_chunk(codec, 0x3F800000, 64)                # compile outside the timing
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.threads) as pool:
            res = list(pool.map(lambda s: T.check_chunk(codec, s, chunk), range(0, 1 << 32, chunk)))
        be, br = sum(r[0] for r in res), sum(r[1] for r in res)
        tj, tr = sum(r[3] for r in res), sum(r[4] for r in res)
        ex = [e for r in res for e in r[2]][:3]
        failed |= bool(be or br)
        print(f"{codec:7s} 2^32 floats: encode mismatches {be}, roundtrip mismatches {br}; "
              f"wall {time.perf_counter() - t0:6.1f} s (summed over threads: JIT kernels {tj:5.1f} s, "
              f"oracle {tr:6.1f} s){'  e.g. ' + str(ex) if ex else ''}", flush=True)
    print(f"total {time.perf_counter() - t_all:.1f} s")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
