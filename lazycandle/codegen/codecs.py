"""Conversions between a dtype's storage type and its compute type, for scalars and vectors.

`decode(b, codec, v)` turns stored values (half, or raw integer bits for bf16 / f8 / f6 / f4)
into the compute type (float); `encode(b, codec, v)` rounds a float (or double) value to the
storage format, round-to-nearest-even, bit-identical to ml_dtypes; `roundtrip` is
decode(encode(v)) done as cheaply as possible, used after every op of a low-precision chain so
that fusion never changes a value.  The codec name comes from the dtype table (DType.codec).
"""
from __future__ import annotations

import llvmlite.ir as ir

from .llvmutil import F16, F32, I16, I32, vec, width_of, scalar_type, const


def _f32_bits(b, v):
    return b.bitcast(v, vec(I32, width_of(v.type)))


def _decode_half(b, v):
    return b.fpext(v, vec(F32, width_of(v.type)))


def _encode_half(b, v):
    return b.fptrunc(v, vec(F16, width_of(v.type)))


def _decode_bf16(b, v):
    w = width_of(v.type)
    x = b.shl(b.zext(v, vec(I32, w)), const(vec(I32, w), 16))
    return b.bitcast(x, vec(F32, w))


def _encode_bf16(b, v):
    w = width_of(v.type)
    if isinstance(scalar_type(v.type), ir.DoubleType):
        raise NotImplementedError("bf16 encode from double")  # TODO(codecs): single rounding from f64
    bits = _f32_bits(b, v)
    t32 = vec(I32, w)
    lsb = b.and_(b.lshr(bits, const(t32, 16)), const(t32, 1))
    rounded = b.lshr(b.add(b.add(bits, const(t32, 0x7FFF)), lsb), const(t32, 16))
    quiet = b.or_(b.lshr(bits, const(t32, 16)), const(t32, 0x40))
    isnan = b.fcmp_unordered("uno", v, v)
    return b.trunc(b.select(isnan, quiet, rounded), vec(I16, w))


DECODERS = {"half": _decode_half, "bf16": _decode_bf16}
ENCODERS = {"half": _encode_half, "bf16": _encode_bf16}


def decode(b: ir.IRBuilder, codec: str, v):
    """Stored value(s) -> float value(s)."""
    return DECODERS[codec](b, v)


def encode(b: ir.IRBuilder, codec: str, v):
    """float (or double) value(s) -> stored value(s), rounded to nearest even."""
    return ENCODERS[codec](b, v)


def roundtrip(b: ir.IRBuilder, codec: str, v):
    """Round float value(s) to the codec's precision, staying in float."""
    return decode(b, codec, encode(b, codec, v))
