"""The one table of op kinds.  Each entry is defined once: its category (how the scheduler
treats it), arity, dtype rule, which dtypes it accepts, its cost, which scalar args it takes
at run time and which scalar values a graph rewrite tests.  The LLVM emission of each
elementwise op lives in codegen/ops_emit.py, keyed by op name (ir never imports codegen).

Shape rules live with the Tensor API (ops are built on equal shapes; broadcasting is a view).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable
import math

SOURCE, VIEW, ELEMENTWISE, REDUCE, MATMUL, INDEX = "source", "view", "elementwise", "reduce", "matmul", "index"


@dataclass(frozen=True, eq=False)
class OpKind:
    name: str
    category: str
    arity: int = 1
    float_only: bool = False        # integer dtypes raise UnsupportedDTypeForOp
    out_dtype: str = "same"         # "same" | "u8" | "arg" (to_dtype) | "last" (where: on_true's)
    cost: int = 1                   # rough element-ops, for threading decisions
    scalar_args: int = 0            # the arg is a tuple of this many scalars, passed at run time
    arg_class: Callable | None = None   # (arg, dtype) -> what of a scalar arg the kernel is built for
    keyed_scalars: tuple = ()       # scalar operand values a rewrite (passes.py) tests
    doc: str = ""
    extra: dict = field(default_factory=dict)
    vjp: Callable | None = None     # reverse-mode rule (node, grad, srcs, out) -> grad per src; set by set_vjp

    def __repr__(self):
        return f"Op({self.name})"


OPS: dict = {}


def set_vjp(name: str, rule: Callable) -> None:
    """Attach the reverse-mode rule of op `name` to its table entry.  The rules build Tensors, so
    they live above ir (lazycandle/autograd_rules.py) and are attached here by name; the entry
    stays the one place an op's rules are reached through."""
    object.__setattr__(OPS[name], "vjp", rule)


def scalar_class(op: OpKind, value):
    """Which of `op.keyed_scalars` the scalar operand `value` is (None: none of them).  0.0 and
    -0.0 are told apart (x + -0.0 is x, x + 0.0 is not for x = -0.0).  A size of named dims
    (bound at run) is none of them."""
    if not isinstance(value, (int, float)):
        return None
    for c in op.keyed_scalars:
        if value == c and (not isinstance(value, float) or math.copysign(1, value) == math.copysign(1, c)):
            return repr(c)
    return None


def powf_exponent_class(arg, dtype):
    """powf's kernel depends on the exponent through these cases only: 0, 1, 2, -1 and 0.5 get
    their own code; otherwise (finite, integer, odd).  The exponent is taken in the compute
    precision (f32 for f32/f16/bf16, as NumPy rounds a Python scalar to the array's dtype)."""
    import numpy as np
    e = float(arg[0]) if dtype.compute == "double" else float(np.float32(arg[0]))
    if e in (0.0, 1.0, 2.0, -1.0, 0.5):
        return ("e", e)
    finite = math.isfinite(e)
    is_int = finite and e == math.floor(e)
    return ("cls", finite, is_int, is_int and abs(e) < 2.0 ** 53 and int(e) % 2 == 1)


def _op(name, category, **kw) -> OpKind:
    op = OpKind(name, category, **kw)
    OPS[name] = op
    return op


# ---- the table -------------------------------------------------------------------------
# sources and views: no math of their own
_op("buffer", SOURCE, arity=0, doc="realized data")
_op("placeholder", SOURCE, arity=0, doc="graph input bound at Program.run")
_op("const", SOURCE, arity=0, doc="a scalar constant (broadcast by a view)")
_op("view", VIEW, doc="strided view: layout change, no data moves")

# elementwise unary, float only (vector math library)
for _n, _c in (("exp", 8), ("log", 8), ("sin", 12), ("cos", 12), ("tanh", 10), ("erf", 10),
               ("gelu", 14), ("gelu_erf", 14), ("silu", 10), ("sigmoid", 10), ("sqrt", 4), ("recip", 2)):
    _op(_n, ELEMENTWISE, float_only=True, cost=_c)
_op("powf", ELEMENTWISE, float_only=True, cost=16, scalar_args=1, arg_class=powf_exponent_class,
    doc="x ** e, e a runtime scalar (its class is part of the kernel)")
_op("elu", ELEMENTWISE, float_only=True, cost=10, scalar_args=1, doc="alpha a runtime scalar")

# elementwise unary, every compute dtype
for _n in ("neg", "abs", "sqr", "relu", "sign", "ceil", "floor"):
    _op(_n, ELEMENTWISE)
_op("round", ELEMENTWISE, doc="halves away from zero (candle)")
_op("affine", ELEMENTWISE, scalar_args=2, doc="x*mul+add (mul, add runtime scalars)")
_op("clamp", ELEMENTWISE, scalar_args=2, doc="min(max(x, lo), hi) (lo, hi runtime scalars)")
_op("cast", ELEMENTWISE, out_dtype="arg", doc="to_dtype; emitted by the kernel's cast table")

# elementwise binary; keyed_scalars: the rewrites x*1, 1*x, x/1, x+0 / x+(-0.0), x-0 (passes.py)
_op("add", ELEMENTWISE, arity=2, keyed_scalars=(0, -0.0))
_op("sub", ELEMENTWISE, arity=2, keyed_scalars=(0,))
_op("mul", ELEMENTWISE, arity=2, keyed_scalars=(1,))
_op("div", ELEMENTWISE, arity=2, cost=4, keyed_scalars=(1,))
_op("maximum", ELEMENTWISE, arity=2)
_op("minimum", ELEMENTWISE, arity=2)
_op("floordiv", ELEMENTWISE, arity=2, cost=8, doc="floor division like np.floor_divide")
_op("mod", ELEMENTWISE, arity=2, cost=8, doc="modulo with the divisor's sign like np.remainder")
_op("pow", ELEMENTWISE, arity=2, cost=20, doc="np.power with a tensor exponent")
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    _op(_n, ELEMENTWISE, arity=2, out_dtype="u8")
_op("where", ELEMENTWISE, arity=3, out_dtype="last")

CMP_OPS = ("eq", "ne", "lt", "le", "gt", "ge")
BINARY_OPS = ("add", "sub", "mul", "div", "maximum", "minimum", "floordiv", "mod", "pow")

_op("copy", ELEMENTWISE, doc="materialise a view into its own buffer")


# reductions: arg = the reduced dims (sorted tuple); the node keeps them as size-1 dims
@dataclass(frozen=True)
class Reduction:
    """What a reduction computes, for the reduce kernel generator:
    identity  "zero" | "one" | "lowest" | "highest" (the dtype's -inf / +inf, or its integer extremes);
    combine   "add" | "mul" | "max" | "min" (max/min propagate NaN like np.max; arg kinds keep the
              first index on ties);
    acc       "f64" (floats accumulate in f64) | "dtype" (in the input's compute type);
    finish    "none" | "divide_count" (mean) | "index" (argmax/argmin return the position)."""
    identity: str
    combine: str
    acc: str
    finish: str


REDUCTIONS = {
    "sum": Reduction("zero", "add", "f64", "none"),
    "mean": Reduction("zero", "add", "f64", "divide_count"),
    "prod": Reduction("one", "mul", "f64", "none"),
    "max": Reduction("lowest", "max", "dtype", "none"),
    "min": Reduction("highest", "min", "dtype", "none"),
    "argmax": Reduction("lowest", "max", "dtype", "index"),
    "argmin": Reduction("highest", "min", "dtype", "index"),
}
for _n, _r in REDUCTIONS.items():
    _op(_n, REDUCE, out_dtype="u32" if _r.finish == "index" else "same", cost=1, extra={"reduction": _r})


def reduction(name: str) -> Reduction:
    """The definition of reduction `name`; an unknown kind raises."""
    try:
        return REDUCTIONS[name]
    except KeyError:
        raise KeyError(f"unknown reduction {name!r}; known: {sorted(REDUCTIONS)}") from None


_op("matmul", MATMUL, arity=2, doc="batched (..., m, k) @ (..., k, n); batch dims already broadcast equal")
