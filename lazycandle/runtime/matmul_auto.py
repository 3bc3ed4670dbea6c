"""The "auto" matmul backend: BLAS or the tiled GEMM, whichever measured faster on this host.

The first problem of a bucket (dtype, threads, operand forms, and the power-of-two size class
of m, n, k and the batch count) times both plans on scratch operands of its geometry, in
alternating rounds (more of them when the two are within NOISE), and the one with the lower
median serves every later problem of the bucket, a close call included.  A measurement
and not a table: the crossover moves with the ISA (register tile), the BLAS build, the core
count and the shape (thin, batched, transposed), and one calibration costs a few ms per bucket
(problems above CALIBRATE_MAX_FLOPS are timed on a proxy with m, n, k cut to PROXY_DIM, where
both kernels are compute bound and keep their ratio).  The choices live in a registered cache,
and on disk with the kernels (codegen/jit.remember_choice: keyed by the bucket, the host, the
code generator and the BLAS build), so a new process measures nothing it measured before;
lc.clear_caches() forgets the in-memory ones.

One rule skips the measurement: a single f32 GEMM with m >= RULE_M and n, k >= RULE_NK, at 1
or 2 threads on an AVX-512 host, runs the tiled GEMM.  Timed on the Zen4 host (bench/auto_rule.py,
18 shapes and forms of the region, from 1024 x 384 x 384 to 4096 x 1536 x 384, 2048^3 and odd sizes) the tiled GEMM was never
slower: worst median ratio 0.98 and 1.01 in two runs at 2 threads, 1.04 at 1 thread, most 3-10 %
ahead.  Below the region (m 256-1000 with n 257-4000) BLAS won by 3-28 % in some runs, so those
stay measured.  The measurement skipped was most of a new process's first BERT 32x128 call (about
1.2 s: compiling both candidates, then timing them).  Other hosts, dtypes, batches and thread
counts are measured as before.
"""
from __future__ import annotations

import statistics
import sys
import threading
import time
from dataclasses import replace

import numpy as np

from .. import caches
from ..codegen import compile_pool, jit
from . import blas
from .buffers import address

CALIBRATE_MAX_FLOPS = 2.0 * 1024 ** 3    # larger problems are timed on a proxy ...
PROXY_DIM = 1024                         # ... with m, n, k at most this
ROUNDS = (3, 15)                         # alternating timed calls of each plan (the median counts) ...
BUDGET_S = 0.06                          # ... more of them, up to this time, on a small problem
NOISE = 0.10                             # best times closer than this are a close call: ...
CLOSE_ROUNDS, CLOSE_BUDGET_S = 30, 0.25  # ... it gets more rounds, up to this time

RULE_M, RULE_NK = 1024, 384              # m and n, k at least these: the tiled GEMM without measuring ...
RULE_THREADS = 2                         # ... at up to this many threads (what was timed)

_choices: dict = caches.register("matmul auto choices", {})
_lock = threading.Lock()
caches.renew_lock_after_fork(sys.modules[__name__], "_lock")


def bucket(g, threads: int) -> tuple:
    """Problems that share a choice: same dtype, threads, operand forms (transposed or not,
    broadcast batch), and power-of-two class of each size.  (Looked up at every new shape a
    program binds: kept to plain arithmetic.)"""
    forms = (g.csa == 1, g.csb == 1, 0 in g.bsa, 0 in g.bsb)
    return (g.dtype.name, threads, forms, max(0, g.m).bit_length(), max(0, g.n).bit_length(),
            max(0, g.k).bit_length(), max(0, g.nbatch).bit_length())


def _proxy(g):
    """g, or for a problem above CALIBRATE_MAX_FLOPS one GEMM of it cut to PROXY_DIM."""
    if g.flops * g.nbatch <= CALIBRATE_MAX_FLOPS:
        return g
    m, n, k = (min(x, PROXY_DIM) for x in (g.m, g.n, g.k))
    return replace(g, m=m, n=n, k=k, ldo=n, bshape=(1,), bsa=(0,), bsb=(0,), bso=(0,), ep=())


def _span(rows, cols, rs, cs, bshape, bs) -> int:
    """Elements an operand's layout reaches (its scratch buffer size)."""
    return 1 + (rows - 1) * abs(rs) + (cols - 1) * abs(cs) + sum((d - 1) * abs(s) for d, s in zip(bshape, bs))


def _time(run) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def measure(g, threads: int, make_plans) -> dict:
    """{backend: median seconds} of both plans on zeroed scratch operands of g's proxy;
    make_plans(geometry) -> {backend: plan}.  The median, not the best time: on a busy host a
    kernel whose times spread wide wins on its one lucky call (f32 128 x 768 @ 768 x 3072 at
    1 thread: OpenBLAS 4.8 ms best but 6.5 median, the tiled GEMM 4.8 best and 5.2 median)."""
    p = _proxy(g)
    esz = g.dtype.size_in_bytes
    sa = _span(p.m, p.k, p.rsa, p.csa, p.bshape, p.bsa)
    sb = _span(p.k, p.n, p.rsb, p.csb, p.bshape, p.bsb)
    so = p.nbatch * p.m * p.n
    bufs = [np.zeros(s * esz + 64, np.uint8) for s in (sa, sb, so)]
    addrs = [(address(x) + 63) & ~63 for x in bufs]
    plans = make_plans(p)
    times = {}
    for name, plan in plans.items():          # untimed first call: compiles, faults pages in
        plan.run(*addrs)
        times[name] = []
    with compile_pool.quiet():              # no background compile beside the timed calls
        t0 = time.perf_counter()
        for r in range(CLOSE_ROUNDS):
            spent = time.perf_counter() - t0
            if r >= ROUNDS[0] and (spent > CLOSE_BUDGET_S or
                                   (not _close(_medians(times)) and (r >= ROUNDS[1] or spent > BUDGET_S))):
                break
            for name, plan in plans.items():
                times[name].append(_time(lambda: plan.run(*addrs)))
    return _medians(times)


def _medians(times: dict) -> dict:
    return {name: statistics.median(ts) for name, ts in times.items()}


def _close(best: dict) -> bool:
    lo, hi = min(best.values()), max(best.values())
    return hi <= lo * (1 + NOISE)


def pick(best: dict) -> str:
    """The backend with the lower median, a close call included.  (Ties once went to BLAS on
    big shapes; on the Xeon host the tiled GEMM beat OpenBLAS at 256..2048 squared at 1 and 2
    threads by 3-20 %, and that rule handed 1024^2 to the slower BLAS.)"""
    return min(best, key=best.get)


def choose(g, threads: int, make_plans, may_measure: bool = True):
    """"blas" or "tiled" for g at `threads`, measured once per bucket and host (the choice is
    kept with the kernels in the disk cache, so a new process does not measure again); with
    `may_measure` False, None where that would measure (a bucket not decided yet)."""
    if ruled(g, threads):
        return "tiled"
    key = bucket(g, threads)
    hit = _choices.get(key)
    if hit is None:
        hit = recall("auto", key, ("blas", "tiled"))
        if hit is None:
            if not may_measure:
                return None
            # measured without a lock: its timed runs take the pool, whose other callers must not wait here
            # (two threads measuring one bucket at once both store a valid choice)
            hit = pick(measure(g, threads, make_plans))
            jit.remember_choice("matmul " + "auto", _ident(key), hit)
        with _lock:
            hit = _choices.setdefault(key, hit)
    return hit


def ruled(g, threads: int) -> bool:
    """Whether the rule (module docstring) hands g to the tiled GEMM without a measurement."""
    return (g.dtype.name == "f32" and g.m >= RULE_M and min(g.n, g.k) >= RULE_NK and g.nbatch == 1
            and threads <= RULE_THREADS and _rule_isa())


def _rule_isa() -> bool:
    """The rule's ISA: AVX-512, the register tile it was timed with."""
    return jit.vector_bits() == 512


def _ident(key) -> dict:
    """What a stored choice of bucket `key` depends on besides the host and code generator."""
    return {"bucket": key, "blas": blas.build_id()}


def recall(kind: str, key, allowed):
    """The choice stored on disk for `kind` and bucket `key`, when it is one of `allowed`."""
    got = jit.remembered_choice("matmul " + kind, _ident(key))
    return got if got in allowed else None
