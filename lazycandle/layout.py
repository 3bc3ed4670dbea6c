"""Strided layouts: shape, strides and start offset, all in elements.  Every view op is a pure
function Layout -> Layout (no data moves); `merge_dims` collapses loop dimensions that are
contiguous for every operand of a kernel at once."""
from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from math import prod

from .sizes import Size, decide_ge0, is_one


def as_index(value, op: str, what: str = "index") -> int:
    """`value` as a Python int the way NumPy takes dims, sizes and indices: ints and NumPy
    integers (anything with __index__) pass; floats, bools and strings raise TypeError.  An
    lc.Size (a size of named dims) is returned as it is."""
    if isinstance(value, bool):     # NumPy's bool has no __index__: operator.index refuses it
        raise TypeError(f"{op}: {what} must be an int, got the bool {value!r}")
    if isinstance(value, int) or value.__class__ is Size:
        return value
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{op}: {what} must be an int, got {type(value).__name__} {value!r}") from None


def as_shape(shape, op: str, error=ValueError) -> tuple:
    """`shape` (an int or a sequence of ints) as a tuple of non-negative Python ints: the one
    check every shape-taking call goes through.  A float or bool size is a TypeError; a
    negative size raises `error` (the op's typed error class) naming the op; a Size that may
    bind negative is checked when it is bound (named_dims.bind)."""
    if not isinstance(shape, (tuple, list)):
        try:
            shape = tuple(shape)        # any other sequence (an ndarray, a torch.Size)
        except TypeError:
            shape = (shape,)            # one size
    dims = tuple(as_index(d, op, "a size in a shape") for d in shape)
    if any(d < 0 if d.__class__ is int else decide_ge0(d) is False for d in dims):
        raise error(f"{op}: negative size in shape {dims}")
    return dims


def _same(a, b) -> bool:
    """Whether two strides or sizes are equal (a Size only when provably)."""
    if a.__class__ is int and b.__class__ is int:
        return a == b
    from .sizes import same
    return same(a, b)


def _positive(s) -> bool:
    """Whether stride `s` is > 0; a Size stride of a named-dim view is a positive multiple of
    sizes, or negative when provably so (a flip)."""
    if s.__class__ is int:
        return s > 0
    return decide_ge0(s) is not False


def contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


@dataclass(frozen=True, slots=True)
class Layout:
    shape: tuple
    strides: tuple
    offset: int = 0

    @staticmethod
    def contiguous(shape, offset=0) -> "Layout":
        shape = as_shape(shape, "layout")
        return Layout(shape, contiguous_strides(shape), offset)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    def is_contiguous(self) -> bool:
        """Row-major contiguous (ignoring strides of size-1 dims)."""
        acc = 1
        try:
            for d, s in zip(reversed(self.shape), reversed(self.strides)):
                if d != 1 and s != acc:
                    return False
                acc *= d
            return True
        except TypeError:       # (lc.SymbolicSizeError) a size of named dims: not taken for 1
            acc = 1
            for d, s in zip(reversed(self.shape), reversed(self.strides)):
                if not is_one(d) and not _same(s, acc):
                    return False
                acc *= d
            return True

    def span(self) -> tuple:
        """(lowest, highest) element offset touched; (offset, offset-1) when empty."""
        if self.numel == 0:
            return self.offset, self.offset - 1
        lo = hi = self.offset
        for d, s in zip(self.shape, self.strides):
            if _positive(s):
                hi += (d - 1) * s
            else:
                lo += (d - 1) * s
        return lo, hi

    # ---- views -------------------------------------------------------------------------
    def permute(self, dims) -> "Layout":
        return Layout(tuple(self.shape[d] for d in dims), tuple(self.strides[d] for d in dims), self.offset)

    def narrow(self, dim, start, length) -> "Layout":
        shape = list(self.shape)
        shape[dim] = length
        moved = length.__class__ is not int or length      # (an empty view keeps its offset)
        return Layout(tuple(shape), self.strides, self.offset + start * self.strides[dim] if moved else self.offset)

    def slice(self, dim, start, stop, step) -> "Layout":
        """Python's range(start, stop, step) along `dim` (start, stop already in range as
        slice.indices gives them); a negative step is a negative stride."""
        n = (stop - start + step - 1) // step if step > 0 else (start - stop - step - 1) // -step   # len(range(...))
        if n.__class__ is int:
            n = max(0, n)
        shape, strides = list(self.shape), list(self.strides)
        shape[dim] = n
        strides[dim] = self.strides[dim] * step
        off = self.offset + start * self.strides[dim] if n.__class__ is not int or n else self.offset
        return Layout(tuple(shape), tuple(strides), off)

    def flip(self, dim) -> "Layout":
        """`dim` in reverse order: its stride negated, the offset moved to its last element."""
        n = self.shape[dim]
        strides = list(self.strides)
        strides[dim] = -strides[dim]
        moved = n.__class__ is not int or n
        return Layout(self.shape, tuple(strides), self.offset + (n - 1) * self.strides[dim] if moved else self.offset)

    def select(self, dim, index) -> "Layout":
        """Drop `dim`, keeping element `index` of it."""
        return Layout(self.shape[:dim] + self.shape[dim + 1:], self.strides[:dim] + self.strides[dim + 1:],
                      self.offset + index * self.strides[dim])

    def broadcast_as(self, shape) -> "Layout":
        """Caller checked compatibility: leading new dims and size-1 dims get stride 0."""
        shape = as_shape(shape, "broadcast")
        extra = len(shape) - self.rank
        strides = [0] * extra
        for d_new, d_old, s in zip(shape[extra:], self.shape, self.strides):
            strides.append(0 if is_one(d_old) and not is_one(d_new) else s)
        return Layout(shape, tuple(strides), self.offset)

    def unsqueeze(self, dim) -> "Layout":
        inner = self.strides[dim] * self.shape[dim] if dim < self.rank else 1
        return Layout(self.shape[:dim] + (1,) + self.shape[dim:], self.strides[:dim] + (inner,) + self.strides[dim:],
                      self.offset)

    def reshape(self, shape) -> "Layout | None":
        """The strided view with `shape` over the same elements in row-major order, or None when
        strides cannot express it (then the caller copies)."""
        shape = tuple(shape)
        if self.is_contiguous():
            return Layout.contiguous(shape, self.offset)
        if any(d.__class__ is Size for d in shape + self.shape + self.strides):
            return None         # sizes of named dims: a copy, rather than runs of dims matched by value
        # Split the old layout into maximal runs of mergeable dims, then carve the new shape
        # out of those runs.
        old = [(d, s) for d, s in zip(self.shape, self.strides) if d != 1]
        new_strides = []
        oi = 0
        ni = 0
        new_nz = [i for i, d in enumerate(shape) if d != 1]
        strides_out = [0] * len(shape)
        while ni < len(new_nz):
            if oi >= len(old):
                return None
            # one run of old dims that are contiguous with each other
            run_size, run_inner = old[oi][0], old[oi][1]
            oj = oi
            while oj + 1 < len(old) and old[oj][1] == old[oj + 1][0] * old[oj + 1][1]:
                oj += 1
                run_size *= old[oj][0]
            run_inner = old[oj][1]
            # take new dims until their product equals the run size
            acc = 1
            taken = []
            while ni < len(new_nz) and acc < run_size:
                acc *= shape[new_nz[ni]]
                taken.append(new_nz[ni])
                ni += 1
            if acc != run_size:
                return None
            st = run_inner
            for idx in reversed(taken):
                strides_out[idx] = st
                st *= shape[idx]
            oi = oj + 1
        if oi != len(old):
            return None
        for i, d in enumerate(shape):
            if d == 1:
                strides_out[i] = (strides_out[i + 1] * shape[i + 1]) if i + 1 < len(shape) else 1
        del new_strides
        return Layout(shape, tuple(strides_out), self.offset)


MEMO_SHAPES = 4096      # distinct shapes each memo below keeps (a bound: shapes can be dynamic)
_contiguous: dict = {}
CONTIGUOUS_LAYOUTS = _contiguous     # the memo of contiguous_layout, read directly by Node() (a hot path)
_scalar_broadcast: dict = {}
_reshaped: dict = {}
_broadcast: dict = {}


def _memoize(memo: dict, shape: tuple, value, key=None):
    """Keep `value` for `shape` (or for `key`, made of it) while the memo has room, if the shape
    holds plain ints only (a traced size of named dims, an int subclass, must stay in the
    layouts made for it)."""
    if len(memo) < MEMO_SHAPES and all(d.__class__ is int for d in shape):
        memo[shape if key is None else key] = value
    return value


def contiguous_layout(shape: tuple) -> Layout:
    """Layout.contiguous(shape) for a shape tuple, memoized: nodes of one shape share one
    Layout (layouts are immutable; a shape is validated when first met)."""
    lay = _contiguous.get(shape)
    if lay is None:
        lay = _memoize(_contiguous, shape, Layout.contiguous(shape))
    return lay


def scalar_broadcast(shape: tuple) -> tuple:
    """(layout, label) of a scalar broadcast to a node's (validated) shape tuple: all strides
    0, labelled as `broadcast_as` labels it; memoized like `contiguous_layout`."""
    got = _scalar_broadcast.get(shape)
    if got is None:
        got = _memoize(_scalar_broadcast, shape, (Layout(shape, (0,) * len(shape), 0), f"broadcast_as{shape}"))
    return got


def broadcast_view(layout: Layout, shape: tuple) -> tuple:
    """(layout, label) of `layout` broadcast to the (checked) shape tuple, labelled as
    `broadcast_as` labels it; memoized per (layout, shape) like `contiguous_layout` (each eager
    broadcasting op makes one: four of layer_norm's nine)."""
    key = (layout, shape)
    got = _broadcast.get(key)
    if got is None:
        got = _memoize(_broadcast, shape + layout.shape, (layout.broadcast_as(shape), f"broadcast_as{shape}"), key)
    return got


def reshape_view(shape: tuple) -> tuple:
    """(layout, label) of a contiguous view of a node reshaped to the (validated) shape tuple,
    labelled as `reshape` labels it; memoized like `contiguous_layout` (a reduction dropping
    its dims makes one per eager call, usually after a kernel that streamed the caches out)."""
    got = _reshaped.get(shape)
    if got is None:
        got = _memoize(_reshaped, shape, (contiguous_layout(shape), f"reshape{shape}"))
    return got


def merge_dims(shape, strides_list):
    """Collapse loop dims for a kernel whose operands walk `shape` with the given stride tuples.
    Size-1 dims are dropped; dims i, i+1 merge when for every operand stride[i] ==
    stride[i+1] * shape[i+1].  Returns (shape, [strides per operand]), at least rank 1."""
    dims = [i for i, d in enumerate(shape) if not is_one(d)]
    if not dims:
        return (1,), [(0,) for _ in strides_list]
    out_shape = [shape[dims[0]]]
    out_strides = [[s[dims[0]]] for s in strides_list]
    for i in dims[1:]:
        d = shape[i]
        if all(_same(os[-1], s[i] * d) for os, s in zip(out_strides, strides_list)):
            out_shape[-1] *= d
            for os, s in zip(out_strides, strides_list):
                os[-1] = s[i]
        else:
            out_shape.append(d)
            for os, s in zip(out_strides, strides_list):
                os.append(s[i])
    return tuple(out_shape), [tuple(s) for s in out_strides]


def batch_offsets(bshape, *strides) -> list:
    """Element offsets of every index of `bshape` (row-major), one per stride tuple."""
    return [tuple(sum(i * s for i, s in zip(idx, st)) for st in strides)
            for idx in itertools.product(*(range(d) for d in bshape))]
