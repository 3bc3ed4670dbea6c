"""Round trip of the native worker pool (issue 10 item 5: <= 10 us): a section of one empty
kernel split over N threads, from the Python call to the last worker's barrier, against the
same empty kernel called directly (the ctypes call floor).  Medians of 9 rounds of 2,000
calls, the two forms alternating in each round.

    python -m bench.pool_roundtrip [--threads 2]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time

import numpy as np

from lazycandle.codegen import jit
from lazycandle.codegen.loops import KERNEL_FN, kernel_function, new_module
from lazycandle.codegen.pool_ir import JOB_WORDS
from lazycandle.runtime import native_pool


def _noop_kernel():
    m = new_module("noop")
    _, b = kernel_function(m, "noop")
    b.ret_void()
    cm = jit.link_ir(str(m), ["noop"])
    return cm, cm.address("noop")


def _per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    cm, addr = _noop_kernel()
    direct = KERNEL_FN(addr)
    n = args.threads
    native_pool.ensure(n)
    job = np.array([addr, 0, 0, 0, 0, n, 1, 1 << 40], np.int64)
    assert len(job) == JOB_WORDS
    run, jobs = native_pool._load()["run"], job.ctypes.data
    forms = {"direct call": lambda: direct(None, None, None, 0, 1),
             f"pool section, {n} threads": lambda: run(jobs, 1, n)}
    for f in forms.values():
        _per_call_us(f, 200)
    samples = {k: [] for k in forms}
    for _ in range(9):
        for k, f in forms.items():
            samples[k].append(_per_call_us(f, args.calls))
    print(f"load average {os.getloadavg()[0]:.2f}")
    for k, xs in samples.items():
        print(f"  {k:28s} median {statistics.median(xs):7.2f} us  (min {min(xs):.2f})")
    rt = statistics.median(samples[f"pool section, {n} threads"]) - statistics.median(samples["direct call"])
    print(f"  pool round trip (section - direct): {rt:.2f} us  (target <= 10)")


if __name__ == "__main__":
    main()
