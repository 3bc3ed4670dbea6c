"""View ops: each is a pure layout change on the node's base buffer (no data moves, no kernel).
A reshape that strides cannot express makes a lazy contiguous copy first."""
from __future__ import annotations

from math import prod

import numpy as np

from .errors import (BroadcastIncompatibleShapes, DimOutOfRange, IndexOutOfBounds, NarrowInvalidArgs,
                     ShapeMismatch)
from .ir.node import Node
from .ir.ops import OPS
from .layout import MEMO_SHAPES, as_index, as_shape, broadcast_view
from .named_dims import require, require_eq, require_ge0
from .sizes import Size, decide_eq, has_size, is_one, same


def shape_desc(shape, dtype=None) -> str:
    """How an error message names a tensor: "shape (2, 3), f32" ("shape (2, 3)" without a dtype)."""
    return f"shape {tuple(shape)}" + (f", {dtype.name}" if dtype is not None else "")


def norm_dim(dim, rank, op, extra=0, *, dtype=None) -> int:
    """Dim index with negatives counting from the end; `extra` widens the range (unsqueeze).
    `rank` may be the shape itself (then the error message names it, and `dtype` if given)."""
    shape = tuple(rank) if isinstance(rank, (tuple, list)) else None
    if shape is not None:
        rank = len(shape)
    n = rank + extra
    d = as_index(dim, op, "dim")
    if d < -n or d >= n or n == 0:
        where = f"rank {rank}" + (f" ({shape_desc(shape, dtype)})" if shape is not None else "")
        raise DimOutOfRange(f"{op}: dim {dim} out of range for {where}")
    return d + n if d < 0 else d


def broadcast_shapes(a, b, op, *, dtype=None, checks=None) -> tuple:
    """NumPy broadcasting of two shapes, or BroadcastIncompatibleShapes naming the op (and the
    operands' `dtype` if given); results memoized per pair of shape tuples, as the layout memos are.
    Two sizes of named dims that may differ (n and m, n and 4) must be equal when bound: that
    check is added to `checks` (attached to the op's node by the caller)."""
    got = _broadcast_pairs.get((a, b))
    if got is not None:
        return got
    out = []
    for i in range(max(len(a), len(b))):
        da = a[len(a) - 1 - i] if i < len(a) else 1
        db = b[len(b) - 1 - i] if i < len(b) else 1
        if da.__class__ is int and db.__class__ is int:
            if da != db and da != 1 and db != 1:
                raise BroadcastIncompatibleShapes(f"{op}: cannot broadcast shapes {tuple(a)} and {tuple(b)}"
                                                  + (f" (dtype {dtype.name})" if dtype is not None else ""))
        elif not (is_one(da) or is_one(db) or same(da, db)):
            message = f"{op}: cannot broadcast shapes {tuple(a)} and {tuple(b)}" + \
                (f" (dtype {dtype.name})" if dtype is not None else "")
            require_eq(checks if checks is not None else [], da, db, BroadcastIncompatibleShapes, message)
            out.append(db if db.__class__ is int else da)
            continue
        out.append(db if is_one(da) else da)
    out = tuple(reversed(out))
    if len(_broadcast_pairs) < MEMO_SHAPES and a.__class__ is tuple and b.__class__ is tuple \
            and all(d.__class__ is int for d in a + b):
        _broadcast_pairs[(a, b)] = out
    return out


_broadcast_pairs: dict = {}
_VIEW = OPS["view"]


class ViewMixin:
    __slots__ = ()

    def _view(self, layout, label, checks=()):
        old = self._node.layout
        try:
            unchanged = layout == old and layout.shape == self.shape
        except TypeError:           # (lc.SymbolicSizeError) sizes of named dims that may differ
            unchanged = same(layout.shape, old.shape) and same(layout.strides, old.strides) \
                and same(layout.offset, old.offset) and same(layout.shape, self.shape)
        if unchanged:
            return self
        if checks:
            out = Node("view", (self._node,), None, layout.shape, self.dtype, layout=layout, label=label)
            require(out, checks)
            return type(self)(out)
        return type(self)(Node("view", (self._node,), None, layout.shape, self.dtype, layout=layout, label=label))

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        shape = list(as_index(d, "reshape", "a size in a shape") for d in shape)
        n = self.elem_count
        if has_size(tuple(shape)) or n.__class__ is Size:
            return self._reshape_sized(shape, n)
        if shape.count(-1) > 1:
            raise ShapeMismatch(f"reshape: at most one -1 allowed, got {tuple(shape)} "
                                f"(tensor {shape_desc(self.shape, self.dtype)})")
        if -1 in shape:
            rest = prod(d for d in shape if d != -1)
            if rest == 0 or n % rest:
                raise ShapeMismatch(f"reshape: cannot reshape {self.shape} ({n} elements) to {tuple(shape)} "
                                    f"({self.dtype.name})")
            shape[shape.index(-1)] = n // rest
        shape = tuple(shape)
        if any(d < 0 for d in shape) or prod(shape) != n:
            raise ShapeMismatch(f"reshape: cannot reshape {self.shape} ({n} elements) to {shape} ({self.dtype.name})")
        if shape == self.shape:
            return self
        lay = self._node.layout.reshape(shape)
        if lay is None:
            return self.contiguous().reshape(shape)
        return self._view(lay, f"reshape{shape}")

    def _reshape_sized(self, shape: list, n, checks=None):
        """reshape where sizes of named dims are involved: -1 is the element count divided by
        the rest (exactly, or as a `//` size with a check); counts that may differ are checked
        when the sizes are bound."""
        checks = [] if checks is None else checks
        message = f"reshape: cannot reshape {self.shape} ({n} elements) to {tuple(shape)} ({self.dtype.name})"
        fixed = [d for d in shape if d.__class__ is Size or d != -1]
        if len(fixed) < len(shape) - 1:
            raise ShapeMismatch(f"reshape: at most one -1 allowed, got {tuple(shape)} "
                                f"(tensor {shape_desc(self.shape, self.dtype)})")
        for d in fixed:
            require_ge0(checks, d, ShapeMismatch, message)
        if len(fixed) < len(shape):
            rest = prod(fixed)
            if decide_eq(rest, 0) is True:
                raise ShapeMismatch(message)
            shape[next(i for i, d in enumerate(shape) if d.__class__ is int and d == -1)] = n // rest
        shape = tuple(shape)
        require_eq(checks, prod(shape), n, ShapeMismatch, message)
        if same(shape, self.shape) and not checks:
            return self
        lay = self._node.layout.reshape(shape)
        if lay is None:
            return self.contiguous()._reshape_sized(list(shape), n, checks)
        return self._view(lay, f"reshape{shape}", checks)

    def transpose(self, d0, d1):
        d0 = norm_dim(d0, self.shape, "transpose", dtype=self.dtype)
        d1 = norm_dim(d1, self.shape, "transpose", dtype=self.dtype)
        perm = list(range(self.rank))
        perm[d0], perm[d1] = d1, d0
        return self._view(self._node.layout.permute(perm), f"transpose({d0}, {d1})")

    def t(self):
        if self.rank < 2:
            raise DimOutOfRange(f"t: needs rank >= 2, got shape {self.shape} ({self.dtype.name})")
        return self.transpose(-2, -1)

    def permute(self, *dims):
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = dims[0]
        if len(dims) != self.rank:
            raise DimOutOfRange(f"permute: {len(dims)} dims given for rank {self.rank} "
                                f"({shape_desc(self.shape, self.dtype)})")
        dims = [norm_dim(d, self.shape, "permute", dtype=self.dtype) for d in dims]
        if sorted(dims) != list(range(self.rank)):
            raise DimOutOfRange(f"permute: {tuple(dims)} is not a permutation of the dims of shape {self.shape} "
                                f"({self.dtype.name})")
        return self._view(self._node.layout.permute(dims), f"permute{tuple(dims)}")

    def narrow(self, dim, start, length):
        dim = norm_dim(dim, self.shape, "narrow", dtype=self.dtype)
        size = self.shape[dim]
        start, length = as_index(start, "narrow", "start"), as_index(length, "narrow", "length")
        message = (f"narrow: start {start} + length {length} out of range for dim {dim} "
                   f"of size {size} ({shape_desc(self.shape, self.dtype)})")
        checks = []
        if has_size((start, length, size)):
            for x in (start, length, size - start - length):
                require_ge0(checks, x, NarrowInvalidArgs, message)
        elif start < 0 or length < 0 or start + length > size:
            raise NarrowInvalidArgs(message)
        return self._view(self._node.layout.narrow(dim, start, length), f"narrow({dim}, {start}, {length})", checks)

    def broadcast_as(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        shape = as_shape(shape, "broadcast_as", BroadcastIncompatibleShapes)
        message = f"broadcast_as: cannot broadcast shape {self.shape} to {shape} ({self.dtype.name})"
        if len(shape) < self.rank:
            raise BroadcastIncompatibleShapes(message)
        checks = []
        for s, d in zip(self.shape, shape[len(shape) - self.rank:]):
            if s.__class__ is int and d.__class__ is int:
                if s != d and s != 1:
                    raise BroadcastIncompatibleShapes(message)
            elif not is_one(s):
                require_eq(checks, s, d, BroadcastIncompatibleShapes, message)
        for d in shape:
            if d.__class__ is Size:
                require_ge0(checks, d, BroadcastIncompatibleShapes, message)
        if same(shape, self.shape) and not checks:
            return self
        return self._view(self._node.layout.broadcast_as(shape), f"broadcast_as{shape}", checks)

    expand = broadcast_as

    def _broadcast_to(self, shape):
        """broadcast_as to a shape `broadcast_shapes` made from this tensor's (so already
        checked): the binary ops' fast path."""
        node = self._node
        try:
            unchanged = node.shape == shape
        except TypeError:           # (lc.SymbolicSizeError) sizes of named dims that may differ
            unchanged = same(node.shape, shape)
        if unchanged:
            return self
        lay, label = broadcast_view(node.layout, shape)
        return type(self)(Node(_VIEW, (node,), None, shape, node.dtype, layout=lay, label=label))

    def broadcast_left(self, *batch):
        if len(batch) == 1 and isinstance(batch[0], (tuple, list)):
            batch = batch[0]
        return self.broadcast_as(as_shape(batch, "broadcast_left", BroadcastIncompatibleShapes) + self.shape)

    def unsqueeze(self, dim):
        dim = norm_dim(dim, self.shape, "unsqueeze", extra=1, dtype=self.dtype)
        return self._view(self._node.layout.unsqueeze(dim), f"unsqueeze({dim})")

    def squeeze(self, dim):
        dim = norm_dim(dim, self.shape, "squeeze", dtype=self.dtype)
        if not is_one(self.shape[dim]):
            return self
        return self._view(self._node.layout.select(dim, 0), f"squeeze({dim})")

    def flatten(self, start_dim=0, end_dim=-1):
        if self.rank == 0:
            return self.reshape((1,))
        s = norm_dim(start_dim, self.shape, "flatten", dtype=self.dtype)
        e = norm_dim(end_dim, self.shape, "flatten", dtype=self.dtype)
        if s > e:
            raise DimOutOfRange(f"flatten: start_dim {start_dim} > end_dim {end_dim} for shape {self.shape} "
                                f"({self.dtype.name})")
        return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

    def flatten_all(self):
        return self.reshape((self.elem_count,))

    def chunk(self, n, dim=0):
        """Split `dim` into n pieces like candle: sizes differ by at most one, the larger
        first (7 in 3 -> 3, 2, 2); fewer elements than n gives pieces of one."""
        dim = norm_dim(dim, self.shape, "chunk", dtype=self.dtype)
        n = as_index(n, "chunk", "the number of chunks")
        if n < 1:
            raise ShapeMismatch(f"chunk: need n >= 1 chunks, got {n} ({shape_desc(self.shape, self.dtype)})")
        size = self.shape[dim]
        if size.__class__ is Size:      # n pieces of (size - i + n - 1) // n: at least n elements, checked at run
            out, start = [], 0
            for i in range(n):
                length = (size - i + n - 1) // n
                out.append(self.narrow(dim, start, length))
                start = start + length
            return out
        if size == 0:
            return [self]
        if size < n:
            return [self.narrow(dim, i, 1) for i in range(size)]
        base, extra = divmod(size, n)
        out, start = [], 0
        for i in range(n):
            length = base + (1 if i < extra else 0)
            out.append(self.narrow(dim, start, length))
            start += length
        return out

    def contiguous(self):
        """A tensor with its own row-major buffer: self when the layout already is one."""
        if self._node.op.category != "view" or (
                self._node.layout.is_contiguous() and self._node.base.op.name != "const"):
            return self
        return type(self)(Node("copy", (self._node,), None, self.shape, self.dtype))

    def materializable(self):
        """Self, or a lazy copy when self views a scalar constant (kernels that are not fused
        read operands from buffers, and a constant has none)."""
        return self.copy() if self._node.base.op.name == "const" else self

    def copy(self):
        return type(self)(Node("copy", (self._node,), None, self.shape, self.dtype))

    def __getitem__(self, idx):
        if _is_tensor_index(idx):
            return self._index_by(idx)
        if not isinstance(idx, tuple):
            idx = (idx,)
        idx = tuple(i if i is None or i is Ellipsis or isinstance(i, slice)
                    else as_index(i, "index", "an index other than a slice, None or ...") for i in idx)
        n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
        if n_real > self.rank:
            raise IndexOutOfBounds(f"index: too many indices ({n_real}) for shape {self.shape}")
        if any(i is Ellipsis for i in idx):
            e = idx.index(Ellipsis)
            idx = idx[:e] + (slice(None),) * (self.rank - n_real) + idx[e + 1:]
        lay = self._node.layout
        dim = 0
        checks = []
        for i in idx:
            if i is None:
                lay = lay.unsqueeze(dim)
                dim += 1
            elif isinstance(i, slice):
                size = lay.shape[dim]
                if has_size((i.start, i.stop, i.step, size)):
                    start, stop, step = _sized_slice(i, size, dim, self.shape, checks)
                else:
                    start, stop, step = i.indices(size)     # ValueError for a zero step
                lay = lay.slice(dim, start, stop, step)
                dim += 1
            else:
                size = lay.shape[dim]
                message = f"index: {i} out of range for dim {dim} of size {size} (shape {self.shape})"
                if has_size((i, size)):
                    if i.__class__ is int and i < 0:
                        i = size + i
                    require_ge0(checks, i, IndexOutOfBounds, message)
                    require_ge0(checks, size - 1 - i, IndexOutOfBounds, message)
                else:
                    if i < -size or i >= size:
                        raise IndexOutOfBounds(message)
                    i %= size
                lay = lay.select(dim, i)
        return self._view(lay, f"index[{idx!r}]", checks)


def _sized_slice(sl, size, dim, shape, checks):
    """(start, stop, step) of slice `sl` over a dim of `size` when sizes of named dims are
    involved: a negative int bound counts from the end, and every bound must lie in the dim
    (0 <= start <= stop <= size, checked when the sizes are bound: IndexOutOfBounds)."""
    step = 1 if sl.step is None else as_index(sl.step, "index", "a slice step")
    if step.__class__ is not int:
        raise IndexOutOfBounds(f"index: a slice step must be an int, got {step} (shape {shape})")
    if step == 0:
        raise ValueError("slice step cannot be zero")
    message = f"index: slice {sl.start}:{sl.stop}:{sl.step} out of range for dim {dim} of size {size} " \
              f"(shape {shape})"

    def bound(v, default):
        if v is None:
            return default
        v = as_index(v, "index", "a slice bound")
        return size + v if v.__class__ is int and v < 0 else v

    if step > 0:
        start, stop = bound(sl.start, 0), bound(sl.stop, size)
        for x in (start, stop - start, size - stop):
            require_ge0(checks, x, IndexOutOfBounds, message)
    else:
        start, stop = bound(sl.start, size - 1), bound(sl.stop, -1)
        for x in (stop + 1, start - stop, size - 1 - start):
            require_ge0(checks, x, IndexOutOfBounds, message)
    return start, stop, step


def _is_tensor_index(idx) -> bool:
    """A Tensor, a NumPy array of rank >= 1 or a list: ids or a mask (tensor_extras._index_by)."""
    from .tensor import Tensor
    return isinstance(idx, (Tensor, list)) or (isinstance(idx, np.ndarray) and idx.ndim > 0)
