"""The bf16 dot-product form of the tiled GEMM (codegen/gemm.py), for hosts with AVX512-BF16.

`vdpbf16ps` adds two products of bf16 pairs into each f32 lane: acc[j] += a[2j] b[2j] +
a[2j+1] b[2j+1].  Both panels therefore keep bf16 storage, with k in PAIRS: A's panel holds,
per k-pair, the MR pairs (A[i, 2kk], A[i, 2kk+1]) as one 32-bit word each (the micro-kernel
broadcasts a row's word), B's panel holds per k-pair the NR pairs (B[2kk, j], B[2kk+1, j]),
so one 64-byte load is 16 columns' pairs.  A panel of kbp k-rows takes kbp / 2 words a row:
it sits in the first half of the f32 panel slot the driver lays out, so the driver, its
blocking and the shared-B offsets are the f32 form's.  The second element of a pair past k,
the k padding and rows past the matrix are 0.

The small-m kernel's x @ w.T form (gemm_skinny.py "t") needs no packing for it: a and w are
both contiguous along k, so 32 bf16 of each are already 16 pairs (`dot_words`).

A bf16 x bf16 product is exact in f32, so each add rounds once, as the FMA chain of the f32
form does; the instruction treats denormal inputs and results as 0 (as torch's bf16 GEMM on the
same instruction does).  On Zen 4 it runs the 1024^2 bf16 GEMM at twice the f32 form's rate."""
from __future__ import annotations

import llvmlite.ir as ir

from . import jit
from .gemm_ir import ONE, ZERO, I64, acc_type, add, define, for_range, gep, i64, imin, load, mul, storage_type, \
    store, vload, vstore
from .gemm_pack import _store_lanes, _transpose
from .llvmutil import I32, VOID, splat, vec

I16 = ir.IntType(16)
LANES = 16                      # f32 accumulator lanes of a 512-bit register: the only width emitted
DP_NAME = "llvm.x86.avx512bf16.dpbf16ps.512"


class _BFloat(ir.Type):
    """LLVM's `bfloat` (llvmlite.ir has no such type): only the intrinsic's operands use it."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat)

    def __hash__(self):
        return hash("bfloat")


BF_PAIRS = ir.VectorType(_BFloat(), 2 * LANES)


def usable(dt, vw: int) -> bool:
    """Whether the tiled GEMM of `dt` with `vw` accumulator lanes runs in the pair form here."""
    return dt.name == "bf16" and vw == LANES and jit.has_feature("avx512bf16")


def dot_words(b, acc, x, y):
    """acc + the pair products of x and y: each 2 LANES bf16 bit patterns (i16 lanes) or LANES
    32-bit words of pairs; lane j adds x[2j] y[2j] + x[2j+1] y[2j+1]."""
    dp = b.module.globals.get(DP_NAME) or ir.Function(
        b.module, ir.FunctionType(acc.type, [acc.type, BF_PAIRS, BF_PAIRS]), name=DP_NAME)
    return b.call(dp, [acc, b.bitcast(x, BF_PAIRS), b.bitcast(y, BF_PAIRS)])


def dot_step(b, acc, a_word, b_words):
    """acc + the pair products of one A word (broadcast) and a B vector of LANES words."""
    return dot_words(b, acc, splat(b, a_word, LANES), b_words)


def micro_steps(spec, R: int, prefetch):
    """The micro-kernel's k-loop body in the pair form: U / 2 pair steps (U k-rows) reading the
    panels as words at a_ptr / b_ptr; the loop advances a_ptr by MR * U / 2 and b_ptr by
    NR * U / 2 words."""
    MR, NV, NR, U = spec.mr, spec.nv, spec.nr, spec.unroll

    def steps(bb, a_ptr, b_ptr, accs):
        if spec.prefetch:
            prefetch(bb, bb.gep(a_ptr, [i64(spec.prefetch * U // 2 * MR)]), write=False)
        for u in range(U // 2):
            bvs = [vload(bb, b_ptr, i64(u * NR + v * LANES), LANES, 64) for v in range(NV)]
            new = []
            for i in range(R):
                a = load(bb, a_ptr, i64(u * MR + i), 4)
                new.append([dot_step(bb, accs[i][v], a, bvs[v]) for v in range(NV)])
            accs = new
        return accs
    return steps


def pair_word(b, lo, hi):
    """The 32-bit word of a pair of bf16 bit patterns: `lo` (the even k) in the low half."""
    return b.or_(b.zext(lo, I32), b.shl(b.zext(hi, I32), ir.Constant(I32, 16)))


def interleave(b, lo, hi):
    """Two vectors of n bf16 bit patterns (the even and the odd k) as n pairs: lo[0], hi[0],
    lo[1], hi[1], ... (2n i16 lanes)."""
    n = lo.type.count
    return b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 2 * n), [x // 2 + (n if x % 2 else 0)
                                                                           for x in range(2 * n)]))


def emit_pack(m: ir.Module, spec, name: str, width: int):
    """pack(src, rs, cs, rows, kb, kbp, dst) in the pair form (rows: i of A / j of B, stride
    rs; k stride cs; panels of `width` rows, kbp k-rows each, spaced kbp x width words).
    rs == 1 (row-major B): for each k-pair two row loads interleaved; cs == 1 (row-major A,
    transposed B): a row's 16 pairs are one word load, 16 rows transposed in registers; the
    rest (other strides, the k tail, the padding, the partial panel) one pair at a time with
    every read guarded."""
    st, at = storage_type(spec.dtype), acc_type(spec.dtype)
    fn, b = define(m, name, VOID, [st.as_pointer(), I64, I64, I64, I64, I64, at.as_pointer()])
    src, rs, cs, rows, kb, kbp, dst = fn.args
    src = b.bitcast(src, I16.as_pointer())
    words = b.bitcast(dst, I32.as_pointer())
    W = i64(width)
    npair = b.sdiv(kbp, i64(2))
    whole = b.sdiv(kb, i64(2))                      # pairs with both elements inside k
    full = b.sdiv(rows, W)
    npanel = b.sdiv(add(b, rows, i64(width - 1)), W)
    slot = mul(b, kbp, W)                           # words between panels

    def rows_contiguous():
        with for_range(b, ZERO, whole, name="kk") as kk:
            r0 = gep(b, src, mul(b, mul(b, kk, i64(2)), cs))
            r1 = gep(b, r0, cs)
            with for_range(b, ZERO, full, name="p") as p:
                lo, hi = (vload(b, r, mul(b, p, W), width, 2) for r in (r0, r1))
                v = b.bitcast(interleave(b, lo, hi), vec(I32, width))
                vstore(b, v, words, add(b, mul(b, p, slot), mul(b, kk, W)), 4)

    kblk = mul(b, b.sdiv(whole, i64(LANES)), i64(LANES))

    def k_contiguous():
        with for_range(b, ZERO, full, name="pg") as p:
            with for_range(b, ZERO, kblk, i64(LANES), name="kt") as k0:
                for g in range(0, width, LANES):
                    n = min(LANES, width - g)
                    vs = []
                    for r in range(n):
                        row = gep(b, src, add(b, mul(b, add(b, mul(b, p, W), i64(g + r)), rs), mul(b, k0, i64(2))))
                        vs.append(b.load(b.bitcast(row, vec(I32, LANES).as_pointer()), align=2))
                    cols = _transpose(b, vs + [ir.Constant(vec(I32, LANES), [0] * LANES)] * (LANES - n))
                    for j, v in enumerate(cols):
                        at_ = add(b, mul(b, p, slot), add(b, mul(b, add(b, k0, i64(j)), W), i64(g)))
                        _store_lanes(b, v, words, at_, n, 4)

    with b.if_else(b.icmp_signed("==", rs, ONE)) as (unit_rows, other):
        with unit_rows:
            rows_contiguous()
        with other:
            with b.if_then(b.icmp_signed("==", cs, ONE)):
                k_contiguous()
    fast = b.select(b.icmp_signed("==", rs, ONE), whole, b.select(b.icmp_signed("==", cs, ONE), kblk, ZERO))
    # everything else: one guarded pair at a time (a read outside the matrix would be a fault)
    zero16 = ir.Constant(I16, 0)
    with for_range(b, ZERO, npanel, name="ps") as p:
        first = b.select(b.icmp_signed("<", p, full), fast, ZERO)
        nrows = imin(b, W, b.sub(rows, mul(b, p, W)))
        with for_range(b, first, npair, name="ks") as kk:
            k = mul(b, kk, i64(2))
            with for_range(b, ZERO, W, name="rs") as r:
                inside = b.icmp_signed("<", r, nrows)
                base = mul(b, add(b, mul(b, p, W), r), rs)

                def element(kx):
                    ok = b.and_(inside, b.icmp_signed("<", kx, kb))
                    idx = b.select(ok, add(b, base, mul(b, kx, cs)), ZERO)
                    return b.select(ok, load(b, src, idx, 2), zero16)
                store(b, pair_word(b, element(k), element(add(b, k, ONE))), words,
                      add(b, mul(b, p, slot), add(b, mul(b, kk, W), r)), 4)
    b.ret_void()
    return fn
