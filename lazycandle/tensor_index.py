"""Indexing, data movement, convolution, pooling and upsampling of the Tensor API.

Kernels of their own (category INDEX, run by runtime/index_steps.py): index_select, gather,
scatter, scatter_add, index_add, cat and im2col.  The rest are graphs of those and of views:
  stack            unsqueeze + cat
  pad_with_zeros   cat with zeros; pad_with_same: cat with broadcast edge slices
  conv1d / conv2d  im2col (zero padding, strided input) -> kernel (G, c_out/G, K) @ cols
                   (b, G, K, oh*ow) through broadcast_matmul (BLAS or the tiled GEMM) -> view
  max/avg_pool2d   an overlapping strided window view (b, c, oh, ow, kh, kw) reduced by the
                   max / mean reduction kernel (no copy of the windows)
  upsample         index_select with the source indices floor(i * src / dst) (a strided view
                   when down-sampling by an integer factor)
Shape, dtype and dim errors are raised here, at the call.  An id out of range is found by the
kernel (every id is checked) and raised as IndexOutOfBounds when the tensor is realized.
"""
from __future__ import annotations

from . import dtype as D
from .errors import (DTypeMismatchBinaryOp, NarrowInvalidArgs, ShapeMismatch, ShapeMismatchBinaryOp,
                     UnsupportedDTypeForOp)
from .ir import ops_index  # noqa: F401  (registers the op kinds)
from .ir.node import Node
from .layout import Layout, as_index
from .named_dims import require, require_ge0
from .sizes import decide_eq, decide_ge0
from .tensor_views import norm_dim, shape_desc

ID_DTYPES = (D.u8, D.u32, D.i64)


def _tensor_type():
    from .tensor import Tensor
    return Tensor


def _as_tensor(x, op, what):
    T = _tensor_type()
    if isinstance(x, T):
        return x
    from .tensor import tensor
    try:
        return tensor(x)
    except Exception:
        raise TypeError(f"{op}: {what} must be a Tensor, got {type(x).__name__}") from None


def _ids(ids, op):
    ids = _as_tensor(ids, op, "ids")
    if ids.dtype not in ID_DTYPES:
        raise UnsupportedDTypeForOp(f"{op}: ids dtype must be u8, u32 or i64, got {ids.dtype.name} "
                                    f"(ids shape {ids.shape})")
    return ids


def _no_storage_only(op, dt, shape):
    if dt.storage_only:
        raise UnsupportedDTypeForOp(f"{op}: dtype {dt.name} is storage-only (no arithmetic) (shape {tuple(shape)})")


def _same_except(a, b, dim) -> bool:
    return len(a) == len(b) and all(decide_eq(x, y) is not False for i, (x, y) in enumerate(zip(a, b)) if i != dim)


def _int_arg(op, name, v, lo, error=ShapeMismatch, *, of=None):
    """An int argument >= lo (TypeError for floats and bools, `error` when too small, naming
    the tensor `of` when given)."""
    iv = as_index(v, op, name)
    # (a size of named dims that may be in range passes; a negative bound size fails at run)
    if iv < lo if iv.__class__ is int else decide_ge0(iv - lo) is False:
        where = f" ({shape_desc(of.shape, of.dtype)})" if of is not None else ""
        raise error(f"{op}: {name} must be an int >= {lo}, got {v!r}{where}")
    return iv


def _pair(op, name, v, lo):
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{op}: {name} must be an int or a pair, got {v!r}")
        return _int_arg(op, name, v[0], lo), _int_arg(op, name, v[1], lo)
    x = _int_arg(op, name, v, lo)
    return x, x


class IndexMixin:
    __slots__ = ()

    # ---- gather family ------------------------------------------------------------------
    def index_select(self, ids, dim):
        """out[.., i, ..] = self[.., ids[i], ..] along `dim`; ids is 1-D (u8, u32 or i64)."""
        op = "index_select"
        ids = _ids(ids, op)
        dim = norm_dim(dim, self.shape, op, dtype=self.dtype)
        if ids.rank != 1:
            raise ShapeMismatchBinaryOp(f"{op}: ids must be 1-D, got ids shape {ids.shape} for tensor shape "
                                        f"{self.shape} ({self.dtype.name})")
        shape = self.shape[:dim] + (ids.shape[0],) + self.shape[dim + 1:]
        return type(self)(Node(op, (self.materializable()._node, ids.materializable()._node), dim, shape,
                               self.dtype, label=f"{op}(dim={dim})"))

    def embedding(self, ids):
        """candle's embedding: a (v, h) table indexed by 1-D ids -> (len(ids), h)."""
        ids = _ids(ids, "embedding")
        if self.rank != 2 or ids.rank != 1:
            raise ShapeMismatchBinaryOp(f"embedding: needs a 2-D table and 1-D ids, got {self.shape} and {ids.shape} "
                                        f"({self.dtype.name})")
        return self.index_select(ids, 0)

    def gather(self, ids, dim):
        """out[.., i, ..] = self[.., ids[.., i, ..], ..]; ids has self's shape except along `dim`."""
        op = "gather"
        ids = _ids(ids, op)
        dim = norm_dim(dim, self.shape, op, dtype=self.dtype)
        if not _same_except(self.shape, ids.shape, dim):
            raise ShapeMismatchBinaryOp(f"{op}: ids shape {ids.shape} must equal tensor shape {self.shape} except "
                                        f"along dim {dim} ({self.dtype.name})")
        return type(self)(Node(op, (self.materializable()._node, ids.materializable()._node), dim, ids.shape,
                               self.dtype, label=f"{op}(dim={dim})"))

    # ---- scatter family -----------------------------------------------------------------
    def _scatter(self, op, ids, src, dim, arith):
        ids = _ids(ids, op)
        src = _as_tensor(src, op, "src")
        dim = norm_dim(dim, self.shape, op, dtype=self.dtype)
        if src.dtype is not self.dtype:
            raise DTypeMismatchBinaryOp(f"{op}: dtype mismatch self {self.dtype.name} src {src.dtype.name} "
                                        f"(shapes {self.shape} and {src.shape})")
        if arith:
            _no_storage_only(op, self.dtype, self.shape)
        if not _same_except(self.shape, src.shape, dim):
            raise ShapeMismatchBinaryOp(f"{op}: src shape {src.shape} must equal tensor shape {self.shape} except "
                                        f"along dim {dim} ({self.dtype.name})")
        if op == "index_add":
            if ids.rank != 1 or ids.shape[0] != src.shape[dim]:
                raise ShapeMismatchBinaryOp(f"{op}: ids must be 1-D with src.shape[{dim}] = {src.shape[dim]} "
                                            f"elements, got ids shape {ids.shape} (tensor {self.shape}, src "
                                            f"{src.shape}, {self.dtype.name})")
        elif ids.shape != src.shape:
            raise ShapeMismatchBinaryOp(f"{op}: ids shape {ids.shape} must equal src shape {src.shape} "
                                        f"(tensor {self.shape}, {self.dtype.name})")
        srcs = (self.materializable()._node, ids.materializable()._node, src.materializable()._node)
        return type(self)(Node(op, srcs, dim, self.shape, self.dtype, label=f"{op}(dim={dim})"))

    def scatter_add(self, ids, src, dim):
        """A copy of self with out[.., ids[.., i, ..], ..] += src[.., i, ..] (ids.shape == src.shape)."""
        return self._scatter("scatter_add", ids, src, dim, True)

    def scatter(self, ids, src, dim):
        """A copy of self with out[.., ids[.., i, ..], ..] = src[.., i, ..]; for duplicate ids the
        last write along `dim` wins."""
        return self._scatter("scatter", ids, src, dim, False)

    def index_add(self, ids, src, dim):
        """A copy of self with out[.., ids[i], ..] += src[.., i, ..] (ids 1-D)."""
        return self._scatter("index_add", ids, src, dim, True)

    # ---- padding ------------------------------------------------------------------------
    def _pad_args(self, op, dim, left, right):
        dim = norm_dim(dim, self.shape, op, dtype=self.dtype)
        return (dim, _int_arg(op, "left", left, 0, NarrowInvalidArgs, of=self),
                _int_arg(op, "right", right, 0, NarrowInvalidArgs, of=self))

    def pad_with_zeros(self, dim, left, right):
        """Pad `dim` with `left` zeros before and `right` zeros after."""
        from .tensor import zeros
        dim, left, right = self._pad_args("pad_with_zeros", dim, left, right)
        if decide_eq(left, 0) is True and decide_eq(right, 0) is True:
            return self
        parts = []
        for n in (left, None, right):
            if n is None:
                parts.append(self)
            elif n.__class__ is not int or n:
                parts.append(zeros(self.shape[:dim] + (n,) + self.shape[dim + 1:], self.dtype))
        return cat(parts, dim)

    def pad_with_same(self, dim, left, right):
        """Pad `dim` by repeating its first slice `left` times and its last slice `right` times."""
        op = "pad_with_same"
        dim, left, right = self._pad_args(op, dim, left, right)
        if decide_eq(left, 0) is True and decide_eq(right, 0) is True:
            return self
        size = self.shape[dim]
        if decide_eq(size, 0) is True:      # (a named dim bound to 0: narrow's check, at run)
            raise NarrowInvalidArgs(f"{op}: cannot repeat the edge of an empty dim {dim} "
                                    f"({shape_desc(self.shape, self.dtype)})")
        parts = []
        for n, at in ((left, 0), (None, None), (right, size - 1)):
            if n is None:
                parts.append(self)
            elif n.__class__ is not int or n:
                parts.append(self.narrow(dim, at, 1).broadcast_as(self.shape[:dim] + (n,) + self.shape[dim + 1:]))
        return cat(parts, dim)

    # ---- convolution --------------------------------------------------------------------
    def _conv_check(self, op, kernel, rank):
        kernel = _as_tensor(kernel, op, "kernel")
        if kernel.dtype is not self.dtype:
            raise DTypeMismatchBinaryOp(f"{op}: dtype mismatch input {self.dtype.name} kernel {kernel.dtype.name} "
                                        f"(shapes {self.shape} and {kernel.shape})")
        _no_storage_only(op, self.dtype, self.shape)
        from .tensor_matmul import MATMUL_DTYPES
        if self.dtype.name not in MATMUL_DTYPES:
            raise UnsupportedDTypeForOp(f"{op}: dtype {self.dtype.name} is not supported (shape {self.shape})")
        if self.rank != rank or kernel.rank != rank:
            raise ShapeMismatchBinaryOp(f"{op}: expected rank-{rank} input and kernel, got input {self.shape} "
                                        f"kernel {kernel.shape} ({self.dtype.name})")
        return kernel

    def conv1d(self, kernel, padding=0, stride=1, dilation=1, groups=1):
        """1-D convolution (cross-correlation): input (b, c_in, l), kernel (c_out, c_in/groups, k)
        -> (b, c_out, l_out), l_out = (l + 2 padding - dilation (k - 1) - 1) / stride + 1."""
        op = "conv1d"
        kernel = self._conv_check(op, kernel, 3)
        p = _int_arg(op, "padding", padding, 0)
        s = _int_arg(op, "stride", stride, 1)
        d = _int_arg(op, "dilation", dilation, 1)
        y = _conv(op, self.unsqueeze(2), kernel.unsqueeze(2), (0, p), (1, s), (1, d), groups,
                  (self.shape, kernel.shape))
        return y.squeeze(2)

    def conv2d(self, kernel, padding=0, stride=1, dilation=1, groups=1):
        """2-D convolution (cross-correlation): input (b, c_in, h, w), kernel
        (c_out, c_in/groups, kh, kw) -> (b, c_out, oh, ow).  padding, stride and dilation are
        ints or (h, w) pairs."""
        op = "conv2d"
        kernel = self._conv_check(op, kernel, 4)
        return _conv(op, self, kernel, _pair(op, "padding", padding, 0), _pair(op, "stride", stride, 1),
                     _pair(op, "dilation", dilation, 1), groups, (self.shape, kernel.shape))

    # ---- pooling ------------------------------------------------------------------------
    def _pool(self, op, k, stride):
        if self.rank != 4:
            raise ShapeMismatch(f"{op}: expected a (b, c, h, w) tensor, got shape {self.shape} ({self.dtype.name})")
        _no_storage_only(op, self.dtype, self.shape)
        kh, kw = _pair(op, "kernel size", k, 1)
        sh, sw = (kh, kw) if stride is None else _pair(op, "stride", stride, 1)
        b, c, h, w = self.shape
        checks = []         # a spatial dim of named size: checked when it is bound
        for size, k in ((h, kh), (w, kw)):
            require_ge0(checks, size - k, ShapeMismatch, f"{op}: kernel ({kh}, {kw}) larger than the input's "
                        f"spatial dims {self.shape} ({self.dtype.name})")
        oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
        x = self.materializable()
        lay = x._node.layout
        s = lay.strides
        win = Layout((b, c, oh, ow, kh, kw), (s[0], s[1], s[2] * sh, s[3] * sw, s[2], s[3]), lay.offset)
        out = Node("view", (x._node,), None, win.shape, self.dtype, layout=win,
                   label=f"{op} windows ({kh}, {kw}) stride ({sh}, {sw})")
        require(out, checks)
        return type(self)(out)

    def max_pool2d(self, k, stride=None):
        """Max over (kh, kw) windows of a (b, c, h, w) tensor, stride defaulting to the window."""
        return self._pool("max_pool2d", k, stride)._reduce("max", (4, 5), False)

    def avg_pool2d(self, k, stride=None):
        """Mean over (kh, kw) windows of a (b, c, h, w) tensor (float dtypes), stride defaulting
        to the window."""
        if not self.dtype.is_float:
            raise UnsupportedDTypeForOp(f"avg_pool2d: needs a float dtype, got {self.dtype.name} (shape {self.shape})")
        return self._pool("avg_pool2d", k, stride)._reduce("mean", (4, 5), False)

    def max_pool2d_with_stride(self, k, stride):
        return self.max_pool2d(k, stride)

    def avg_pool2d_with_stride(self, k, stride):
        return self.avg_pool2d(k, stride)

    # ---- upsampling ---------------------------------------------------------------------
    def _nearest(self, dim, size, op):
        """Resize `dim` to `size` by nearest neighbour: source index floor(i * src / size)."""
        src = self.shape[dim]
        if decide_eq(size, src) is True:
            return self
        if src.__class__ is not int or size.__class__ is not int:
            return self._nearest_sized(dim, size, src, op)
        if src == 0 or size == 0:
            if src == 0 and size:
                raise ShapeMismatch(f"{op}: cannot upsample an empty dim {dim} ({shape_desc(self.shape, self.dtype)}) "
                                    f"to {size}")
            return self.narrow(dim, 0, 0)
        if src % size == 0:        # integer down-sampling: every (src/size)-th element, a view
            idx = [slice(None)] * self.rank
            idx[dim] = slice(None, None, src // size)
            return self[tuple(idx)]
        from .tensor import tensor
        ids = tensor([i * src // size for i in range(size)], dtype=D.u32 if src < 2 ** 32 else D.i64)
        return self.index_select(ids, dim)

    def _nearest_sized(self, dim, size, src, op):
        """_nearest where a size is of named dims: the source ids floor(i * src / size) computed
        by the program (i64), an empty source checked when the sizes are bound."""
        from .tensor import arange
        checks = []
        require_ge0(checks, src - 1, ShapeMismatch, f"{op}: cannot upsample an empty dim {dim} "
                    f"({shape_desc(self.shape, self.dtype)}) to {size}")
        out = self.index_select((arange(size) * src) // size, dim)
        require(out._node, checks, first=True)
        return out

    def upsample_nearest1d(self, size):
        """(b, c, l) -> (b, c, size), nearest neighbour (source index floor(i * l / size))."""
        op = "upsample_nearest1d"
        if self.rank != 3:
            raise ShapeMismatch(f"{op}: expected a (b, c, l) tensor, got shape {self.shape} ({self.dtype.name})")
        return self._nearest(2, _int_arg(op, "size", size, 0), op)

    def upsample_nearest2d(self, h, w):
        """(b, c, h0, w0) -> (b, c, h, w), nearest neighbour (source index floor(i * src / dst))."""
        op = "upsample_nearest2d"
        if self.rank != 4:
            raise ShapeMismatch(f"{op}: expected a (b, c, h, w) tensor, got shape {self.shape} ({self.dtype.name})")
        h, w = _int_arg(op, "h", h, 0), _int_arg(op, "w", w, 0)
        return self._nearest(2, h, op)._nearest(3, w, op)

    interpolate1d = upsample_nearest1d
    interpolate2d = upsample_nearest2d


def _conv(op, x, kernel, padding, stride, dilation, groups, shapes):
    """conv2d on (b, c, h, w) x (c_out, c_in/groups, kh, kw) with pairs for the parameters."""
    groups = _int_arg(op, "groups", groups, 1)
    b, c, h, w = x.shape
    co, cpg, kh, kw = kernel.shape
    xs, ks = shapes
    if cpg * groups != c or co % groups or kh < 1 or kw < 1:
        raise ShapeMismatchBinaryOp(f"{op}: input {xs} and kernel {ks} do not match with groups={groups} "
                                    f"(need c_in = kernel.shape[1] * groups and c_out divisible by groups) "
                                    f"({x.dtype.name})")
    (ph, pw), (sh, sw), (dh, dw) = padding, stride, dilation
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    checks = []         # an output size of named dims is checked when they are bound
    for o in (oh, ow):
        require_ge0(checks, o - 1, ShapeMismatchBinaryOp, f"{op}: input {xs} is too small for kernel {ks} with "
                    f"padding {padding}, dilation {dilation} ({x.dtype.name})")
    T = type(x)
    G, cog, K, L = groups, co // groups, cpg * kh * kw, oh * ow
    x = x.materializable()
    if kh == kw == 1 and sh == sw == 1 and ph == pw == 0:
        cols = x.reshape((b, G, K, L))
    else:
        cols = T(Node("im2col", (x._node,), (kh, kw, ph, pw, sh, sw, dh, dw), (b, c, kh, kw, oh, ow), x.dtype,
                      label=f"im2col k=({kh}, {kw}) p=({ph}, {pw}) s=({sh}, {sw}) d=({dh}, {dw})"))
        cols = cols.reshape((b, G, K, L))
    y = kernel.reshape((G, cog, K)).broadcast_matmul(cols)        # (b, G, cog, L)
    y = y.reshape((b, co, oh, ow))
    require(y._node, checks, first=True)
    return y


def _tensor_list(ts, op):
    """`ts` as a non-empty list of Tensors, or the error naming `op`."""
    T = _tensor_type()
    ts = list(ts)
    if not ts:
        raise ValueError(f"{op}: needs at least one tensor")
    for t in ts:
        if not isinstance(t, T):
            raise TypeError(f"{op}: expected Tensors, got {type(t).__name__}")
    return ts


def cat(ts, dim=0):
    """Concatenate tensors of one dtype and rank along `dim` (other dims must be equal)."""
    op = "cat"
    T = _tensor_type()
    ts = _tensor_list(ts, "cat")
    t0 = ts[0]
    dim = norm_dim(dim, t0.shape, op, dtype=t0.dtype)
    for t in ts[1:]:
        if t.dtype is not t0.dtype:
            raise DTypeMismatchBinaryOp(f"cat: dtype mismatch {t0.dtype.name} and {t.dtype.name} "
                                        f"(shapes {t0.shape} and {t.shape})")
        if not _same_except(t0.shape, t.shape, dim):
            raise ShapeMismatchBinaryOp(f"cat: shapes {t0.shape} and {t.shape} differ outside dim {dim} "
                                        f"({t0.dtype.name})")
    if len(ts) == 1:
        return t0
    shape = t0.shape[:dim] + (sum(t.shape[dim] for t in ts),) + t0.shape[dim + 1:]
    srcs = tuple(t.materializable()._node for t in ts)
    return T(Node(op, srcs, dim, shape, t0.dtype, label=f"cat(dim={dim}, n={len(ts)})"))


def stack(ts, dim=0):
    """Stack tensors of one shape along a new dim `dim` (unsqueeze + cat)."""
    ts = _tensor_list(ts, "stack")
    t0 = ts[0]
    dim = norm_dim(dim, t0.shape, "stack", extra=1, dtype=t0.dtype)
    for t in ts[1:]:
        if t.dtype is not t0.dtype:
            raise DTypeMismatchBinaryOp(f"stack: dtype mismatch {t0.dtype.name} and {t.dtype.name} "
                                        f"(shapes {t0.shape} and {t.shape})")
        if t.shape != t0.shape:
            raise ShapeMismatchBinaryOp(f"stack: shapes {t0.shape} and {t.shape} differ ({t0.dtype.name})")
    return cat([t.unsqueeze(dim) for t in ts], dim)


__all__ = ["IndexMixin", "cat", "stack"]
