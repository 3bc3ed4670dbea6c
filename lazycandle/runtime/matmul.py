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
from ..codegen import gemm
from ..codegen.gemm_ir import acc_type
from . import pool

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
