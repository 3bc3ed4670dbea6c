"""Round trip of the native worker pool (issue 10 item 5: <= 10 us): a section of one empty
kernel split over N threads, from the Python call to the last worker's barrier, against the
same empty kernel called directly (the ctypes call floor), with the pool's usual spin before
parking and with parking at once (every wake-up a futex sleep/wake).  Medians of 9 rounds of
2,000 calls, the forms rotating in each round.

With --blas, also a section followed at once by an OpenBLAS sgemm on the same thread count,
against the sgemm alone: whether workers still spinning after the section take a core from
the library's threads (parking at once, or hushing them before the call, are the remedies).

    python -m bench.pool_roundtrip [--threads 2] [--blas]
"""
from __future__ import annotations

import argparse
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
    ap.add_argument("--blas", action="store_true", help="also time a section followed by sgemm")
    args = ap.parse_args(argv)
    cm, addr = _noop_kernel()
    direct = KERNEL_FN(addr)
    n = args.threads
    native_pool.ensure(n)
    job = np.array([addr, 0, 0, 0, 0, n, 1, 1 << 40], np.int64)
    assert len(job) == JOB_WORDS
    run, jobs = native_pool._load()["run"], job.ctypes.data
    spin, park = f"pool section, {n} threads", f"pool section, {n} threads, park at once"
    forms = {"direct call": (native_pool.SPIN_US, lambda: direct(None, None, None, 0, 1)),
             spin: (native_pool.SPIN_US, lambda: run(jobs, 1, n)),
             park: (0.0, lambda: run(jobs, 1, n))}
    samples = _rotate_samples(forms, args.calls)
    print(f"load average {os.getloadavg()[0]:.2f}, spin {native_pool.SPIN_US:g} us "
          f"({native_pool._load()['poll_ns']:.1f} ns per poll)")
    for k, xs in samples.items():
        print(f"  {k:40s} median {statistics.median(xs):7.2f} us  (min {min(xs):.2f})")
    floor = statistics.median(samples["direct call"])
    for label, k in (("spin, then park", spin), ("park at once", park)):
        print(f"  round trip ({label}): {statistics.median(samples[k]) - floor:.2f} us  (target <= 10)")
    if args.blas:
        _section_then_blas(lambda: run(jobs, 1, n), n)


def _rotate_samples(forms: dict, calls: int, rounds: int = 9) -> dict:
    """Per-call us of each (spin us, fn) form in each round, the forms rotating in a round."""
    samples = {k: [] for k in forms}
    for r in range(rounds + 1):         # round 0 warms up
        for k, (spin_us, f) in forms.items():
            native_pool.set_spin_us(spin_us)
            t = _per_call_us(f, calls)
            if r:
                samples[k].append(t)
    native_pool.set_spin_us(native_pool.SPIN_US)
    return samples


def _section_then_blas(section, n: int) -> None:
    import lazycandle as lc
    from lazycandle.runtime import blas
    if not blas.available():
        print("no BLAS library: --blas skipped")
        return
    lc.set_num_threads(n)
    spin = native_pool.SPIN_US
    sgemm = blas._load()["sgemm"]
    for m, k, nn in ((256, 256, 256), (128, 768, 768), (64, 64, 64)):
        a, b = np.ones((m, k), np.float32), np.ones((k, nn), np.float32)
        c = np.empty((m, nn), np.float32)
        args = (m, nn, k, a.ctypes.data, k, b.ctypes.data, nn, c.ctypes.data, nn)

        def gemm():
            sgemm(blas.ROW_MAJOR, blas.NO_TRANS, blas.NO_TRANS, *args[:3], 1.0, *args[3:7], 0.0, *args[7:])

        def then_gemm():
            section()
            gemm()

        def hushed():
            section()
            native_pool.hush()
            gemm()
        calls = max(20, int(2e8 / (2 * m * k * nn) * 20))
        t = _rotate_samples({"sgemm alone": (spin, gemm), "section, sgemm": (spin, then_gemm),
                     "section, sgemm (park at once)": (0.0, then_gemm),
                     "section, hush, sgemm": (spin, hushed)}, calls)
        print(f"sgemm {m}x{k}x{nn}, {n} threads, load {os.getloadavg()[0]:.2f}: "
              + ", ".join(f"{name} {statistics.median(us):.1f} us" for name, us in t.items()))


if __name__ == "__main__":
    main()
