"""The BLAS path of batched matmul: sgemm/dgemm calls with transpose flags and leading
dimensions, folding broadcast batches where that is correct.  Operands BLAS cannot address and
16/8-bit floats go through a generated dense copy (codegen.gemm_copy) first.  Every GEMM runs
single-threaded inside BLAS, its pieces run as native pool tasks (codegen/task_ir.py calls the
library from native code), so BLAS threads never run beside lazycandle's.  runtime/matmul.py picks this plan or the tiled one."""
from __future__ import annotations

import ctypes
import os
from dataclasses import replace
from math import gcd, prod
from typing import TYPE_CHECKING

import numpy as np

from ..codegen import gemm_copy, task_ir
from ..codegen.gemm_ir import acc_bytes as _acc_bytes
from ..dtype import DType
from ..layout import batch_offsets, contiguous_strides
from . import blas, native_pool
from .native_program import address

if TYPE_CHECKING:
    from .matmul import Geometry

PARALLEL_MIN_FLOPS = 12e6      # below this a pool section (~15 us) costs more than it saves

def _machine_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:      # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


BLAS_PARTS = _machine_cpus()   # BLAS pieces per problem: the machine's size, not the thread setting
def _run_tasks(fn, fn_addr: int, bufs: int, sizes: int, ntask: int, cost: float, threads: int) -> None:
    """Native task function `fn` (codegen/task_ir.py) over tasks [0, ntask): one call on this
    thread for small work, else a native pool section whose threads take chunks of tasks (a
    thread slowed down by something else on the machine leaves its chunks to the others)."""
    if threads <= 1 or ntask * cost < PARALLEL_MIN_FLOPS or ntask <= 1:
        fn(bufs, sizes, None, 0, ntask)
        return
    native_pool.parallel(fn_addr, bufs, sizes, 0, 0, ntask, 1, threads)


def _aligned(nelem: int, np_dtype, keep: list) -> int:
    """A fresh 64-byte aligned buffer of nelem elements (kept alive by `keep`)."""
    buf = np.empty(nelem + 64 // np.dtype(np_dtype).itemsize, np_dtype)
    keep.append(buf)
    return (address(buf) + 63) & ~63


_blas_kinds: dict = {}


def _blas_kind(dt: DType):
    """"s" / "d" when the BLAS path can run `dt` (through f32 for the 16/8-bit floats)."""
    if dt.name not in _blas_kinds:
        _blas_kinds[dt.name] = None if not dt.is_float else "d" if _acc_bytes(dt) == 8 else "s"
    return _blas_kinds[dt.name]


def _blas_form(rows: int, cols: int, rs: int, cs: int):
    """(transposed, leading dim) when a rows x cols matrix with these strides is a plain BLAS
    operand, else None."""
    if cs == 1 and max(1, cols) <= rs <= blas.BLASINT_MAX:
        return False, rs
    if rs == 1 and max(1, rows) <= cs <= blas.BLASINT_MAX:
        return True, cs
    return None


class CopyPlan:
    """Generated strided copy-convert (codegen.gemm_copy) of one fixed shape, in parallel."""

    def __init__(self, dt: DType, direction: str, shape, ss, ds, threads: int):
        self.rows, self.cols = prod(shape[:-1]), shape[-1]
        self.empty = prod(shape) == 0
        if len(shape) > gemm_copy.MAX_RANK:
            raise ValueError(f"matmul: copy of rank {len(shape)} > {gemm_copy.MAX_RANK}")
        unit = ss[-1] == 1 and ds[-1] == 1
        self.fn = gemm_copy.get_kernel(gemm_copy.CopySpec(dt, direction, unit))
        po = gemm_copy.param_offsets()
        self.params = np.zeros(gemm_copy.NPARAMS, np.int64)
        self.params[po["rank"]] = len(shape)
        for i, (d, s1, s2) in enumerate(zip(shape, ss, ds)):
            self.params[po["shape"] + i], self.params[po["ss"] + i], self.params[po["ds"] + i] = d, s1, s2
        self.threads = threads

    def run(self, src: int, dst: int) -> None:
        if self.empty:
            return
        params = self.params.copy()
        params[0], params[1] = src, dst
        pptr = address(params)
        t = native_pool.split_threads(self.rows, self.cols, nthreads=self.threads)
        if t == 1:
            self.fn(pptr, 0, self.rows)
            return
        _, call3 = native_pool.tasks()["lc_task_call3"]
        bufs = (ctypes.c_void_p * 2)(native_pool.fn_address(self.fn), pptr)
        native_pool.parallel(call3, ctypes.addressof(bufs), 0, 0, 0, self.rows, 1, t)


def _dense_copy(g: Geometry, which: str, threads: int):
    """Plan to copy operand "a" or "b" into a dense accumulator-typed buffer (one matrix per
    distinct batch element: stride-0 batch dims stay shared) in the memory order its strides
    suggest.  Returns (CopyPlan, buffer elements, new batch strides, new row / col stride)."""
    rows, cols = (g.m, g.k) if which == "a" else (g.k, g.n)
    rs, cs = (g.rsa, g.csa) if which == "a" else (g.rsb, g.csb)
    bstr = g.bsa if which == "a" else g.bsb
    kept = [i for i, (d, s) in enumerate(zip(g.bshape, bstr)) if d > 1 and s != 0]
    trans = abs(rs) < abs(cs)
    shape = tuple(g.bshape[i] for i in kept) + ((cols, rows) if trans else (rows, cols))
    dense = contiguous_strides(shape)
    new_bstr = [0] * len(g.bshape)
    for j, i in enumerate(kept):
        new_bstr[i] = dense[j]
    src = tuple(bstr[i] for i in kept) + ((cs, rs) if trans else (rs, cs))
    plan = CopyPlan(g.dtype, "in", shape, src, dense, threads)
    nrs, ncs = (1, rows) if trans else (cols, 1)
    return plan, prod(shape), tuple(new_bstr), nrs, ncs


def _blas_parts(njobs: int, m: int, n: int, flops: float, threads: int) -> tuple:
    """(rows, cols) of the pieces each GEMM is cut into so that the pieces of all jobs divide
    evenly over the workers.  At 1 thread: no cut (one sgemm call packs each operand once; a cut
    packs one operand again per piece).  With more threads: BLAS_PARTS workers, the machine's
    size and not the thread setting, so every multi-thread setting cuts alike.  Measured with
    OpenBLAS 0.3.34 (SkylakeX): a cut along 16-row / 16-column blocks gives the one call's bits
    on the square and ragged f32 shapes tried (tests/test_matmul_kernels.py checks one), but not
    always (a 1-column remainder goes to gemv; dgemm with k ~ 4k differs in the last bit), so
    1 thread and 2 threads may differ within SPEC's matmul tolerance, never beyond it."""
    workers = BLAS_PARTS if threads > 1 else 1
    mblocks, nblocks = -(-m // 16), -(-n // 16)
    parts = min(workers // gcd(njobs, workers), max(1, int(flops // PARALLEL_MIN_FLOPS)),
                max(mblocks, nblocks))
    if parts == 1:
        return m, n
    if mblocks >= nblocks:
        return -(-mblocks // parts) * 16, n
    return m, -(-nblocks // parts) * 16


def _blas_jobs(g: Geometry, fa, fb) -> list:
    """The problem as single GEMMs (trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc), the
    addresses as element offsets from the operands' first elements."""
    (ta, lda), (tb, ldb) = fa, fb
    nb, one = g.nbatch, len(g.bshape) == 1
    if nb == 1:
        return [(ta, tb, g.m, g.n, g.k, 0, lda, 0, ldb, 0, g.ldo)]
    # a broadcast rhs with lhs rows continuing across batches: one GEMM with M = batch * m
    if one and g.bsb[0] == 0 and not ta and g.bsa[0] == g.m * lda and g.bso[0] == g.m * g.ldo \
            and nb * g.m <= blas.BLASINT_MAX:
        return [(ta, tb, nb * g.m, g.n, g.k, 0, lda, 0, ldb, 0, g.ldo)]
    # one broadcast lhs row (m == 1) against transposed rhs matrices that continue across
    # batches: one GEMM with N = batch * n, whose single output row is contiguous too
    if one and g.m == 1 and g.bsa[0] == 0 and tb and g.bsb[0] == g.n * ldb and g.bso[0] == g.n \
            and nb * g.n <= blas.BLASINT_MAX:
        return [(ta, tb, 1, nb * g.n, g.k, 0, lda, 0, ldb, 0, nb * g.n)]
    return [(ta, tb, g.m, g.n, g.k, oa, lda, ob, ldb, oo, g.ldo)
            for oa, ob, oo in batch_offsets(g.bshape, g.bsa, g.bsb, g.bso)]


def _split_job(job, mchunk: int, nchunk: int) -> list:
    """Cut one GEMM into output blocks of mchunk x nchunk (rows of A / columns of B)."""
    ta, tb, m, n, k, a, lda, b, ldb, c, ldc = job
    return [(ta, tb, min(mchunk, m - i), min(nchunk, n - j), k, a + i * (1 if ta else lda), lda,
             b + j * (ldb if tb else 1), ldb, c + i * ldc + j, ldc)
            for i in range(0, m, mchunk) for j in range(0, n, nchunk)]


def _task_words(job, ea: int, eb: int, eo: int) -> list:
    """One GEMM piece as codegen/task_ir.py's task words (operands: 0 = A, 1 = B, byte
    offsets).  One output row or column is a GEMV: OpenBLAS's gemm on m == 1 runs its
    packing for one row.  (y[n] = op(B)^T x with x A's row; y[m] = op(A) x with x B's column.)"""
    ta, tb, m, n, k, ja, lda, jb, ldb, jc, ldc = job
    tr = {False: blas.NO_TRANS, True: blas.TRANS}
    if m == 1:
        rows, cols = (n, k) if tb else (k, n)
        return [task_ir.GEMV, tr[not tb], 0, rows, cols, 0, 1, jb * eb, ldb, 0, ja * ea, lda if ta else 1, jc * eo, 1]
    if n == 1:
        rows, cols = (k, m) if ta else (m, k)
        return [task_ir.GEMV, tr[ta], 0, rows, cols, 0, 0, ja * ea, lda, 1, jb * eb, 1 if tb else ldb, jc * eo, ldc]
    return [task_ir.GEMM, tr[ta], tr[tb], m, n, k, 0, ja * ea, lda, 1, jb * eb, ldb, jc * eo, ldc]


class BlasPlan:
    """sgemm/dgemm calls for one geometry.  Operands BLAS cannot address (gaps, stride-0 rows,
    16/8-bit floats) are first copied dense by a generated kernel, and a 16/8-bit result is
    rounded from an f32 buffer.  Every GEMM runs single-threaded inside BLAS, spread over the
    lazycandle pool: one pool for everything, and no BLAS threads spinning against ours on a
    busy machine."""
    backend = "blas"

    def __init__(self, g: Geometry, threads: int):
        self.g, self.threads = g, threads
        self.out_elems = g.nbatch * g.m * g.n
        self.kind = _blas_kind(g.dtype)
        native = g.dtype.codec is None
        fa = _blas_form(g.m, g.k, g.rsa, g.csa)
        fb = _blas_form(g.k, g.n, g.rsb, g.csb)
        q = g
        self.copy_a = self.copy_b = self.copy_out = None
        if fa is None or not native:
            self.copy_a, self.a_elems, bsa, rsa, csa = _dense_copy(g, "a", threads)
            q = replace(q, bsa=bsa, rsa=rsa, csa=csa)
            fa = _blas_form(g.m, g.k, rsa, csa)
        if fb is None or not native:
            self.copy_b, self.b_elems, bsb, rsb, csb = _dense_copy(g, "b", threads)
            q = replace(q, bsb=bsb, rsb=rsb, csb=csb)
            fb = _blas_form(g.k, g.n, rsb, csb)
        if not native:
            rows = g.nbatch * g.m
            self.copy_out = CopyPlan(g.dtype, "out", (rows, g.n), (g.n, 1), (g.ldo, 1), threads)
        self.np_acc = np.float64 if self.kind == "d" else np.float32
        self.esz = np.dtype(self.np_acc).itemsize
        self.in_esz = g.dtype.size_in_bytes
        jobs = _blas_jobs(q, fa, fb) if g.nbatch and g.m and g.n else []
        if not jobs:
            self.jobs = []
            return
        m, n = jobs[0][2], jobs[0][3]
        self.job_flops = 2.0 * m * n * g.k
        mchunk, nchunk = _blas_parts(len(jobs), m, n, self.job_flops, threads)
        if (mchunk, nchunk) != (m, n):
            jobs = [part for job in jobs for part in _split_job(job, mchunk, nchunk)]
            self.job_flops *= mchunk * nchunk / (m * n)
        self.jobs = jobs
        ea = self.esz if self.copy_a else self.in_esz
        eb = self.esz if self.copy_b else self.in_esz
        eo = self.esz if self.copy_out else self.in_esz
        self.table = np.array([_task_words(job, ea, eb, eo) for job in jobs], np.int64).reshape(-1)

    def run(self, a: int, b: int, o: int) -> None:
        g = self.g
        if not self.jobs:
            return
        keep: list = []
        if self.copy_a:
            a_dense = _aligned(self.a_elems, self.np_acc, keep)
            self.copy_a.run(a, a_dense)
            a = a_dense
        if self.copy_b:
            b_dense = _aligned(self.b_elems, self.np_acc, keep)
            self.copy_b.run(b, b_dense)
            b = b_dense
        out = o
        if self.copy_out:
            o = _aligned(g.nbatch * g.m * g.n, self.np_acc, keep)
        fn, fn_addr = native_pool.tasks()[f"lc_task_blas_{self.kind}"]
        bufs = (ctypes.c_void_p * 3)(a, b, o)
        with blas.single_threaded():
            _run_tasks(fn, fn_addr, ctypes.addressof(bufs), address(self.table), len(self.jobs),
                       self.job_flops, self.threads)
        if self.copy_out:
            self.copy_out.run(o, out)


def blas_ok(g: Geometry) -> bool:
    return blas_shape_ok(g) and blas.available()


def blas_shape_ok(g: Geometry) -> bool:
    """Whether BLAS could take g, were it installed (asks nothing of the library: no load)."""
    return (_blas_kind(g.dtype) is not None and min(g.m, g.n, g.k) > 0
            and max(g.k, g.nbatch * g.m, g.nbatch * g.n) <= blas.BLASINT_MAX)
