"""Tensor methods of the model ops built from views and cat: repeat (torch's tile),
slice_set (candle's KV-cache update) and slice_assign.

slice_set / slice_assign are ONE cat node along the written dim (the kept pieces of the old
value read through narrow views, src between them): one fused copy kernel.  Writing one
position (n == 1, the decode step) is an elementwise select instead, so a new position never
compiles a kernel (a cat's copy kernel is specialised to its piece sizes).  slice_set never
changes the tensor it is called on (a value the caller still holds must not change).

Buffer donation is `t.slice_set_(src, dim, start)` (the trailing underscore of torch's in-place
methods): the caller gives up t's old value and t becomes the updated value.  When t's buffer is
dead otherwise -- no other tensor, lazy node, view or array holds the node or its memory (counted
by CPython reference counts, as NumPy's `resize(refcheck=True)` does: a holder can only make the
count larger, so an uncertain case takes the copy) -- only src's rows are written into t's
buffer (runtime/inplace.py, O(new rows)); otherwise t is rebound to the fused copy.  Bad
arguments raise at the call: NarrowInvalidArgs for ranges out of bounds,
ShapeMismatchBinaryOp / DTypeMismatchBinaryOp for a src that does not fit."""
from __future__ import annotations

import operator
import sys
from math import prod

from .errors import DTypeMismatchBinaryOp, NarrowInvalidArgs, ShapeMismatchBinaryOp
from .runtime.buffers import forget
from .tensor_views import norm_dim, shape_desc


def _int(op, name, v):
    if isinstance(v, bool):
        raise TypeError(f"{op}: {name} must be an int, got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{op}: {name} must be an int, got {type(v).__name__}") from None


def _position(op, start):
    """A runtime start: a one-element integer tensor, as i64."""
    from .dtype import i64
    if not start.dtype.is_int or start.elem_count != 1:
        raise TypeError(f"{op}: a tensor start must be one integer element, got shape {start.shape} "
                        f"({start.dtype.name})")
    return start if start.dtype is i64 else start.astype(i64)


def _ref_counts(t):
    """(small block?, node, buffer, buffer owner) reference counts of tensor t's buffer node,
    or None when t is not a realized buffer node laid out like buffers.alloc's (no calibrated
    baseline: never donated).  Called the same way for t and for the baseline probe, so the
    references the calls themselves add cancel out."""
    node = t._node
    buf = node.buffer
    if node.op.name != "buffer" or buf is None:
        return None
    owner = buf.base
    if owner is None or not buf.flags.c_contiguous or buf.size != prod(node.shape):
        return None
    return type(owner) is type(buf), sys.getrefcount(node), sys.getrefcount(buf), sys.getrefcount(owner)


_baselines = {}


def _baseline(small: bool):
    """The counts of a buffer node nothing else holds, measured on a fresh one (small blocks
    are slices of a raw array, large ones leases of a mapped block: runtime/buffers.alloc)."""
    if small not in _baselines:
        from .dtype import u8
        from .ir.node import Node
        from .runtime.buffers import POOL_MIN_BYTES, alloc
        from .tensor import Tensor
        n = 64 if small else POOL_MIN_BYTES
        probe = Tensor(Node("buffer", (), None, (n,), u8, buffer=alloc(n, u8)))
        _baselines[small] = _ref_counts(probe)
    return _baselines[small]


def _donatable(t) -> bool:
    """Whether t's buffer can be written in place: a realized buffer node and its memory held
    by nothing but t."""
    buf = t._node.buffer
    if buf is not None:
        forget(buf)                 # (a kept eager result: only its holders may see the write)
    del buf
    counts = _ref_counts(t)
    return counts is not None and counts == _baseline(counts[0])


class ModelOpsMixin:
    __slots__ = ()

    def repeat(self, *reps):
        """torch.Tensor.repeat / candle's repeat: tile the tensor reps[i] times along dim i; a
        longer reps prepends dims of size 1 (one broadcast view, copied lazily by reshape)."""
        op = "repeat"
        if len(reps) == 1 and isinstance(reps[0], (tuple, list)):
            reps = reps[0]
        reps = tuple(_int(op, "reps", r) for r in reps)
        if len(reps) < self.rank or any(r < 0 for r in reps):
            raise ShapeMismatchBinaryOp(f"{op}: reps {reps} must be >= 0 and have at least one entry per dim "
                                        f"of shape {self.shape} ({self.dtype.name})")
        shape = (1,) * (len(reps) - self.rank) + self.shape
        interleaved = tuple(d for s in shape for d in (1, s))
        tiled = tuple(d for r, s in zip(reps, shape) for d in (r, s))
        out = self.reshape(shape).reshape(interleaved).broadcast_as(tiled)
        return out.reshape(tuple(r * s for r, s in zip(reps, shape)))

    def slice_set(self, src, dim, start):
        """This tensor with `src` written along `dim` from `start` (candle's slice_set; src has
        this shape except along dim).  Returns the updated value.  `start` may also be a
        one-element integer tensor, read when the graph runs (a compiled decode step feeds
        its position): positions of src that fall outside the tensor are not written."""
        dim, start, runtime_start = self._check_slice_set(src, dim, start)
        if runtime_start:
            return self._set_at(src, dim, start)
        return self._spliced(src, dim, start)

    def _check_slice_set(self, src, dim, start):
        """slice_set's arguments checked (typed errors at the call): (dim, start, whether start
        is a runtime tensor); an int start is in range."""
        op = "slice_set"
        dim = norm_dim(dim, self.shape, op, dtype=self.dtype)
        runtime_start = hasattr(start, "_node")
        if runtime_start:
            start = _position(op, start)
        else:
            start = _int(op, "start", start)
        if src.dtype is not self.dtype:
            raise DTypeMismatchBinaryOp(f"{op}: dtype mismatch {self.dtype.name} and src {src.dtype.name} "
                                        f"(shapes {self.shape} and {src.shape})")
        if src.rank != self.rank or any(a != b for i, (a, b) in enumerate(zip(self.shape, src.shape)) if i != dim):
            raise ShapeMismatchBinaryOp(f"{op}: src shape {src.shape} must equal {self.shape} except along dim "
                                        f"{dim} ({self.dtype.name})")
        size, n = self.shape[dim], src.shape[dim]
        if n > size:
            raise NarrowInvalidArgs(f"{op}: src length {n} exceeds dim {dim} of size {size} (shape {self.shape}, "
                                    f"src {src.shape}, {self.dtype.name})")
        if not runtime_start and (start < 0 or start + n > size):
            raise NarrowInvalidArgs(f"{op}: start {start} + src length {n} out of range for dim {dim} of size "
                                    f"{size} (shape {self.shape}, src {src.shape}, {self.dtype.name})")
        return dim, start, runtime_start

    def slice_set_(self, src, dim, start):
        """In-place slice_set (buffer donation): this tensor becomes
        `self.slice_set(src, dim, start)` and is returned.  When its old value is dead (nothing
        else holds its node or buffer), only src's rows are written into its buffer; otherwise
        it is rebound to the copy, and whoever still holds the old value keeps it unchanged.
        Same arguments and errors as slice_set (a tensor `start` is read now)."""
        if hasattr(start, "_node"):
            start = int(_position("slice_set", start).item())
        dim, start, _ = self._check_slice_set(src, dim, start)
        if src.shape[dim] == self.shape[dim] or not self._node.realized:
            self._node = self._spliced(src, dim, start)._node
            return self
        rows = src.contiguous().realize()._node.buffer      # (src's graph may read this tensor)
        if not _donatable(self):
            self._node = self._spliced(src, dim, start)._node
            return self
        from .runtime.inplace import write_rows
        write_rows(self._node.buffer, rows, self.shape, dim, start, src.shape[dim])
        return self

    def _spliced(self, src, dim, start):
        from .tensor_index import cat
        size, n = self.shape[dim], src.shape[dim]
        if n == size:
            return src.contiguous()
        if n == 1:
            return self._row_set(src, dim, start)
        pieces = [self.narrow(dim, 0, start), src, self.narrow(dim, start + n, size - start - n)]
        return cat([p for p in pieces if p.shape[dim]], dim)

    def _set_at(self, src, dim, start):
        """slice_set at a runtime start (a tensor): positions i with 0 <= i - start < n take
        src[i - start], the others keep their value, in one select over this tensor's shape."""
        from .tensor import arange
        size, n = self.shape[dim], src.shape[dim]
        if n == 0:                  # nothing to write (and no row of src to pick from)
            return self
        along = [1] * self.rank
        along[dim] = size
        offset = arange(0, size) - start.reshape((1,)).broadcast_as((size,))
        inside = (offset >= 0) * (offset < n)
        spread = src.broadcast_as(self.shape) if n == 1 else src.index_select(offset.clip(0, n - 1), dim)
        return inside.reshape(tuple(along)).broadcast_as(self.shape).where_cond(spread, self)

    def _row_set(self, src, dim, start):
        """One position written (the decode step's KV-cache update) as an elementwise select
        against an iota compared with `start`: start is a runtime scalar and no size is baked
        into the kernel, so each new position reuses the same compiled kernel."""
        from .tensor import arange
        along = [1] * self.rank
        along[dim] = self.shape[dim]
        picked = arange(0, self.shape[dim]).reshape(tuple(along)) == start
        return picked.broadcast_as(self.shape).where_cond(src.broadcast_as(self.shape), self)

    def slice_assign(self, ranges, src):
        """This tensor with `src` written at `ranges`: one slice(start, end) or (start, end)
        per leading dim (missing trailing dims are whole); src has the ranges' shape."""
        op = "slice_assign"
        ranges = list(ranges)
        if len(ranges) > self.rank:
            raise NarrowInvalidArgs(f"{op}: {len(ranges)} ranges for shape {self.shape} ({self.dtype.name})")
        bounds = []
        for d, r in enumerate(ranges):
            if isinstance(r, slice):
                if r.step not in (None, 1):
                    raise NarrowInvalidArgs(f"{op}: range {r} for dim {d} must have step 1 "
                                            f"({shape_desc(self.shape, self.dtype)})")
                lo, hi = r.start, r.stop
            else:
                lo, hi = r
            lo = 0 if lo is None else _int(op, "range start", lo)
            hi = self.shape[d] if hi is None else _int(op, "range end", hi)
            if not 0 <= lo <= hi <= self.shape[d]:
                raise NarrowInvalidArgs(f"{op}: range [{lo}, {hi}) out of bounds for dim {d} of size "
                                        f"{self.shape[d]} (shape {self.shape}, {self.dtype.name})")
            bounds.append((lo, hi))
        bounds += [(0, s) for s in self.shape[len(bounds):]]
        want = tuple(hi - lo for lo, hi in bounds)
        if src.dtype is not self.dtype:
            raise DTypeMismatchBinaryOp(f"{op}: dtype mismatch {self.dtype.name} and src {src.dtype.name} "
                                        f"(shapes {self.shape} and {src.shape})")
        if src.shape != want:
            raise ShapeMismatchBinaryOp(f"{op}: src shape {src.shape} must be the ranges' shape {want} "
                                        f"(tensor {self.shape}, {self.dtype.name})")
        return self._assign(bounds, src)

    def _assign(self, bounds, src):
        """Write src at bounds: one cat along the outermost partial dim, its middle piece the
        (recursively) assigned slab."""
        partial = [d for d, (lo, hi) in enumerate(bounds) if (lo, hi) != (0, self.shape[d])]
        if not partial:
            return src.contiguous()
        d = partial[0]
        lo, hi = bounds[d]
        slab = self.narrow(d, lo, hi - lo)
        if len(partial) > 1:
            slab = slab._assign([(0, hi - lo) if i == d else b for i, b in enumerate(bounds)], src)
        else:
            slab = src
        return self._spliced(slab, d, lo)
