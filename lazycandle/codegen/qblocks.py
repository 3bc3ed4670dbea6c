"""LLVM readers of GGML blocks (formats in ir/qformats.py), shared by dequantize and qmatmul.

`chunk(b, fmt, block_ptr, c)` unpacks the c-th run of 32 values of one block into
  vals   <32 x i8>: the integer codes, signed (centred: q - 8, q - 16, q - 32) or unsigned (0..15)
  signed whether vals are signed (else unsigned, for pmaddubsw's unsigned operand)
  scales (s0, s1): float scale of values 0..15 and 16..31 (equal except for q6_k)
  coef   float added to every value (q4_1's m, q4_k's -dmin*m) or None
so value j = float(vals[j]) * s(j) + coef, evaluated in exactly llama.cpp's dequantize_row_*
order (one product, then one add), so dequantize is bit-identical to GGML's."""
from __future__ import annotations

import llvmlite.ir as ir

from .llvmutil import F16, F32, I1, I8, I16, I32, const

V16 = ir.VectorType(I8, 16)
V32 = ir.VectorType(I8, 32)


def load_at(b, base, offset: int, t: ir.Type):
    """A value of type t at byte `offset` from the i8* `base` (unaligned)."""
    p = b.gep(base, [I32(offset)], inbounds=True) if offset else base
    return b.load(b.bitcast(p, t.as_pointer()), align=1)


def half_at(b, base, offset: int):
    """The f16 at `offset`, widened to float (exact; a NaN stays a NaN, payload not kept)."""
    return b.fpext(b.bitcast(load_at(b, base, offset, I16), F16), F32)


def _cat16(b, lo, hi):
    return b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 32), list(range(32))))


def _nibbles(b, q16, high: bool):
    """<16 x i8> of the low (or high) nibbles of q16."""
    return b.lshr(q16, const(V16, 4)) if high else b.and_(q16, const(V16, 0xF))


def _bits_to_bytes(b, word):
    """<32 x i8> whose lane j is bit j of the i32 `word` (0 or 1)."""
    return b.zext(b.bitcast(word, ir.VectorType(I1, 32)), V32)


def _splat8(b, x, t=F32):
    v8 = ir.VectorType(t, 8)
    return b.shuffle_vector(b.insert_element(ir.Constant(v8, ir.Undefined), x, I32(0)),
                            ir.Constant(v8, ir.Undefined), ir.Constant(ir.VectorType(I32, 8), [0] * 8))


def _scales_mins_k4(b, blk):
    """(d * sc, dmin * m) of a q4_k block's 8 sub-blocks as <8 x float> (get_scale_min_k4 on all
    eight at once; identical in every chunk of the block, so LLVM keeps one)."""
    v8 = ir.VectorType(I8, 8)
    s = load_at(b, blk, 4, V16)                         # bytes 4..19: the 12 scale bytes (+4 of qs)

    def pick(idx):
        return b.shuffle_vector(s, s, ir.Constant(ir.VectorType(I32, 8), idx))
    lo = ir.Constant(ir.VectorType(I1, 8), [1] * 4 + [0] * 4)
    c8 = lambda v: ir.Constant(v8, [v] * 8)
    a, c = pick([0, 1, 2, 3, 8, 9, 10, 11]), pick([4, 5, 6, 7, 8, 9, 10, 11])
    hi_sc = b.shl(b.lshr(pick([0, 0, 0, 0, 0, 1, 2, 3]), c8(6)), c8(4))
    hi_m = b.shl(b.lshr(pick([0, 0, 0, 0, 4, 5, 6, 7]), c8(6)), c8(4))
    sc = b.select(lo, b.and_(a, c8(63)), b.or_(b.and_(a, c8(0xF)), hi_sc))
    m = b.select(lo, b.and_(c, c8(63)), b.or_(b.lshr(c, c8(4)), hi_m))
    f8 = ir.VectorType(F32, 8)
    return (b.fmul(_splat8(b, half_at(b, blk, 0)), b.uitofp(sc, f8)),
            b.fmul(_splat8(b, half_at(b, blk, 2)), b.uitofp(m, f8)))


def chunk(b, fmt: str, blk, c: int, centred: bool = True):
    """(vals, signed, (s0, s1), coef) of chunk c of the block at i8* `blk` (see the module doc).
    centred=False gives q4_0 / q5_0 as unsigned codes with the offset in coef (-8 d, -16 d): one
    integer op less per block for dot products (not GGML's dequantize rounding)."""
    if fmt == "q8_0":
        d = half_at(b, blk, 0)
        return load_at(b, blk, 2, V32), True, (d, d), None
    if fmt in ("q4_0", "q4_1"):
        off = 2 if fmt == "q4_0" else 4
        q = load_at(b, blk, off, V16)
        v = _cat16(b, _nibbles(b, q, False), _nibbles(b, q, True))
        d = half_at(b, blk, 0)
        if fmt == "q4_0":
            if not centred:
                return v, False, (d, d), b.fmul(d, ir.Constant(F32, -8.0))
            return b.sub(v, const(V32, 8)), True, (d, d), None
        return v, False, (d, d), half_at(b, blk, 2)
    if fmt == "q5_0":
        q = load_at(b, blk, 6, V16)
        v = _cat16(b, _nibbles(b, q, False), _nibbles(b, q, True))
        v = b.or_(v, b.shl(_bits_to_bytes(b, load_at(b, blk, 2, I32)), const(V32, 4)))
        d = half_at(b, blk, 0)
        if not centred:
            return v, False, (d, d), b.fmul(d, ir.Constant(F32, -16.0))
        return b.sub(v, const(V32, 16)), True, (d, d), None
    if fmt == "q4_k":
        q = load_at(b, blk, 16 + 32 * (c // 2), V32)
        v = b.lshr(q, const(V32, 4)) if c % 2 else b.and_(q, const(V32, 0xF))
        scs, mins = _scales_mins_k4(b, blk)
        s = b.extract_element(scs, I32(c))
        coef = b.fsub(ir.Constant(F32, -0.0), b.extract_element(mins, I32(c)))
        return v, False, (s, s), coef
    if fmt == "q6_k":
        n, t = divmod(c, 4)
        ql = load_at(b, blk, n * 64 + (32 if t % 2 else 0), V32)
        ql = b.lshr(ql, const(V32, 4)) if t >= 2 else b.and_(ql, const(V32, 0xF))
        qh = load_at(b, blk, 128 + n * 32, V32)
        qh = b.shl(b.and_(b.lshr(qh, const(V32, 2 * t)), const(V32, 3)), const(V32, 4))
        v = b.sub(b.or_(ql, qh), const(V32, 32))
        d = half_at(b, blk, 208)
        # all 16 scales as one vector (identical in every chunk of the block: LLVM keeps one)
        sc = b.sitofp(load_at(b, blk, 192, V16), ir.VectorType(F32, 16))
        sc = b.fmul(sc, b.shuffle_vector(b.insert_element(ir.Constant(ir.VectorType(F32, 16), ir.Undefined), d, I32(0)),
                                         ir.Constant(ir.VectorType(F32, 16), ir.Undefined),
                                         ir.Constant(ir.VectorType(I32, 16), [0] * 16)))
        k = n * 8 + 2 * t
        return v, True, (b.extract_element(sc, I32(k)), b.extract_element(sc, I32(k + 1))), None
    raise KeyError(fmt)


def chunk_floats(b, fmt: str, blk, c: int):
    """The 32 values of chunk c as four <8 x float> (values 8k..8k+7), GGML's rounding."""
    vals, signed, (s0, s1), coef = chunk(b, fmt, blk, c)
    v8 = ir.VectorType(F32, 8)
    conv = b.sitofp if signed else b.uitofp
    f = conv(vals, ir.VectorType(F32, 32))
    out = []
    for k in range(4):
        part = b.shuffle_vector(f, f, ir.Constant(ir.VectorType(I32, 8), list(range(8 * k, 8 * k + 8))))
        s = s0 if k < 2 else s1
        sv = b.insert_element(ir.Constant(v8, ir.Undefined), s, I32(0))
        sv = b.shuffle_vector(sv, sv, ir.Constant(ir.VectorType(I32, 8), [0] * 8))
        y = b.fmul(part, sv)
        if coef is not None:
            cv = b.insert_element(ir.Constant(v8, ir.Undefined), coef, I32(0))
            y = b.fadd(y, b.shuffle_vector(cv, cv, ir.Constant(ir.VectorType(I32, 8), [0] * 8)))
        out.append(y)
    return out
