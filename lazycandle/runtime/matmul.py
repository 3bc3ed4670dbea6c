"""Batched matmul over strided storage: the BLAS path (sgemm/dgemm with transpose flags and
leading dimensions, folding broadcast batches where that is correct) and the generated tiled
path (lazycandle.codegen.gemm), both split over the one thread pool.

    matmul(a, a_layout, b, b_layout, out, dtype, backend="auto") -> "blas" | "tiled"

a_layout is (*batch, m, k), b_layout (*batch, k, n) with identical batch shapes (a broadcast
batch dim has stride 0 on either side); out is a contiguous buffer for (*batch, m, n).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from math import gcd, prod

import numpy as np

from .. import config
from ..dtype import DType
from ..layout import Layout, contiguous_strides, merge_dims
from ..codegen import gemm, gemm_copy
from ..codegen.gemm_ir import acc_type
from . import blas, pool

_tls = threading.local()


def _workspace(nbytes: int) -> int:
    """Address of a 64-byte aligned scratch area of `nbytes`, reused per thread."""
    buf = getattr(_tls, "buf", None)
    if buf is None or buf.nbytes < nbytes + 64:
        buf = np.empty(max(nbytes + 64, 1 << 16), np.uint8)
        _tls.buf = buf
    return (buf.ctypes.data + 63) & ~63


@dataclass
class Problem:
    """One batched GEMM in element units: pointers to the first element of each operand,
    matrix strides, and the batch dims merged as far as all three operands allow."""
    dtype: DType
    m: int
    n: int
    k: int
    a: int
    b: int
    o: int
    rsa: int
    csa: int
    rsb: int
    csb: int
    ldo: int
    bshape: tuple      # merged batch dims
    bsa: tuple
    bsb: tuple
    bso: tuple

    @property
    def nbatch(self) -> int:
        return prod(self.bshape)


def _canon(rows: int, cols: int, rs: int, cs: int) -> tuple:
    """Strides of a size-1 dim do not matter: pick the one that makes the layout look
    contiguous or transposed when possible."""
    if cols == 1:
        cs = 1
    if rows == 1:
        rs = max(cols, 1) if cs == 1 else 1
    return rs, cs


def make_problem(a, a_layout: Layout, b, b_layout: Layout, out, dtype: DType) -> Problem:
    *batch, m, k = a_layout.shape
    *batch_b, k2, n = b_layout.shape
    if tuple(batch) != tuple(batch_b) or k != k2:
        raise ValueError(f"matmul: incompatible layouts {a_layout.shape} @ {b_layout.shape}")
    if out.size < prod(batch) * m * n:
        raise ValueError(f"matmul: output buffer of {out.size} elements for {(*batch, m, n)}")
    esz = dtype.size_in_bytes
    rsa, csa = _canon(m, k, *a_layout.strides[-2:])
    rsb, csb = _canon(k, n, *b_layout.strides[-2:])
    so = contiguous_strides((*batch, m, n))[:-2]
    if batch:
        bshape, (bsa, bsb, bso) = merge_dims(tuple(batch), [a_layout.strides[:-2], b_layout.strides[:-2], so])
    else:
        bshape, bsa, bsb, bso = (1,), (0,), (0,), (0,)
    return Problem(dtype, m, n, k,
                   a.ctypes.data + a_layout.offset * esz, b.ctypes.data + b_layout.offset * esz,
                   out.ctypes.data, rsa, csa, rsb, csb, n, bshape, bsa, bsb, bso)


# ---- tiled ------------------------------------------------------------------------------
def _pattern(unit_inner: bool, unit_outer: bool, inner: str, outer: str) -> str:
    return inner if unit_inner else outer if unit_outer else "g"


def _blocking(spec: gemm.GemmSpec, acc_bytes: int) -> tuple:
    """(MC, KC, NC): a KC x NR panel of B stays in L1 (~16 KB), an MC x KC block of A in L2
    (~160 KB), a KC x NC block of B in L3 (~4 MB)."""
    kc = max(64, (16384 // (spec.nr * acc_bytes)) // 8 * 8)
    mc = max(spec.mr, (163840 // (kc * acc_bytes)) // spec.mr * spec.mr)
    nc = max(spec.nr, (4 << 20) // (kc * acc_bytes) // spec.nr * spec.nr)
    return mc, kc, nc


def _spec_for(p: Problem) -> gemm.GemmSpec:
    mr, nv, vw = gemm.choose_tile(p.dtype)
    a_pat = _pattern(p.csa == 1, p.rsa == 1, "k", "m")
    b_pat = _pattern(p.csb == 1, p.rsb == 1, "n", "k")
    return gemm.GemmSpec(p.dtype, mr, nv, vw, a_pat, b_pat)


def _round_up(x: int, mult: int) -> int:
    return -(-x // mult) * mult


def run_tiled(p: Problem, threads: int | None = None) -> None:
    """Run the generated tiled kernel on the whole batched problem."""
    if p.m == 0 or p.n == 0 or p.nbatch == 0:
        return
    spec = _spec_for(p)
    fn = gemm.get_kernel(spec)
    at = acc_type(p.dtype)
    acc_bytes = at.width // 8 if hasattr(at, "width") else (8 if str(at) == "double" else 4)
    mc, kc, nc = _blocking(spec, acc_bytes)
    threads = threads or config.get_num_threads()
    nb = p.nbatch
    # tasks: batches first; split each matrix too when batches alone do not fill the threads
    split = threads // gcd(nb, threads) if threads > 1 else 1
    mblocks, nblocks = -(-p.m // spec.mr), -(-p.n // spec.nr)
    flops = 2.0 * p.m * p.n * max(p.k, 1)
    if split > 1 and flops * nb < 4e6:
        split = 1
    mchunk, nchunk = p.m, p.n
    if split > 1:
        if mblocks >= nblocks:
            mchunk = -(-mblocks // split) * spec.mr
        else:
            nchunk = -(-nblocks // split) * spec.nr
    mtasks, ntasks = -(-p.m // mchunk), -(-p.n // nchunk)
    kc_eff = max(1, min(kc, p.k))
    ap_elems = _round_up(min(mc, mchunk), spec.mr) * kc_eff
    bp_off = _round_up(ap_elems, 16)
    w_off = _round_up(bp_off + kc_eff * _round_up(min(nc, nchunk), spec.nr), 16)
    w_elems = mchunk * nchunk if spec.needs_w and p.k > kc else 0
    ws_bytes = (w_off + w_elems) * acc_bytes

    rank = len(p.bshape)
    lead = rank - gemm.MAX_BATCH_RANK     # batch dims beyond the kernel's limit: looped here
    params = np.zeros(gemm.NPARAMS, np.int64)
    vals = dict(a=p.a, b=p.b, o=p.o, m=p.m, n=p.n, k=p.k, rsa=p.rsa, csa=p.csa, rsb=p.rsb, csb=p.csb,
                ldo=p.ldo, mc=mc, kc=kc, nc=nc, mchunk=mchunk, nchunk=nchunk, mtasks=mtasks, ntasks=ntasks,
                bp_off=bp_off, w_off=w_off, rank=min(rank, gemm.MAX_BATCH_RANK))
    for name, v in vals.items():
        params[gemm.param_index(name)] = v
    inner = slice(max(lead, 0), rank)
    for arr, src in zip(gemm.BATCH_ARRAYS, (p.bshape, p.bsa, p.bsb, p.bso)):
        for i, v in enumerate(src[inner]):
            params[gemm.param_index(arr, i)] = v
    ntask = prod(p.bshape[inner]) * mtasks * ntasks
    pptr = params.ctypes.data

    def chunk(lo, hi):
        fn(pptr, lo, hi, _workspace(ws_bytes))

    cost = flops * nb / max(ntask, 1) / 8.0
    for idx in np.ndindex(*p.bshape[:max(lead, 0)]):
        esz = p.dtype.size_in_bytes
        for field, base, strides in (("a", p.a, p.bsa), ("b", p.b, p.bsb), ("o", p.o, p.bso)):
            params[gemm.param_index(field)] = base + esz * sum(i * s for i, s in zip(idx, strides))
        pool.parallel_for(chunk, 0, ntask, cost_per_item=cost, threads=threads)


# ---- BLAS -------------------------------------------------------------------------------
def _blas_kind(dt: DType):
    """"s" / "d" when the BLAS path can run `dt` (through f32 for the 16/8-bit floats)."""
    if not dt.is_float:
        return None
    return "d" if str(acc_type(dt)) == "double" else "s"


def _blas_form(rows: int, cols: int, rs: int, cs: int):
    """(transposed, leading dim) when a rows x cols matrix with these strides is a plain BLAS
    operand, else None."""
    if cs == 1 and rs >= max(1, cols) and rs <= blas.BLASINT_MAX:
        return False, rs
    if rs == 1 and cs >= max(1, rows) and cs <= blas.BLASINT_MAX:
        return True, cs
    return None


def _acc_bytes(dt: DType) -> int:
    at = acc_type(dt)
    return at.width // 8 if hasattr(at, "width") else (8 if str(at) == "double" else 4)


def _copy(dt: DType, direction: str, src: int, dst: int, shape, ss, ds, threads) -> None:
    """Strided copy-convert (see codegen.gemm_copy) of `shape` from src to dst, in parallel."""
    if prod(shape) == 0:
        return
    if len(shape) > gemm_copy.MAX_RANK:   # only with > 6 unmergeable batch dims: loop the first
        for i in range(shape[0]):
            _copy(dt, direction, src + i * ss[0] * _elem(dt, direction, "src"),
                  dst + i * ds[0] * _elem(dt, direction, "dst"), shape[1:], ss[1:], ds[1:], threads)
        return
    unit = ss[-1] == 1 and ds[-1] == 1
    fn = gemm_copy.get_kernel(gemm_copy.CopySpec(dt, direction, unit))
    po = gemm_copy.param_offsets()
    params = np.zeros(gemm_copy.NPARAMS, np.int64)
    params[po["src"]], params[po["dst"]], params[po["rank"]] = src, dst, len(shape)
    for i, (d, s1, s2) in enumerate(zip(shape, ss, ds)):
        params[po["shape"] + i], params[po["ss"] + i], params[po["ds"] + i] = d, s1, s2
    rows = prod(shape[:-1])
    pptr = params.ctypes.data
    pool.parallel_for(lambda lo, hi: fn(pptr, lo, hi), 0, rows, cost_per_item=shape[-1], threads=threads)


def _elem(dt: DType, direction: str, side: str) -> int:
    storage_side = "src" if direction == "in" else "dst"
    return dt.size_in_bytes if side == storage_side else _acc_bytes(dt)


def _dense_operand(p: Problem, which: str, threads: int, keep: list):
    """Copy operand "a" or "b" into a dense accumulator-typed buffer (one matrix per distinct
    batch element: stride-0 batch dims stay shared), in the memory order its strides suggest.
    Returns (address, batch strides, row stride, col stride) in accumulator elements."""
    rows, cols = (p.m, p.k) if which == "a" else (p.k, p.n)
    rs, cs = (p.rsa, p.csa) if which == "a" else (p.rsb, p.csb)
    addr = p.a if which == "a" else p.b
    bstr = p.bsa if which == "a" else p.bsb
    kept = [i for i, (d, s) in enumerate(zip(p.bshape, bstr)) if d > 1 and s != 0]
    trans = abs(rs) < abs(cs)
    inner_shape = (cols, rows) if trans else (rows, cols)
    dense = contiguous_strides(tuple(p.bshape[i] for i in kept) + inner_shape)
    new_bstr = [0] * len(p.bshape)
    for j, i in enumerate(kept):
        new_bstr[i] = dense[j]
    nrs, ncs = (1, rows) if trans else (cols, 1)
    total = prod(p.bshape[i] for i in kept) * rows * cols
    buf = np.empty(max(total, 1) + 16, np.float64 if _acc_bytes(p.dtype) == 8 else np.float32)
    keep.append(buf)
    base = (buf.ctypes.data + 63) & ~63
    shape = tuple(p.bshape[i] for i in kept) + inner_shape
    src_str = tuple(bstr[i] for i in kept) + ((cs, rs) if trans else (rs, cs))
    _copy(p.dtype, "in", addr, base, shape, src_str, dense, threads)
    return base, tuple(new_bstr), nrs, ncs


def _batch_offsets(p: Problem, idx) -> tuple:
    return (sum(i * s for i, s in zip(idx, p.bsa)), sum(i * s for i, s in zip(idx, p.bsb)),
            sum(i * s for i, s in zip(idx, p.bso)))


def run_blas(p: Problem, threads: int | None = None) -> None:
    """Run the problem through sgemm/dgemm; operands BLAS cannot address (gaps, stride 0 rows,
    non-f32/f64 storage) are first copied dense by a generated kernel."""
    if p.m == 0 or p.n == 0 or p.nbatch == 0:
        return
    threads = threads or config.get_num_threads()
    kind = _blas_kind(p.dtype)
    keep: list = []
    fa = _blas_form(p.m, p.k, p.rsa, p.csa)
    fb = _blas_form(p.k, p.n, p.rsb, p.csb)
    native = p.dtype.codec is None
    q = Problem(**p.__dict__)
    ab = _acc_bytes(p.dtype)
    if fa is None or not native:
        q.a, q.bsa, q.rsa, q.csa = _dense_operand(p, "a", threads, keep)
        fa = _blas_form(p.m, p.k, q.rsa, q.csa)
    if fb is None or not native:
        q.b, q.bsb, q.rsb, q.csb = _dense_operand(p, "b", threads, keep)
        fb = _blas_form(p.k, p.n, q.rsb, q.csb)
    if not native:
        tmp = np.empty(p.nbatch * p.m * p.n + 16, np.float32)
        keep.append(tmp)
        q.o = (tmp.ctypes.data + 63) & ~63
    esz = ab if not native else p.dtype.size_in_bytes
    _blas_calls(q, kind, fa, fb, esz, threads)
    if not native:
        shape = (p.nbatch * p.m, p.n)
        _copy(p.dtype, "out", q.o, p.o, shape, (p.n, 1), (p.ldo, 1), threads)


def _blas_calls(q: Problem, kind: str, fa, fb, esz: int, threads: int) -> None:
    (ta, lda), (tb, ldb) = fa, fb
    nb = q.nbatch
    one_batch = len(q.bshape) == 1
    # a broadcast rhs with lhs rows continuing across batches: one GEMM with M = batch * m
    if nb == 1 or (one_batch and q.bsb[0] == 0 and not ta and q.bsa[0] == q.m * lda
                   and q.bso[0] == q.m * q.ldo and nb * q.m <= blas.BLASINT_MAX):
        blas.gemm(kind, ta, tb, nb * q.m if nb > 1 else q.m, q.n, q.k, q.a, lda, q.b, ldb, q.o, q.ldo)
        return
    # a broadcast lhs row (m == 1) against transposed rhs matrices that continue across
    # batches: one GEMM with N = batch * n (the output rows are then contiguous too)
    if one_batch and q.m == 1 and q.bsa[0] == 0 and tb and q.bsb[0] == q.n * ldb and q.bso[0] == q.n \
            and nb * q.n <= blas.BLASINT_MAX:
        blas.gemm(kind, ta, tb, 1, nb * q.n, q.k, q.a, lda, q.b, ldb, q.o, q.ldo)
        return
    idxs = list(np.ndindex(*q.bshape))

    def run(lo, hi):
        for idx in idxs[lo:hi]:
            oa, ob, oo = _batch_offsets(q, idx)
            blas.gemm(kind, ta, tb, q.m, q.n, q.k, q.a + oa * esz, lda, q.b + ob * esz, ldb,
                      q.o + oo * esz, q.ldo)

    if threads > 1 and (nb % threads == 0 or nb >= 4 * threads):
        # independent GEMMs on our pool, each single-threaded inside BLAS
        with blas.single_threaded():
            pool.parallel_for(run, 0, nb, cost_per_item=2.0 * q.m * q.n * q.k / 8, threads=threads)
    else:
        run(0, nb)


# ---- entry point ------------------------------------------------------------------------
def _auto(p: Problem) -> str:
    kind = _blas_kind(p.dtype)
    if kind is None or p.k == 0 or not blas.available():
        return "tiled"
    if max(p.m, p.n, p.k, p.nbatch * p.m, p.nbatch * p.n) > blas.BLASINT_MAX:
        return "tiled"
    if 2.0 * p.m * p.n * p.k < AUTO_MIN_BLAS_FLOPS:
        return "tiled"
    return "blas"


AUTO_MIN_BLAS_FLOPS = 2.0 * 64 ** 3


def matmul(a: np.ndarray, a_layout: Layout, b: np.ndarray, b_layout: Layout, out: np.ndarray,
           dtype: DType, backend: str | None = "auto") -> str:
    """out[..., m, n] = a[..., m, k] @ b[..., k, n] for storage buffers with strided layouts.
    backend: "blas" | "tiled" | "auto" (None: the configured backend).  Integer dtypes always
    run tiled.  Returns the backend actually used."""
    backend = backend or config.get_matmul_backend()
    if backend not in ("auto", "blas", "tiled"):
        raise ValueError(f"matmul: unknown backend {backend!r}")
    p = make_problem(a, a_layout, b, b_layout, out, dtype)
    if backend == "auto":
        backend = _auto(p)
    elif backend == "blas" and (_blas_kind(dtype) is None or p.k == 0 or not blas.available()
                                or max(p.nbatch * p.m, p.nbatch * p.n, p.k) > blas.BLASINT_MAX):
        backend = "tiled"
    if backend == "blas":
        run_blas(p)
    else:
        run_tiled(p)
    return backend
