"""Function forms of the Tensor API for torch / NumPy users: `lc.exp(t)` & co. (generated from
the op table: one per unary elementwise op), `lc.where`, `lc.matmul`, `lc.concatenate`,
`lc.eye`, `lc.linspace`, `lc.meshgrid`, `lc.tril` / `lc.triu`."""
from __future__ import annotations

import numpy as np

from . import dtype as D
from .dtype import as_dtype
from .errors import DTypeMismatchBinaryOp, ShapeMismatchBinaryOp, UnsupportedDTypeForOp
from .ir.ops import ELEMENTWISE, OPS
from .layout import as_index
from .tensor import Tensor, _from_array, arange, full, tensor
from .tensor_extras import _as_mask
from .tensor_index import cat
from .tensor_math import as_scalar
from .tensor_views import broadcast_shapes

# unary elementwise kinds that are data movement, not math (no function form)
_NOT_MATH = ("copy",)


def _as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else tensor(x)


def _unary_form(name):
    method = getattr(Tensor, name)

    def fn(t, *args):
        return method(_as_tensor(t), *args)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"lc.{name}(t, ...) = t.{name}(...)" + (f": {OPS[name].doc}" if OPS[name].doc else "")
    return fn


UNARY_FUNCTIONS = {name: _unary_form(name) for name, kind in OPS.items()
                   if kind.category == ELEMENTWISE and kind.arity == 1 and name not in _NOT_MATH
                   and hasattr(Tensor, name)}
globals().update(UNARY_FUNCTIONS)


def where(cond, a, b) -> Tensor:
    """a where `cond` (u8 / u32 / i64, nonzero = true; a bool array too) else b, all three
    broadcast like NumPy.  A scalar a or b takes the other's dtype; two scalars give f32 when
    either is a float, else i64 (lc.tensor's rule)."""
    cond = _as_mask(cond, "where")
    sa, sb = as_scalar(a), as_scalar(b)
    if sa is not None and sb is not None:
        dt = D.f32 if isinstance(sa, float) or isinstance(sb, float) else D.i64
        a, b = full(sa, (), dt), full(sb, (), dt)
    elif sa is not None:
        b = _as_tensor(b)
        a = full(sa, (), b.dtype)
    elif sb is not None:
        a = _as_tensor(a)
        b = full(sb, (), a.dtype)
    else:
        a, b = _as_tensor(a), _as_tensor(b)
    shape = broadcast_shapes(broadcast_shapes(cond.shape, a.shape, "where"), b.shape, "where")
    return cond.broadcast_as(shape).where_cond(a.broadcast_as(shape), b.broadcast_as(shape))


def matmul(a, b) -> Tensor:
    """torch.matmul: batch dims broadcast; a 1-D operand is a row (left) or column (right)
    vector whose dim is dropped from the result."""
    a, b = _as_tensor(a), _as_tensor(b)
    if a.rank == 0 or b.rank == 0:
        raise ShapeMismatchBinaryOp(f"matmul: operands must have rank >= 1, got {a.shape} and {b.shape} "
                                    f"({a.dtype.name}, {b.dtype.name})")
    out = a.reshape((1,) + a.shape if a.rank == 1 else a.shape).broadcast_matmul(
        b.reshape(b.shape + (1,)) if b.rank == 1 else b)
    if a.rank == 1:
        out = out.squeeze(-2)
    return out.squeeze(-1) if b.rank == 1 else out


def concatenate(ts, dim=0, *, axis=None) -> Tensor:
    """= cat (NumPy's name; `axis=` accepted)."""
    return cat(ts, dim if axis is None else axis)


def eye(n, m=None, dtype=D.f32) -> Tensor:
    """(n, m) identity: ones where row == col (an iota comparison, computed lazily)."""
    n = as_index(n, "eye", "n")
    m = n if m is None else as_index(m, "eye", "m")
    if n < 0 or m < 0:
        raise ValueError(f"eye: sizes must be >= 0, got n={n}, m={m}")
    dtype = as_dtype(dtype)
    if dtype.storage_only:
        raise UnsupportedDTypeForOp(f"eye: dtype {dtype.name} is storage-only")
    rows, cols = arange(n).reshape((n, 1)), arange(m).reshape((1, m))
    return cols.broadcast_eq(rows).to_dtype(dtype)


def linspace(start, end, steps, dtype=D.f32) -> Tensor:
    """`steps` evenly spaced values from start to end inclusive (NumPy creates them)."""
    steps = as_index(steps, "linspace", "steps")
    if steps < 0:
        raise ValueError(f"linspace: steps must be >= 0, got {steps}")
    dtype = as_dtype(dtype)
    vals = np.linspace(float(start), float(end), steps)
    if dtype.is_int:
        vals = np.floor(vals)      # NumPy 2 rounds toward -inf for integer dtypes
    return _from_array(vals, dtype)


def meshgrid(*ts, indexing="ij", xy_indexing=None):
    """torch.meshgrid: 1-D (or 0-D) tensors of one dtype -> a tuple of broadcast views of shape
    (n0, n1, ...) ("ij") or with the first two dims swapped ("xy").  candle's form
    meshgrid([a, b], xy_indexing) is accepted too."""
    if len(ts) == 2 and isinstance(ts[0], (list, tuple)) and isinstance(ts[1], bool):
        ts, xy_indexing = ts[0], ts[1]
    elif len(ts) == 1 and isinstance(ts[0], (list, tuple)):
        ts = ts[0]
    if xy_indexing is not None:
        indexing = "xy" if xy_indexing else "ij"
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    ts = [_as_tensor(t) for t in ts]
    if not ts:
        raise ValueError("meshgrid: needs at least one tensor")
    for t in ts:
        if t.rank > 1:
            raise ShapeMismatchBinaryOp(f"meshgrid: tensors must be 0-D or 1-D, got shape {t.shape} "
                                        f"({t.dtype.name})")
        if t.dtype is not ts[0].dtype:
            raise DTypeMismatchBinaryOp(f"meshgrid: dtype mismatch {ts[0].dtype.name} and {t.dtype.name} "
                                        f"(shapes {ts[0].shape} and {t.shape})")
    ts = [t.reshape((t.elem_count,)) for t in ts]
    swap = indexing == "xy" and len(ts) >= 2
    order = [1, 0] + list(range(2, len(ts))) if swap else list(range(len(ts)))
    shape = tuple(ts[i].shape[0] for i in order)
    out = []
    for i, t in enumerate(ts):
        at = order.index(i)
        view = (1,) * at + t.shape + (1,) * (len(ts) - at - 1)
        out.append(t.reshape(view).broadcast_as(shape))
    return tuple(out)


def tril(t, k=0) -> Tensor:
    """Zero above the k-th diagonal of the last two dims."""
    return _as_tensor(t).tril(k)


def triu(t, k=0) -> Tensor:
    """Zero below the k-th diagonal of the last two dims."""
    return _as_tensor(t).triu(k)


__all__ = sorted(UNARY_FUNCTIONS) + ["where", "matmul", "concatenate", "eye", "linspace", "meshgrid", "tril", "triu"]
