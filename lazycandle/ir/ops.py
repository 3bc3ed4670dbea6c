"""The one table of op kinds.  Each entry is defined once: its category (how the scheduler
treats it), arity, dtype rule, which dtypes it accepts, and for elementwise ops the LLVM
emission of its math on compute-typed values (scalars or vectors alike).

Shape rules live with the Tensor API (ops are built on equal shapes; broadcasting is a view).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


from ..codegen.llvmutil import call_intrinsic, const, FM_ELEMENTWISE as FM

SOURCE, VIEW, ELEMENTWISE, REDUCE, MATMUL, INDEX = "source", "view", "elementwise", "reduce", "matmul", "index"


@dataclass(frozen=True, eq=False)
class OpKind:
    name: str
    category: str
    arity: int = 1
    float_only: bool = False        # integer dtypes raise UnsupportedDTypeForOp
    out_dtype: str = "same"         # "same" | "u8" | "arg" (to_dtype) | "last" (where: on_true's)
    emit: Callable | None = None    # emit(b, dtype, vals, arg) -> value (compute type of out dtype)
    cost: int = 1                   # rough element-ops, for threading decisions
    doc: str = ""
    extra: dict = field(default_factory=dict)

    def __repr__(self):
        return f"Op({self.name})"


OPS: dict = {}


def _op(name, category, **kw) -> OpKind:
    op = OpKind(name, category, **kw)
    OPS[name] = op
    return op


# ---- emission helpers ------------------------------------------------------------------
def _vmath(fname):
    def emit(b, dt, vals, arg):
        from ..codegen import vmath
        params = arg if isinstance(arg, tuple) else (() if arg is None else (arg,))
        return vmath.emit(b, fname, vals[0], *params)
    return emit


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
        from ..codegen.vmath_core import V
        from ..codegen.vmath_pow import pow_values
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
    x = vals[0]
    mul, add = arg
    if dt.is_float:
        return b.fadd(b.fmul(x, const(x.type, mul), flags=FM), const(x.type, add), flags=FM)
    return b.add(b.mul(x, const(x.type, mul)), const(x.type, add))


def _clamp(b, dt, vals, arg):
    x = vals[0]
    lo, hi = const(x.type, arg[0]), const(x.type, arg[1])
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


# ---- the table -------------------------------------------------------------------------
# sources and views: no math of their own
_op("buffer", SOURCE, arity=0, doc="realized data")
_op("placeholder", SOURCE, arity=0, doc="graph input bound at Program.run")
_op("const", SOURCE, arity=0, doc="a scalar constant (broadcast by a view)")
_op("view", VIEW, doc="strided view: layout change, no data moves")

# elementwise unary, float only (vector math library)
for _n, _c in (("exp", 8), ("log", 8), ("sin", 12), ("cos", 12), ("tanh", 10), ("erf", 10),
               ("gelu", 14), ("gelu_erf", 14), ("silu", 10), ("sigmoid", 10), ("sqrt", 4), ("recip", 2),
               ("powf", 16), ("elu", 10)):
    _op(_n, ELEMENTWISE, float_only=True, emit=_vmath(_n), cost=_c)

# elementwise unary, every compute dtype
_op("neg", ELEMENTWISE, emit=_neg)
_op("abs", ELEMENTWISE, emit=_abs)
_op("sqr", ELEMENTWISE, emit=lambda b, dt, v, a: _arith("fmul", "mul")(b, dt, [v[0], v[0]], a))
_op("relu", ELEMENTWISE, emit=_relu)
_op("sign", ELEMENTWISE, emit=_sign)
_op("ceil", ELEMENTWISE, emit=_rounding("ceil"))
_op("floor", ELEMENTWISE, emit=_rounding("floor"))
_op("round", ELEMENTWISE, emit=_rounding("round"), doc="halves away from zero (candle)")
_op("affine", ELEMENTWISE, emit=_affine, doc="x*mul+add")
_op("clamp", ELEMENTWISE, emit=_clamp)
_op("cast", ELEMENTWISE, out_dtype="arg", doc="to_dtype; emitted by the kernel's cast table")

# elementwise binary
_op("add", ELEMENTWISE, arity=2, emit=_arith("fadd", "add"))
_op("sub", ELEMENTWISE, arity=2, emit=_arith("fsub", "sub"))
_op("mul", ELEMENTWISE, arity=2, emit=_arith("fmul", "mul"))
_op("div", ELEMENTWISE, arity=2, emit=_div, cost=4)
_op("maximum", ELEMENTWISE, arity=2, emit=_max_min(True))
_op("minimum", ELEMENTWISE, arity=2, emit=_max_min(False))
_op("floordiv", ELEMENTWISE, arity=2, emit=_floordiv, cost=8, doc="floor division like np.floor_divide")
_op("mod", ELEMENTWISE, arity=2, emit=_mod, cost=8, doc="modulo with the divisor's sign like np.remainder")
_op("pow", ELEMENTWISE, arity=2, emit=_pow, cost=20, doc="np.power with a tensor exponent")
for _n, _p in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">=")):
    _op(_n, ELEMENTWISE, arity=2, out_dtype="u8", emit=_cmp(_p))
_op("where", ELEMENTWISE, arity=3, out_dtype="last", emit=_where)

CMP_OPS = ("eq", "ne", "lt", "le", "gt", "ge")
BINARY_OPS = ("add", "sub", "mul", "div", "maximum", "minimum", "floordiv", "mod", "pow")

_op("copy", ELEMENTWISE, emit=lambda b, dt, v, a: v[0], doc="materialise a view into its own buffer")

# reductions: arg = the reduced dims (sorted tuple); the node keeps them as size-1 dims
for _n in ("sum", "mean", "prod", "max", "min"):
    _op(_n, REDUCE, out_dtype="same", cost=1)
for _n in ("argmax", "argmin"):
    _op(_n, REDUCE, out_dtype="u32", cost=1)

_op("matmul", MATMUL, arity=2, doc="batched (..., m, k) @ (..., k, n); batch dims already broadcast equal")
