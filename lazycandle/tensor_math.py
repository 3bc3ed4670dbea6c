"""Elementwise ops of the Tensor API: unary, binary (+ broadcast_ forms and operators),
comparisons, where_cond, affine/clamp/powf/elu and to_dtype.  Every op validates shapes and
dtypes here, at the user's call, and adds one node."""
from __future__ import annotations

import numbers
from struct import pack as _struct_pack, unpack as _struct_unpack

import numpy as np

from . import dtype as D
from .dtype import as_dtype
from .errors import (DTypeMismatchBinaryOp, ShapeMismatchBinaryOp, UnsupportedDType,
                     UnsupportedDTypeForOp)
from .ir.node import Node, broadcast_scalar
from .ir.ops import OPS
from .layout import scalar_broadcast
from .named_dims import require, require_eq
from .sizes import has_size, same
from .sizes import Size
from .tensor_views import broadcast_shapes, shape_desc


def check_dtype(op: str, dt, shape=None, *, name=None) -> None:
    """Raise UnsupportedDTypeForOp when `op` cannot compute in `dt` (the message names the
    operand's shape when given, and the op as `name` when the user called it so: broadcast_add)."""
    if dt.storage_only:
        raise UnsupportedDTypeForOp(f"{name or op}: dtype {dt.name} is storage-only (no arithmetic){_where(shape)}")
    kind = OPS.get(op)
    if kind is not None and kind.float_only and not dt.is_float:
        raise UnsupportedDTypeForOp(f"{name or op}: not supported for integer dtype {dt.name}{_where(shape)}")


def _where(shape) -> str:
    return f" (shape {tuple(shape)})" if shape is not None else ""


def as_scalar(x):
    """A Python / NumPy real scalar or a 0-d array as a Python int or float (None for anything
    else).  Such an operand acts like a Python scalar: it takes the tensor's dtype (torch's
    rule; no promotion), so `f32 tensor + np.float64(1)` is f32."""
    cls = x.__class__
    if cls is float or cls is int:      # the common case, without the ABC checks below
        return x
    if isinstance(x, np.ndarray):
        if x.ndim:
            return None
        x = x[()]
    if cls is Size:         # a size of named dims: a runtime scalar, its value bound at run
        return x
    if isinstance(x, (bool, np.bool_, numbers.Integral)):
        return x if isinstance(x, int) and not isinstance(x, bool) else int(x)
    if isinstance(x, numbers.Real):
        return float(x)
    if isinstance(x, np.generic) and D._BY_NUMPY.get(x.dtype) is not None:   # ml_dtypes' floats
        return float(x)
    return None


def const_node(value, dtype: D.DType) -> Node:
    return Node(_CONST, (), scalar_in_dtype(value, dtype), (), dtype)


_CONST = OPS["const"]


def _scalar_node(value, dt: D.DType, shape: tuple) -> Node:
    """`value` as a node of `shape` and `dt`: a scalar node broadcast by a view (what
    `lc.full` builds; a storage-only dtype gets its data built now)."""
    if dt.storage_only:
        from .tensor import full
        return full(value, shape, dt)._node
    if not shape:
        return const_node(value, dt)
    layout, label = scalar_broadcast(shape)
    return broadcast_scalar(scalar_in_dtype(value, dt), dt, shape, layout, label)


def scalar_in_dtype(value, dtype: D.DType):
    """A Python scalar as the exact value it takes in `dtype` (float scalars with integer dtypes
    truncate toward zero; integers wrap)."""
    fmt = dtype.struct_format
    if value.__class__ is float and fmt is not None:      # the common case, checked first
        try:
            return _struct_unpack(fmt, _struct_pack(fmt, value))[0]
        except OverflowError:       # rounds past the dtype's largest finite value: below
            pass
    if value.__class__ is Size:     # evaluated when the sizes are bound (named_dims.bind)
        if dtype.storage_only:
            raise UnsupportedDTypeForOp(f"scalar: dtype {dtype.name} is storage-only")
        return value
    if isinstance(value, (bool, np.bool_)):
        value = int(value)
    if dtype.is_int:
        if isinstance(value, (float, np.floating)):
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError(f"cannot use {value} as a {dtype.name} scalar")
            value = int(value)   # truncates toward zero
        value = int(value)
        m = 1 << dtype.bits
        value %= m
        if dtype.is_signed and value >= m >> 1:
            value -= m
        return value
    if dtype.storage_only:
        raise UnsupportedDTypeForOp(f"scalar: dtype {dtype.name} is storage-only")
    value = float(value)
    if dtype.struct_format is not None:
        try:            # struct rounds to nearest-even as NumPy's cast does, without NumPy's overhead
            return _struct_unpack(dtype.struct_format, _struct_pack(dtype.struct_format, value))[0]
        except OverflowError:       # rounds past the dtype's largest finite value: NumPy gives inf
            pass
    return float(np.asarray(value).astype(dtype.numpy))


def _is_scalar(x) -> bool:
    return as_scalar(x) is not None


def as_operand(x, T):
    """A tensor operand of an operator: a Tensor as is, an ndarray of rank >= 1 converted by
    `lc.tensor` (a copy with its own dtype), else None (scalars are handled by the caller)."""
    if isinstance(x, T):
        return x
    if isinstance(x, np.ndarray):
        from .tensor import tensor
        return tensor(x)
    return None


class MathMixin:
    __slots__ = ()

    # ---- building blocks ---------------------------------------------------------------
    def _unary(self, op, arg=None):
        node, kind = self._node, OPS[op]
        dt = node.dtype
        if dt.storage_only or (kind.float_only and not dt.is_float):
            check_dtype(op, dt, node.shape)         # raises
        return type(self)(Node(kind, (node,), arg, node.shape, dt))

    def _scalar_like(self, value):
        """`value` as a constant of this tensor's shape and dtype: what `lc.full` builds (a
        scalar node broadcast by a view) without validating again a shape and dtype the
        tensor already has."""
        node = self._node
        return type(self)(_scalar_node(value, node.dtype, node.shape))

    def _broadcast_binary(self, op, other):
        """The broadcast_<op> method: `_binary` broadcasting, its errors naming broadcast_<op>."""
        return self._binary(op, other, True, name=f"broadcast_{op}")

    def _binary(self, op, other, broadcast: bool, reflected=False, name=None):
        """`name`: the op as the user called it (broadcast_add), for error messages."""
        T, kind = type(self), OPS[op]
        scalar = as_scalar(other)
        if scalar is not None:          # the constant takes this tensor's shape and dtype
            node = self._node
            dt = node.dtype
            if dt.storage_only or (kind.float_only and not dt.is_float):
                check_dtype(op, dt, node.shape, name=name)      # raises
            c = _scalar_node(scalar, dt, node.shape)
            a, b = (c, node) if reflected else (node, c)
        else:
            other = as_operand(other, T)
            if other is None:
                return NotImplemented
            a, b = (other, self) if reflected else (self, other)
            if a.dtype is not b.dtype:
                raise DTypeMismatchBinaryOp(f"{name or op}: dtype mismatch lhs {a.dtype.name} rhs {b.dtype.name} "
                                            f"(shapes {a.shape} and {b.shape})")
            check_dtype(op, a.dtype, a.shape, name=name)
            checks = None
            try:
                differ = a.shape != b.shape
            except TypeError:       # (lc.SymbolicSizeError) sizes of named dims that may differ
                differ = not same(a.shape, b.shape)
            if differ:
                if not broadcast:
                    if not has_size(a.shape + b.shape) or len(a.shape) != len(b.shape):
                        raise ShapeMismatchBinaryOp(f"{op}: shape mismatch lhs {a.shape} rhs {b.shape} "
                                                    f"(dtype {a.dtype.name})")
                    checks = []
                    for da, db in zip(a.shape, b.shape):
                        require_eq(checks, da, db, ShapeMismatchBinaryOp,
                                   f"{op}: shape mismatch lhs {a.shape} rhs {b.shape} (dtype {a.dtype.name})")
                else:
                    checks = []
                    shape = broadcast_shapes(a.shape, b.shape, name or f"broadcast_{op}", dtype=a.dtype,
                                             checks=checks)
                    a0, b0 = a._node, b._node
                    a, b = a._broadcast_to(shape), b._broadcast_to(shape)
                    for n in (a._node, b._node):        # the broadcast views: bind meets them first
                        if n is not a0 and n is not b0:
                            require(n, checks)
            a, b = a._node, b._node
            if checks:
                out = Node(kind, (a, b), None, a.shape, D.u8 if kind.out_dtype == "u8" else a.dtype)
                require(out, checks)
                return T(out)
        return T(Node(kind, (a, b), None, a.shape, D.u8 if kind.out_dtype == "u8" else a.dtype))

    # ---- unary -------------------------------------------------------------------------
    def exp(self): return self._unary("exp")
    def log(self): return self._unary("log")
    def sin(self): return self._unary("sin")
    def cos(self): return self._unary("cos")
    def tanh(self): return self._unary("tanh")
    def erf(self): return self._unary("erf")
    def gelu(self): return self._unary("gelu")
    def gelu_erf(self): return self._unary("gelu_erf")
    def silu(self): return self._unary("silu")
    def sigmoid(self): return self._unary("sigmoid")
    def sqrt(self): return self._unary("sqrt")
    def recip(self): return self._unary("recip")
    def neg(self): return self._unary("neg")
    def abs(self): return self._unary("abs")
    def sqr(self): return self._unary("sqr")
    def relu(self): return self._unary("relu")
    def sign(self): return self._unary("sign")
    def ceil(self): return self._unary("ceil")
    def floor(self): return self._unary("floor")
    def round(self): return self._unary("round")

    def affine(self, mul, add):
        """x * mul + add, computed in the tensor's dtype."""
        check_dtype("affine", self.dtype, self.shape)
        return self._unary("affine", (scalar_in_dtype(mul, self.dtype), scalar_in_dtype(add, self.dtype)))

    def clamp(self, lo, hi):
        check_dtype("clamp", self.dtype, self.shape)
        return self._unary("clamp", (scalar_in_dtype(lo, self.dtype), scalar_in_dtype(hi, self.dtype)))

    def powf(self, e):
        check_dtype("powf", self.dtype, self.shape)
        return self._unary("powf", float(e))

    def elu(self, alpha):
        check_dtype("elu", self.dtype, self.shape)
        return self._unary("elu", float(alpha))

    def to_dtype(self, dtype):
        try:
            dtype = as_dtype(dtype)
        except UnsupportedDType as e:
            raise UnsupportedDType(f"to_dtype: {e} ({shape_desc(self.shape, self.dtype)})") from None
        if dtype is self.dtype:
            return self
        return type(self)(Node("cast", (self._node,), dtype, self.shape, dtype))

    # ---- binary ------------------------------------------------------------------------
    def add(self, o): return self._binary("add", o, False)
    def sub(self, o): return self._binary("sub", o, False)
    def mul(self, o): return self._binary("mul", o, False)
    def div(self, o): return self._binary("div", o, False)
    def floor_divide(self, o): return self._binary("floordiv", o, True)
    def remainder(self, o): return self._binary("mod", o, True)
    def pow(self, e): return self._binary("pow", e, True)
    def maximum(self, o): return self._binary("maximum", o, False)
    def minimum(self, o): return self._binary("minimum", o, False)
    def broadcast_add(self, o): return self._broadcast_binary("add", o)
    def broadcast_sub(self, o): return self._broadcast_binary("sub", o)
    def broadcast_mul(self, o): return self._broadcast_binary("mul", o)
    def broadcast_div(self, o): return self._broadcast_binary("div", o)
    def broadcast_maximum(self, o): return self._broadcast_binary("maximum", o)
    def broadcast_minimum(self, o): return self._broadcast_binary("minimum", o)

    def eq(self, o): return self._binary("eq", o, False)
    def ne(self, o): return self._binary("ne", o, False)
    def lt(self, o): return self._binary("lt", o, False)
    def le(self, o): return self._binary("le", o, False)
    def gt(self, o): return self._binary("gt", o, False)
    def ge(self, o): return self._binary("ge", o, False)
    def broadcast_eq(self, o): return self._broadcast_binary("eq", o)
    def broadcast_ne(self, o): return self._broadcast_binary("ne", o)
    def broadcast_lt(self, o): return self._broadcast_binary("lt", o)
    def broadcast_le(self, o): return self._broadcast_binary("le", o)
    def broadcast_gt(self, o): return self._broadcast_binary("gt", o)
    def broadcast_ge(self, o): return self._broadcast_binary("ge", o)

    def where_cond(self, on_true, on_false):
        """Pick on_true where this mask (u8/u32/i64, nonzero = true) is set, else on_false."""
        T = type(self)
        if self.dtype not in (D.u8, D.u32, D.i64):
            raise UnsupportedDTypeForOp(f"where_cond: mask dtype must be u8, u32 or i64, got {self.dtype.name} "
                                        f"(shape {self.shape})")
        if isinstance(on_true, np.ndarray) and on_true.ndim:
            on_true = as_operand(on_true, T)
        if isinstance(on_false, np.ndarray) and on_false.ndim:
            on_false = as_operand(on_false, T)
        if _is_scalar(on_true) and isinstance(on_false, T):
            on_true = on_false._scalar_like(as_scalar(on_true))
        if _is_scalar(on_false) and isinstance(on_true, T):
            on_false = on_true._scalar_like(as_scalar(on_false))
        if not (isinstance(on_true, T) and isinstance(on_false, T)):
            raise TypeError("where_cond: on_true and on_false must be tensors (or one a scalar)")
        if on_true.dtype is not on_false.dtype:
            raise DTypeMismatchBinaryOp(f"where_cond: dtype mismatch on_true {on_true.dtype.name} "
                                        f"on_false {on_false.dtype.name} (shapes {on_true.shape} and {on_false.shape})")
        if not (self.shape == on_true.shape == on_false.shape):
            raise ShapeMismatchBinaryOp(f"where_cond: shape mismatch mask {self.shape} on_true {on_true.shape} "
                                        f"on_false {on_false.shape} (mask {self.dtype.name}, values "
                                        f"{on_true.dtype.name})")
        if on_true.dtype.storage_only:
            raise UnsupportedDTypeForOp(f"where_cond: dtype {on_true.dtype.name} is storage-only "
                                        f"(shape {on_true.shape})")
        return T(Node("where", (self._node, on_true._node, on_false._node), None, self.shape, on_true.dtype))

    # ---- operators (broadcast like NumPy; scalars take the tensor's dtype) -------------
    def __add__(self, o): return self._binary("add", o, True)
    def __radd__(self, o): return self._binary("add", o, True, reflected=True)
    def __sub__(self, o): return self._binary("sub", o, True)
    def __rsub__(self, o): return self._binary("sub", o, True, reflected=True)
    def __mul__(self, o): return self._binary("mul", o, True)
    def __rmul__(self, o): return self._binary("mul", o, True, reflected=True)
    def __truediv__(self, o): return self._binary("div", o, True)
    def __rtruediv__(self, o): return self._binary("div", o, True, reflected=True)
    def __neg__(self): return self.neg()
    def __abs__(self): return self.abs()
    def __lt__(self, o): return self._binary("lt", o, True)
    def __le__(self, o): return self._binary("le", o, True)
    def __gt__(self, o): return self._binary("gt", o, True)
    def __ge__(self, o): return self._binary("ge", o, True)
    def __eq__(self, o): return self._binary("eq", o, True)
    def __ne__(self, o): return self._binary("ne", o, True)
    __hash__ = object.__hash__

    def __floordiv__(self, o): return self._binary("floordiv", o, True)
    def __rfloordiv__(self, o): return self._binary("floordiv", o, True, reflected=True)
    def __mod__(self, o): return self._binary("mod", o, True)
    def __rmod__(self, o): return self._binary("mod", o, True, reflected=True)

    def __pow__(self, e):
        """A scalar exponent is powf (SPEC: float-only, so an integer tensor raises
        UnsupportedDTypeForOp); a tensor exponent is pow, broadcasting, in one dtype (no
        promotion; integers wrap like NumPy)."""
        s = as_scalar(e)
        if s is not None:
            return self.powf(s)
        return self._binary("pow", e, True)

    def __rpow__(self, base): return self._binary("pow", base, True, reflected=True)

    def __matmul__(self, o):
        o = as_operand(o, type(self))
        return NotImplemented if o is None else self.broadcast_matmul(o)

    def __rmatmul__(self, o):
        o = as_operand(o, type(self))
        return NotImplemented if o is None else o.broadcast_matmul(self)
