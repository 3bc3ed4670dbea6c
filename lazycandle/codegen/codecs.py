"""Conversions between a dtype's storage type and its compute type, for scalars and vectors.

`decode(b, codec, v)` turns stored values (half, or raw integer bits for bf16 / f8 / f6 / f4)
into float (or double, `to=F64`); `encode(b, codec, v)` rounds a float or double value to the
storage format, bit-identical to NumPy / ml_dtypes `astype` for every input, NaN payloads
included; `roundtrip(b, codec, v)` equals decode(encode(v)) bit for bit but stays in float and
is cheaper: it runs after every op of a low-precision chain so that fusion never changes a value.
The codec name comes from the dtype table (DType.codec).  Everything is branch-free integer /
float arithmetic and selects (no libcalls), so it vectorises inside a fused loop; f32 paths are
unaffected by FTZ/DAZ.

The ml_dtypes 0.6 rules reproduced here (the tests check them bit for bit):
* bf16 / half / f8e4m3 / f6 / f4: round to nearest even, target subnormals included.
* NaN: half keeps NumPy's payload (sign | 0x7c00 | mantissa >> 13, never 0x7c00, no quieting;
  NumPy also widens half NaNs without quieting), bf16 gives sign | 0x7fc0, f8e4m3 sign | 0x7f;
  f6 / f4 have no NaN and give a zero with the NaN's sign inverted (+NaN -> -0, -NaN -> +0:
  their quiet_NaN() is the -0 pattern).
* overflow and +-inf: bf16 / half give +-inf, f8e4m3 +-NaN (|x| > 464), f6 / f4 saturate.
* f8e8m0 (unsigned powers of two, no zero): rounds half *up* (1.5 -> 2, 3 -> 4); 0 < x <= 2^-127
  gives 2^-127 and 2^-127 < x < 2^-126 gives 2^-126; zero, negatives (-0 too), inf, NaN and
  x >= 1.5 * 2^127 give NaN (0xff).
* double input: ml_dtypes converts double -> float -> codec (two roundings; e.g. f8e8m0 of 1e-300
  is NaN because the float is 0) and so does encode by default; NumPy's half rounds once.
  `encode(..., single_rounding=True)` rounds double input once for every codec.
* decoding an f6 / f4 byte with bits above the format set: ml_dtypes takes any of them as the
  sign (f6 byte 0x40 is -0.0); reproduced, so all 256 bytes decode like ml_dtypes.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import llvmlite.ir as ir

from .llvmutil import F16, F32, F64, I8, I16, I32, I64, call_intrinsic, const, scalar_type, vec, width_of


def _fbits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _is_double(v) -> bool:
    return isinstance(scalar_type(v.type), ir.DoubleType)


def _bits(b, v):
    """float / double value(s) -> i32 / i64 bits."""
    it = I64 if _is_double(v) else I32
    return b.bitcast(v, vec(it, width_of(v.type)))


def _float(b, x):
    return b.bitcast(x, vec(F32, width_of(x.type)))


def _isnan(b, v):
    return b.fcmp_unordered("uno", v, v)


def _to_f32(b, v, single_rounding: bool):
    """double -> float: plain RNE fptrunc (what ml_dtypes does), or round-to-odd, after which
    one more RNE rounding to any format with at least 2 fewer significand bits equals rounding
    the double once (the odd last bit acts as a sticky bit)."""
    w = width_of(v.type)
    t = b.fptrunc(v, vec(F32, w))
    if not single_rounding:
        return t
    back = b.fpext(t, vec(F64, w))
    t32 = vec(I32, w)
    inexact = b.zext(b.fcmp_ordered("!=", v, back), t32)
    # |t| > |v| means RNE rounded away from zero: step back one ulp (truncation), then set
    # the last bit if anything was dropped.  Covers t = inf (-> FLT_MAX) and t = 0 (-> 1 ulp).
    away = b.zext(b.fcmp_ordered(">", call_intrinsic(b, "fabs", [back]), call_intrinsic(b, "fabs", [v])), t32)
    tb = b.or_(b.sub(_bits(b, t), away), inexact)
    return _float(b, tb)


# ---------------------------------------------------------------- half (LLVM half storage)

def _decode_half(b, v):
    w = width_of(v.type)
    t32 = vec(I32, w)
    y = b.fpext(v, vec(F32, w))
    # NumPy widens a NaN without quieting it (sNaN stays sNaN): rebuild the mantissa.
    h = b.zext(b.bitcast(v, vec(I16, w)), t32)
    nan = b.or_(b.and_(_bits(b, y), const(t32, 0xFF800000)), b.shl(b.and_(h, const(t32, 0x3FF)), const(t32, 13)))
    return b.select(_isnan(b, y), _float(b, nan), y)


def _half_nan(b, sign16, payload, w):
    """NumPy's half NaN: sign | 0x7c00 | payload, with payload 0 bumped to 1."""
    t16 = vec(I16, w)
    p = b.trunc(call_intrinsic(b, "umax", [payload, const(payload.type, 1)]), t16)
    return b.bitcast(b.or_(b.or_(sign16, const(t16, 0x7C00)), p), vec(F16, w))


def _encode_half(b, v):
    w = width_of(v.type)
    t32 = vec(I32, w)
    bits = _bits(b, v)
    sign = b.and_(b.trunc(b.lshr(bits, const(t32, 16)), vec(I16, w)), const(vec(I16, w), 0x8000))
    nan = _half_nan(b, sign, b.lshr(b.and_(bits, const(t32, 0x7FFFFF)), const(t32, 13)), w)
    return b.select(_isnan(b, v), nan, b.fptrunc(v, vec(F16, w)))


def _encode_half_f64(b, v):
    """NumPy rounds double -> half once: round-to-odd to float, then the hardware conversion."""
    w = width_of(v.type)
    t64 = vec(I64, w)
    bits = _bits(b, v)
    sign = b.and_(b.trunc(b.lshr(bits, const(t64, 48)), vec(I16, w)), const(vec(I16, w), 0x8000))
    nan = _half_nan(b, sign, b.lshr(b.and_(bits, const(t64, (1 << 52) - 1)), const(t64, 42)), w)
    return b.select(_isnan(b, v), nan, b.fptrunc(_to_f32(b, v, True), vec(F16, w)))


def _roundtrip_half(b, v):
    w = width_of(v.type)
    t32 = vec(I32, w)
    y = b.fpext(b.fptrunc(v, vec(F16, w)), vec(F32, w))
    bits = _bits(b, v)
    # A NaN comes back with the low 13 mantissa bits cleared (payload 0 becomes 1 << 13).
    m = call_intrinsic(b, "umax", [b.and_(bits, const(t32, 0x7FE000)), const(t32, 0x2000)])
    nan = b.or_(b.and_(bits, const(t32, 0xFF800000)), m)
    return b.select(_isnan(b, v), _float(b, nan), y)


# ---------------------------------------------------------------- bf16 (i16 bits)

def _decode_bf16(b, v):
    w = width_of(v.type)
    x = b.shl(b.zext(v, vec(I32, w)), const(vec(I32, w), 16))
    return _float(b, x)


def _bf16_round(b, v):
    """f32 bits rounded to nearest even at bit 16 (low 16 bits garbage), and the NaN bits."""
    t32 = vec(I32, width_of(v.type))
    bits = _bits(b, v)
    lsb = b.and_(b.lshr(bits, const(t32, 16)), const(t32, 1))
    rounded = b.add(b.add(bits, const(t32, 0x7FFF)), lsb)
    nan = b.or_(b.and_(bits, const(t32, 0x80000000)), const(t32, 0x7FC00000))
    return b.select(_isnan(b, v), nan, rounded)


def _encode_bf16(b, v):
    w = width_of(v.type)
    return b.trunc(b.lshr(_bf16_round(b, v), const(vec(I32, w), 16)), vec(I16, w))


def _roundtrip_bf16(b, v):
    w = width_of(v.type)
    return _float(b, b.and_(_bf16_round(b, v), const(vec(I32, w), 0xFFFF0000)))


# ---------------------------------------------------------------- signed minifloats (i8 bits)

@dataclass(frozen=True)
class _Mini:
    """A sign-magnitude minifloat without infinities, stored in the low `bits` of a byte.
    has_nan: e4m3fn style (all-ones magnitude is NaN; overflow and inf give NaN); otherwise
    OCP MX style (no NaN: overflow and inf saturate, NaN gives a zero)."""
    bits: int
    man: int
    bias: int
    has_nan: bool

    @property
    def magmask(self):           # magnitude bits; also the code overflow gives (NaN or max)
        return (1 << (self.bits - 1)) - 1

    def value(self, code):       # magnitude code -> value (code may be one past the top)
        e, m = code >> self.man, code & ((1 << self.man) - 1)
        if e == 0:
            return m * 2.0 ** (1 - self.bias - self.man)
        return ((1 << self.man) + m) * 2.0 ** (e - self.bias - self.man)

    @property
    def maxcode(self):
        return self.magmask - 1 if self.has_nan else self.magmask

    @property
    def ovf_ge(self):
        """Smallest f32 magnitude bits that round past the largest finite value."""
        top = self.maxcode
        mid = (self.value(top) + self.value(top + 1)) / 2
        return _fbits(mid) + (0 if top & 1 else 1)      # an exact tie rounds to the even code

    @property
    def sub_lt(self):            # f32 bits below this are subnormal (or zero) in the target
        return (128 - self.bias) << 23

    @property
    def magic(self):             # 2^k whose f32 ulp is the target's smallest subnormal
        return 2.0 ** (24 - self.bias - self.man)


MINI = {
    "f8e4m3": _Mini(8, 3, 7, True),      # float8_e4m3fn
    "f6e2m3": _Mini(6, 3, 1, False),     # float6_e2m3fn
    "f6e3m2": _Mini(6, 2, 3, False),     # float6_e3m2fn
    "f4e2m1": _Mini(4, 1, 1, False),     # float4_e2m1fn
}


def _mini_decode(fmt: _Mini):
    def dec(b, v):
        w = width_of(v.type)
        t32 = vec(I32, w)
        c = lambda x: const(t32, x)
        x = b.zext(v, t32)
        mag = b.and_(x, c(fmt.magmask))
        bits = b.add(b.shl(mag, c(23 - fmt.man)), c((127 - fmt.bias) << 23))
        # Exponent field 0: bits read 2^-bias * (1 + m / 2^man); one exponent step up and
        # subtracting the implicit one gives the subnormal m * 2^(1 - bias - man) exactly.
        sub = b.fsub(_float(b, b.add(bits, c(1 << 23))), const(vec(F32, w), 2.0 ** (1 - fmt.bias)))
        f = b.select(b.icmp_unsigned("<", mag, c(1 << fmt.man)), _bits(b, sub), bits)
        if fmt.has_nan:
            f = b.select(b.icmp_unsigned("==", mag, c(fmt.magmask)), c(0x7FC00000), f)
        # Any bit above the magnitude is the sign (ml_dtypes' rule for f6 / f4 bytes).
        neg = b.icmp_unsigned(">", x, c(fmt.magmask))
        return _float(b, b.or_(f, b.select(neg, c(0x80000000), c(0))))
    return dec


def _mini_common(b, fmt: _Mini, v):
    w = width_of(v.type)
    t32 = vec(I32, w)
    bits = _bits(b, v)
    a = b.and_(bits, const(t32, 0x7FFFFFFF))
    # Subnormal range: adding `magic` makes the FPU round |v| to a multiple of the smallest
    # subnormal (RNE) in the low mantissa bits.
    s = b.fadd(_float(b, a), const(vec(F32, w), fmt.magic))
    return t32, bits, a, s


def _mini_encode(fmt: _Mini):
    def enc(b, v):
        t32, bits, a, s = _mini_common(b, fmt, v)
        c = lambda x: const(t32, x)
        sh = 23 - fmt.man
        sub = b.sub(_bits(b, s), c(_fbits(fmt.magic)))
        # Normal range: rebias the exponent and round the mantissa to nearest even in one add.
        odd = b.and_(b.lshr(a, c(sh)), c(1))
        nrm = b.lshr(b.add(b.add(a, c(((fmt.bias - 127) << 23) + (1 << (sh - 1)) - 1)), odd), c(sh))
        r = b.select(b.icmp_unsigned("<", a, c(fmt.sub_lt)), sub, nrm)
        r = b.select(b.icmp_unsigned(">=", a, c(fmt.ovf_ge)), c(fmt.magmask), r)   # inf, NaN too
        if not fmt.has_nan:
            r = b.select(b.icmp_unsigned(">", a, c(0x7F800000)), c(1 << (fmt.bits - 1)), r)
        # xor, not or: flips the NaN zero's sign the way ml_dtypes does
        r = b.xor(r, b.and_(b.lshr(bits, c(32 - fmt.bits)), c(1 << (fmt.bits - 1))))
        return b.trunc(r, vec(I8, width_of(v.type)))
    return enc


def _mini_roundtrip(fmt: _Mini):
    def rt(b, v):
        t32, bits, a, s = _mini_common(b, fmt, v)
        c = lambda x: const(t32, x)
        sh = 23 - fmt.man
        sub = _bits(b, b.fsub(s, const(vec(F32, width_of(v.type)), fmt.magic)))
        odd = b.and_(b.lshr(a, c(sh)), c(1))
        nrm = b.and_(b.add(b.add(a, c((1 << (sh - 1)) - 1)), odd), c(~((1 << sh) - 1) & 0xFFFFFFFF))
        r = b.select(b.icmp_unsigned("<", a, c(fmt.sub_lt)), sub, nrm)
        top = 0x7FC00000 if fmt.has_nan else _fbits(fmt.value(fmt.maxcode))
        r = b.select(b.icmp_unsigned(">=", a, c(fmt.ovf_ge)), c(top), r)
        if not fmt.has_nan:
            r = b.select(b.icmp_unsigned(">", a, c(0x7F800000)), c(0x80000000), r)
        return _float(b, b.xor(r, b.and_(bits, c(0x80000000))))
    return rt


# ---------------------------------------------------------------- f8e8m0 (i8 bits)

def _decode_e8m0(b, v):
    w = width_of(v.type)
    t32 = vec(I32, w)
    x = b.zext(v, t32)
    f = b.select(b.icmp_unsigned("==", x, const(t32, 0)), const(t32, 0x00400000), b.shl(x, const(t32, 23)))
    f = b.select(b.icmp_unsigned("==", x, const(t32, 255)), const(t32, 0x7FC00000), f)
    return _float(b, f)


def _encode_e8m0(b, v):
    w = width_of(v.type)
    t32 = vec(I32, w)
    c = lambda x: const(t32, x)
    bits = _bits(b, v)
    # Rounds half up: a mantissa >= 0.5 carries into the exponent (finite inputs stay <= 255).
    r = b.lshr(b.add(bits, c(0x400000)), c(23))
    r = b.select(b.icmp_unsigned("==", bits, c(0x400000)), c(0), r)     # exactly 2^-127
    # zero, negative (-0 too), inf and NaN: bits - 1 wraps every one of them above FLT_MAX - 1
    r = b.select(b.icmp_unsigned(">=", b.sub(bits, c(1)), c(0x7F7FFFFF)), c(255), r)
    return b.trunc(r, vec(I8, w))


# ---------------------------------------------------------------- tables and entry points

DECODERS = {"half": _decode_half, "bf16": _decode_bf16, "f8e8m0": _decode_e8m0}
ENCODERS = {"half": _encode_half, "bf16": _encode_bf16, "f8e8m0": _encode_e8m0}   # float input
ROUNDTRIPS = {"half": _roundtrip_half, "bf16": _roundtrip_bf16}
for _name, _fmt in MINI.items():
    DECODERS[_name] = _mini_decode(_fmt)
    ENCODERS[_name] = _mini_encode(_fmt)
    ROUNDTRIPS[_name] = _mini_roundtrip(_fmt)


def decode(b: ir.IRBuilder, codec: str, v, to: ir.Type = F32):
    """Stored value(s) -> float (or, with to=F64, double) value(s), exactly like astype."""
    f = DECODERS[codec](b, v)
    if isinstance(to, ir.FloatType):
        return f
    if not isinstance(to, ir.DoubleType):
        raise TypeError(f"decode: cannot decode to {to}")
    w = width_of(v.type)
    d = b.fpext(f, vec(F64, w))
    if codec != "half":
        return d
    # NumPy widens a half NaN straight to double without quieting it.
    t64 = vec(I64, w)
    mant = b.shl(b.zext(b.and_(_bits(b, f), const(vec(I32, w), 0x7FFFFF)), t64), const(t64, 29))
    nan = b.or_(b.and_(_bits(b, d), const(t64, 0xFFF0000000000000)), mant)
    return b.select(_isnan(b, d), b.bitcast(nan, vec(F64, w)), d)


def encode(b: ir.IRBuilder, codec: str, v, single_rounding: bool = False):
    """float (or double) value(s) -> stored value(s), exactly like astype.  For double input
    ml_dtypes rounds twice (double -> float -> codec) and so does this by default;
    single_rounding=True rounds double input once.  half always rounds once (like NumPy)."""
    if _is_double(v):
        if codec == "half":
            return _encode_half_f64(b, v)
        v = _to_f32(b, v, single_rounding)
    return ENCODERS[codec](b, v)


def roundtrip(b: ir.IRBuilder, codec: str, v):
    """Round float value(s) to the codec's precision, staying in float: bit-identical to
    decode(encode(v)) (NaN patterns included) but cheaper."""
    if _is_double(v):
        raise TypeError("roundtrip: float input only")
    fn = ROUNDTRIPS.get(codec)
    return fn(b, v) if fn else decode(b, codec, encode(b, codec, v))
