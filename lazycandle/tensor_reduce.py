"""Reductions: sum / mean / prod over any dims, max / min / argmax / argmin over one dim, and the
`_all` forms.  Each builds one reduce node with keepdim semantics; the non-keepdim forms are a
view that drops the reduced dims.

Both call forms work: candle's positional `sum(dims)` / `sum_keepdim(dims)` and torch's
`sum()` (everything), `sum(dim=..., keepdim=True)`; NumPy's `axis=` is accepted as `dim`.
Statistics built from these (var, std, logsumexp, norm, all, any) live in tensor_extras.py."""
from __future__ import annotations

from math import prod

from . import caches
from . import dtype as D
from .errors import DimOutOfRange, EmptyReduction, ShapeMismatch, UnsupportedDTypeForOp
from .ir.node import Node, computed_node, view_node
from .ir.ops import OPS, REDUCE
from .layout import MEMO_SHAPES, as_index, reshape_view
from .named_dims import require, require_ge0
from .sizes import decide_eq, has_size
from .tensor_views import norm_dim, shape_desc

# argmax / argmin return u32 indices, so the dim they reduce can hold at most this many elements
MAX_ARG_DIM = 2 ** 32 - 1
# kinds defined over a zero-length dim (sum 0, prod 1, mean NaN); the others raise EmptyReduction
EMPTY_OK_KINDS = ("sum", "mean", "prod")
_VIEW, _PLACEHOLDER = OPS["view"], OPS["placeholder"]
SPLIT_KINDS = ("sum", "mean")
# A sum or mean over the first dim of a large stored input of short rows is built as two
# reductions: over SPLIT_CHUNKS chunks of the rows, then over the chunks' results.  Split
# between threads, the one reduction gave each thread part of every row, which Zen 4's
# prefetchers lose (2 threads slower than 1); chunks give each thread whole rows of its own.
# sum(0) f32 from DRAM, 2 threads, GB/s (python -m bench.reduce_streams --dim 0 --split 8):
# (65536, 256) 13.8 -> 24.5, (131072, 64) 19.0 -> 35.3; 1 thread within -7 .. +2 %.  The
# split depends on the shape alone, so 1 and 2 threads give the same bits.
SPLIT_CHUNKS = 8
SPLIT_MIN_BYTES = 1 << 25       # inputs below this stay one reduction (the L3 serves both forms alike)
SPLIT_MAX_ROW_BYTES = 2048      # wider rows are split between threads in runs long enough
SPLIT_DTYPES = ("f32", "f64", "i32", "i64", "u32")     # partials kept in the dtype lose nothing much
# (kind, dim, keepdim, shape, dtype) -> how _reduce built it: (op, arg, shape, layout, dtype,
# (shape, layout, label) of the view dropping the dims, or None)
_recipes = caches.register("reduce recipes", {})


def _dims(dims, shape, op, *, dtype=None):
    """The reduced dims as a sorted tuple of non-negative ints (a rank-0 tensor takes 0 or -1,
    like torch); NumPy's rules for the type of each dim.  `dtype` is for the error messages."""
    if dims.__class__ is int:   # the common case, without the TypeError below
        n = len(shape)
        if -n <= dims < n:
            return (dims + n if dims < 0 else dims,)
        dims = [dims]
    else:
        try:
            dims = [dims] if isinstance(dims, str) else list(dims)
        except TypeError:           # one dim (a NumPy integer, a 0-d array)
            dims = [dims]
    if not dims:
        raise ValueError(f"{op}: no dims given")
    if not shape:
        for d in dims:
            if as_index(d, op, "dim") not in (0, -1):
                raise DimOutOfRange(f"{op}: dim {d} out of range for a rank-0 tensor (only 0 and -1)"
                                    + (f" ({dtype.name})" if dtype is not None else ""))
        return (0,)
    return tuple(sorted({norm_dim(d, shape, op, dtype=dtype) for d in dims}))


def _splits_by_shape(kind, dims, x_shape, dt) -> bool:
    """Whether a reduction of `kind` over `dims` of `x_shape` and `dt` is split in chunks
    (SPLIT_CHUNKS) when its input is stored and its first dim splits as a view."""
    if kind not in SPLIT_KINDS or dims != (0,) or len(x_shape) < 2 or dt.name not in SPLIT_DTYPES \
            or has_size(x_shape):
        return False
    rows, row_bytes = x_shape[0], prod(x_shape[1:]) * dt.size_in_bytes
    return not (rows % SPLIT_CHUNKS or row_bytes > SPLIT_MAX_ROW_BYTES or rows * row_bytes < SPLIT_MIN_BYTES)


def _split_shape(node, kind, dims, x_shape, dt):
    """The shape (chunks, rows per chunk, *rest) that `node`, read by a reduction of `kind`
    over `dims`, is split into, or None.  Only a stored input (a buffer or a placeholder)
    whose first dim splits as a view: a computed one keeps its producers fused."""
    if not _splits_by_shape(kind, dims, x_shape, dt):
        return None
    base = node._base or node
    if base.buffer is None and base.op is not _PLACEHOLDER:
        return None
    shape = (SPLIT_CHUNKS, x_shape[0] // SPLIT_CHUNKS) + x_shape[1:]
    return shape if node.layout.reshape(shape) is not None else None


def _keep_recipe(key, src, out) -> None:
    """File how `out`, _reduce_checked's result for `key` on node `src`, was built while the
    memo has room: a reduce node of `src` (rank >= 1) and maybe its view, for plain sizes
    (traced named dims keep their own path), unless the key is one the chunk split decides by
    its input (a recipe would build it in one form whatever the input)."""
    shape = key[3]
    if len(_recipes) >= MEMO_SHAPES or not shape or has_size(shape):
        return
    view = None
    if out.op is _VIEW:
        view = (out.shape, out.layout, out.label)
        out = out.srcs[0]
    if out.op.category == REDUCE and out.srcs == (src,) and not _splits_by_shape(key[0], out.arg, shape, key[4]):
        _recipes[key] = (out.op, out.arg, out.shape, out.layout, out.dtype, view)


class ReduceMixin:
    __slots__ = ()

    def _reduce(self, kind, dims, keepdim):
        """One reduce node over `dims` (None: every dim), and the view dropping them unless
        `keepdim`.  A reduction over one int dim (or all) of a shape and dtype met before is
        built again from its recipe, without the checks: an eager `x.sum(-1)` usually follows
        a kernel that streamed the caches out, where the checks' Python costs tens of us."""
        node = self._node
        if dims is None or dims.__class__ is int:
            key = (kind, dims, keepdim, node.shape, node.dtype)
            got = _recipes.get(key)
            if got is not None:
                op, arg, shape, lay, dt, view = got
                n = computed_node(op, (node,), arg, shape, dt, lay)
                return type(self)(view_node(n, *view) if view is not None else n)
            t = self._reduce_checked(kind, dims, keepdim)
            _keep_recipe(key, node, t._node)
            return t
        return self._reduce_checked(kind, dims, keepdim)

    def _reduce_checked(self, kind, dims, keepdim):
        # (node attributes read directly, not through the Tensor properties: an eager reduction
        # usually follows a kernel that streamed the caches out, where each call is misses)
        node = self._node
        dt, in_shape = node.dtype, node.shape
        op = f"{kind}_keepdim" if keepdim else kind
        if dt.storage_only:
            raise UnsupportedDTypeForOp(f"{op}: dtype {dt.name} is storage-only (no arithmetic) (shape {in_shape})")
        if kind == "mean" and not dt.is_float:
            raise UnsupportedDTypeForOp(f"{op}: mean needs a float dtype, got {dt.name} (shape {in_shape})")
        if dims is None:
            dims = tuple(range(len(in_shape))) or (0,)
        dims = _dims(dims, in_shape, op, dtype=dt)
        scalar = not in_shape
        x_shape = (1,) if scalar else in_shape
        shape = list(x_shape)
        for d in dims:
            shape[d] = 1
        shape = tuple(shape)
        # max / min / arg* have no value over a zero-length dim: they raise even when the output
        # is empty too, as NumPy and torch do (an empty dim of named sizes is found when they
        # are bound: named_dims.bind)
        if kind not in EMPTY_OK_KINDS and any(decide_eq(x_shape[d], 0) is True for d in dims):
            raise EmptyReduction(f"{op}: reduction over a zero-length dim ({shape_desc(in_shape, dt)}, dims {dims})")
        arg_kind = kind.startswith("arg")
        checks = []
        if arg_kind:
            require_ge0(checks, MAX_ARG_DIM - x_shape[dims[0]], ShapeMismatch,
                        f"{op}: dim {dims[0]} of shape {in_shape} ({dt.name}) is longer than "
                        f"{MAX_ARG_DIM}, the most elements its u32 indices can number")
        split = _split_shape(node, kind, dims, x_shape, dt)
        if split is not None:
            return self.reshape(split)._reduce(kind, 1, False)._reduce(kind, 0, keepdim)
        src = self.unsqueeze(0)._node if scalar else node
        t = type(self)(Node(kind, (src,), dims, shape, D.u32 if arg_kind else dt))
        require(t._node, checks)
        if scalar:
            return t.reshape(())
        if not keepdim:         # a view dropping the reduced dims: the node is contiguous at offset 0,
            if len(dims) == 1:  # so is the view
                d = dims[0]
                out = shape[:d] + shape[d + 1:]
            else:
                out = tuple(d for i, d in enumerate(shape) if i not in dims)
            lay, label = reshape_view(out)
            t = type(self)(Node(_VIEW, (t._node,), None, out, t._node.dtype, layout=lay, label=label))
        return t

    def _many(self, kind, dims, keepdim, dim, axis):
        return self._reduce(kind, _pick(dims, dim, axis, kind), keepdim)

    def sum_keepdim(self, dims): return self._reduce("sum", dims, True)
    def mean_keepdim(self, dims): return self._reduce("mean", dims, True)
    def prod_keepdim(self, dims): return self._reduce("prod", dims, True)

    def sum(self, dims=None, keepdim=False, *, dim=None, axis=None):
        """Sum over `dims` (an int or a sequence; None: every dim)."""
        if dim is None and axis is None:
            return self._reduce("sum", dims, keepdim)
        return self._many("sum", dims, keepdim, dim, axis)

    def mean(self, dims=None, keepdim=False, *, dim=None, axis=None):
        if dim is None and axis is None:
            return self._reduce("mean", dims, keepdim)
        return self._many("mean", dims, keepdim, dim, axis)

    def prod(self, dims=None, keepdim=False, *, dim=None, axis=None):
        """Product over `dims`; integers keep their dtype and wrap (no promotion)."""
        if dim is None and axis is None:
            return self._reduce("prod", dims, keepdim)
        return self._many("prod", dims, keepdim, dim, axis)

    def _one_dim(self, kind, dim, keepdim):
        if dim is None:     # torch: over the flattened tensor (arg kinds index it row-major)
            x = self.flatten_all() if kind.startswith("arg") and self.rank > 1 else self
            t = x._reduce(kind, None, False)
            return t.reshape((1,) * self.rank) if keepdim else t
        if dim.__class__ is not int:
            dim = (as_index(dim, kind, "dim (one int)"),)
        return self._reduce(kind, dim, keepdim)

    def max_keepdim(self, dim): return self._one_dim("max", dim, True)
    def min_keepdim(self, dim): return self._one_dim("min", dim, True)
    def argmax_keepdim(self, dim): return self._one_dim("argmax", dim, True)
    def argmin_keepdim(self, dim): return self._one_dim("argmin", dim, True)

    def max(self, dim=None, keepdim=False, *, axis=None):
        """Max over one dim (None: every element); values only, like candle."""
        return self._one_dim("max", dim if axis is None else _pick(None, dim, axis, "max"), keepdim)

    def min(self, dim=None, keepdim=False, *, axis=None):
        return self._one_dim("min", dim if axis is None else _pick(None, dim, axis, "min"), keepdim)

    def argmax(self, dim=None, keepdim=False, *, axis=None):
        """u32 index of the first maximum along `dim` (None: in the flattened tensor)."""
        return self._one_dim("argmax", dim if axis is None else _pick(None, dim, axis, "argmax"), keepdim)

    def argmin(self, dim=None, keepdim=False, *, axis=None):
        return self._one_dim("argmin", dim if axis is None else _pick(None, dim, axis, "argmin"), keepdim)

    def _all(self, kind):
        return self._reduce(kind, None, False)

    def sum_all(self): return self._all("sum")
    def mean_all(self): return self._all("mean")
    def max_all(self): return self._all("max")
    def min_all(self): return self._all("min")


def _pick(dims, dim, axis, op):
    """The one dims argument among candle's positional, torch's `dim=` and NumPy's `axis=`."""
    given = [d for d in (dims, dim, axis) if d is not None]
    if len(given) > 1:
        raise TypeError(f"{op}: give the dims once (positionally, as dim= or as axis=)")
    return given[0] if given else None
