"""The LLVM emission of every elementwise op of the table (ir/ops.py), keyed by op name:
EMIT[name](b, dtype, vals, arg) -> value in the compute type of the output (scalars or
vectors alike).  `vals` are the operands' compute values followed by the op's runtime scalar
args (affine: x, mul, add; clamp: x, lo, hi; elu: x, alpha; powf: x, e); `arg` is the
structural arg the capture kept (powf: the exponent's class).  Comparisons return i1 (the
kernel widens it to u8); cast is emitted by the kernel's cast table."""
from __future__ import annotations

from ..ir.ops import OPS, ELEMENTWISE
from .llvmutil import call_intrinsic, const, FM_ELEMENTWISE as FM


def _vmath(fname):
    def emit(b, dt, vals, arg):
        from . import vmath
        return vmath.emit(b, fname, *vals)
    return emit


def _powf(b, dt, vals, arg):
    """arg: the exponent's class (ops.powf_exponent_class); vals[1] the exponent at run time."""
    from . import vmath
    x, e = vals
    return vmath.emit(b, "powf", x, arg[1] if arg[0] == "e" else vmath.RuntimeExponent(e, *arg[1:]))


def _max_min(pick_max):
    def emit(b, dt, vals, arg):
        x, y = vals
        if dt.is_float:  # like np.maximum: NaN in either operand propagates
            keep_x = b.or_(b.fcmp_ordered(">=" if pick_max else "<=", x, y), b.fcmp_unordered("uno", x, x))
            return b.select(keep_x, x, y)
        cmp = b.icmp_signed if dt.is_signed else b.icmp_unsigned
        return b.select(cmp(">=" if pick_max else "<=", x, y), x, y)
    return emit


def _div(b, dt, vals, arg):
    x, y = vals
    if dt.is_float:
        return b.fdiv(x, y, flags=FM)
    # Integer division truncates toward zero; x/0 -> 0; INT_MIN/-1 wraps (no trap).
    zero, one = const(y.type, 0), const(y.type, 1)
    is_zero = b.icmp_unsigned("==", y, zero)
    if dt.is_signed:
        is_m1 = b.icmp_signed("==", y, const(y.type, -1))
        safe = b.select(b.or_(is_zero, is_m1), one, y)
        q = b.select(is_m1, b.sub(zero, x), b.sdiv(x, safe))
    else:
        q = b.udiv(x, b.select(is_zero, one, y))
    return b.select(is_zero, zero, q)


def _cmp(pred):
    def emit(b, dt, vals, arg, out_type=None):
        x, y = vals
        if dt.is_float:
            c = b.fcmp_unordered("!=", x, y) if pred == "!=" else b.fcmp_ordered(pred, x, y)
        elif dt.is_signed:
            c = b.icmp_signed(pred, x, y)
        else:
            c = b.icmp_unsigned(pred, x, y)
        return c   # i1; the kernel widens it to u8
    return emit


def _neg(b, dt, vals, arg):
    x = vals[0]
    return b.fneg(x) if dt.is_float else b.sub(const(x.type, 0), x)


def _abs(b, dt, vals, arg):
    x = vals[0]
    if dt.is_float:
        return call_intrinsic(b, "fabs", [x])
    if not dt.is_signed:
        return x
    return b.select(b.icmp_signed("<", x, const(x.type, 0)), b.sub(const(x.type, 0), x), x)


def _relu(b, dt, vals, arg):
    x = vals[0]
    if dt.is_float:
        return b.select(b.fcmp_ordered("<", x, const(x.type, 0.0)), const(x.type, 0.0), x)
    if not dt.is_signed:
        return x
    return b.select(b.icmp_signed("<", x, const(x.type, 0)), const(x.type, 0), x)


def _sign(b, dt, vals, arg):
    x = vals[0]
    if dt.is_float:
        pos = b.uitofp(b.fcmp_ordered(">", x, const(x.type, 0.0)), x.type)
        neg = b.uitofp(b.fcmp_ordered("<", x, const(x.type, 0.0)), x.type)
        return b.select(b.fcmp_unordered("uno", x, x), x, b.fsub(pos, neg))
    pos = b.zext(b.icmp_signed(">", x, const(x.type, 0)) if dt.is_signed
                 else b.icmp_unsigned(">", x, const(x.type, 0)), x.type)
    if not dt.is_signed:
        return pos
    return b.sub(pos, b.zext(b.icmp_signed("<", x, const(x.type, 0)), x.type))


def _rounding(intrinsic_name):
    def emit(b, dt, vals, arg):
        return call_intrinsic(b, intrinsic_name, [vals[0]]) if dt.is_float else vals[0]
    return emit


def _affine(b, dt, vals, arg):
    x, mul, add = vals
    if dt.is_float:
        return b.fadd(b.fmul(x, mul, flags=FM), add, flags=FM)
    return b.add(b.mul(x, mul), add)


def _clamp(b, dt, vals, arg):
    x, lo, hi = vals
    y = _max_min(True)(b, dt, [x, lo], None)
    return _max_min(False)(b, dt, [y, hi], None)


def _arith(float_op, int_op):
    def emit(b, dt, vals, arg):
        x, y = vals
        if dt.is_float:
            return getattr(b, float_op)(x, y, flags=FM)
        return getattr(b, int_op)(x, y)
    return emit


def _where(b, dt, vals, arg):
    m, x, y = vals
    return b.select(b.icmp_unsigned("!=", m, const(m.type, 0)), x, y)


def _int_divmod(b, dt, x, y):
    """Floor quotient and modulo of integers like NumPy: x // 0 = x % 0 = 0, INT_MIN // -1
    wraps to INT_MIN (no trap); the modulo takes the divisor's sign."""
    zero, one = const(y.type, 0), const(y.type, 1)
    is_zero = b.icmp_unsigned("==", y, zero)
    if not dt.is_signed:
        safe = b.select(is_zero, one, y)
        return b.select(is_zero, zero, b.udiv(x, safe)), b.select(is_zero, zero, b.urem(x, safe))
    is_m1 = b.icmp_signed("==", y, const(y.type, -1))
    safe = b.select(b.or_(is_zero, is_m1), one, y)
    q = b.select(is_m1, b.sub(zero, x), b.sdiv(x, safe))
    r = b.select(is_m1, zero, b.srem(x, safe))
    adjust = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("!=", b.icmp_signed("<", r, zero),
                                                                 b.icmp_signed("<", y, zero)))
    q = b.select(adjust, b.sub(q, one), q)
    r = b.select(adjust, b.add(r, y), r)
    return b.select(is_zero, zero, q), b.select(is_zero, zero, r)


def _float_divmod(b, x, y):
    """NumPy's npy_divmod: the modulo from fmod (LLVM's frem is exact fmod), moved to the
    divisor's sign; the quotient (x - mod) / y snapped to an integer.  y == 0 gives x / y and
    fmod's NaN, as NumPy does."""
    zero, one = const(y.type, 0.0), const(y.type, 1.0)
    mod = b.frem(x, y)
    div = b.fdiv(b.fsub(x, mod), y)
    mod_nz = b.fcmp_unordered("!=", mod, zero)
    adjust = b.and_(mod_nz, b.xor(b.fcmp_ordered("<", y, zero), b.fcmp_ordered("<", mod, zero)))
    mod = b.select(adjust, b.fadd(mod, y), mod)
    div = b.select(adjust, b.fsub(div, one), div)
    mod = b.select(mod_nz, mod, call_intrinsic(b, "copysign", [zero, y]))
    fl = call_intrinsic(b, "floor", [div])
    fl = b.select(b.fcmp_ordered(">", b.fsub(div, fl), const(y.type, 0.5)), b.fadd(fl, one), fl)
    q = b.select(b.fcmp_unordered("!=", div, zero), fl, call_intrinsic(b, "copysign", [zero, b.fdiv(x, y)]))
    y_zero = b.fcmp_ordered("==", y, zero)
    return b.select(y_zero, b.fdiv(x, y), q), mod


def _floordiv(b, dt, vals, arg):
    x, y = vals
    return (_float_divmod(b, x, y) if dt.is_float else _int_divmod(b, dt, x, y))[0]


def _mod(b, dt, vals, arg):
    x, y = vals
    return (_float_divmod(b, x, y) if dt.is_float else _int_divmod(b, dt, x, y))[1]


def _pow(b, dt, vals, arg):
    x, e = vals
    if dt.is_float:
        from .vmath_core import V
        from .vmath_pow import pow_values
        return pow_values(V(b, x.type), x, e)
    # integers: square-and-multiply over every exponent bit, wrapping like NumPy.  A negative
    # exponent truncates 1 / x^-e toward zero (1 and -1 keep their powers, 0 and the rest give
    # 0), the never-crash rule of integer division.
    zero, one = const(x.type, 0), const(x.type, 1)
    acc, base = one, x
    for i in range(dt.bits):
        bit = b.icmp_unsigned("!=", b.and_(b.lshr(e, const(e.type, i)), one), zero)
        acc = b.select(bit, b.mul(acc, base), acc)
        base = b.mul(base, base)
    if not dt.is_signed:
        return acc
    odd = b.icmp_unsigned("!=", b.and_(e, one), zero)
    minus_one = const(x.type, -1)
    neg_pow = b.select(b.icmp_signed("==", x, one), one,
                       b.select(b.icmp_signed("==", x, minus_one), b.select(odd, minus_one, one), zero))
    return b.select(b.icmp_signed("<", e, zero), neg_pow, acc)


EMIT = {n: _vmath(n) for n in ("exp", "log", "sin", "cos", "tanh", "erf", "gelu", "gelu_erf", "silu", "sigmoid",
                                 "sqrt", "recip", "elu")}
EMIT.update({
    "powf": _powf, "neg": _neg, "abs": _abs, "relu": _relu, "sign": _sign, "affine": _affine, "clamp": _clamp,
    "sqr": lambda b, dt, v, a: _arith("fmul", "mul")(b, dt, [v[0], v[0]], a),
    "ceil": _rounding("ceil"), "floor": _rounding("floor"), "round": _rounding("round"),
    "add": _arith("fadd", "add"), "sub": _arith("fsub", "sub"), "mul": _arith("fmul", "mul"), "div": _div,
    "maximum": _max_min(True), "minimum": _max_min(False), "where": _where, "copy": lambda b, dt, v, a: v[0],
    "eq": _cmp("=="), "ne": _cmp("!="), "lt": _cmp("<"), "le": _cmp("<="), "gt": _cmp(">"), "ge": _cmp(">="),
    "floordiv": _floordiv, "mod": _mod, "pow": _pow,
})
_missing = {n for n, k in OPS.items() if k.category == ELEMENTWISE and n != "cast"} - set(EMIT)
if _missing:
    raise ImportError(f"ops_emit: no emission for elementwise op(s) {sorted(_missing)}")
