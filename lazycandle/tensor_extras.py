"""torch / NumPy conveniences of the Tensor API (SPEC "Conveniences"): aliases of candle's ops
(`T`, `mT`, `swapaxes`, `view`, `size`, `astype`, `clip`), softmax, masked_fill, flip,
tril / triu and the statistics built from core reductions (var, std, logsumexp, norm, all,
any).  Everything is a graph of existing ops, so it fuses like user code."""
from __future__ import annotations

import math

import numpy as np

from . import dtype as D
from .errors import BroadcastIncompatibleShapes, DimOutOfRange, IndexOutOfBounds, UnsupportedDTypeForOp, names_op
from .layout import as_index
from .sizes import Size, size_max
from .tensor_math import as_scalar
from .tensor_reduce import _pick
from .tensor_views import norm_dim, shape_desc

MASK_DTYPES = (D.u8, D.u32, D.i64)


def _float_only(op, t):
    if not t.dtype.is_float or t.dtype.storage_only:
        raise UnsupportedDTypeForOp(f"{op}: needs a float dtype, got {t.dtype.name} (shape {t.shape})")


def _as_mask(mask, op):
    """`mask` as a u8 / u32 / i64 tensor (a NumPy bool array or nested lists become u8)."""
    from .tensor import Tensor, tensor
    if not isinstance(mask, Tensor):
        mask = tensor(mask)
    if mask.dtype not in MASK_DTYPES:
        raise UnsupportedDTypeForOp(f"{op}: mask dtype must be u8, u32 or i64, got {mask.dtype.name} "
                                    f"(shape {mask.shape})")
    return mask


def _reduced_count(shape, dims, *, dtype=None) -> int:
    """How many elements each output of a reduction over `dims` (None: all) combines."""
    if dims is None:
        return math.prod(shape)
    dims = [dims] if not isinstance(dims, (tuple, list)) else dims
    return math.prod(shape[norm_dim(d, shape, "reduce", dtype=dtype)] for d in dims) if shape else 1


def triangle_mask(n: int, m: int, k: int, lower: bool):
    """(n, m) u8 mask of the lower (col - row <= k) or upper (col - row >= k) triangle: an iota
    comparison that fuses into its consumer."""
    from .tensor import arange
    rows = arange(n).reshape((n, 1))
    cols = arange(m).reshape((1, m))
    diff = cols.broadcast_sub(rows)
    return diff <= k if lower else diff >= k


class ExtrasMixin:
    __slots__ = ()

    # ---- aliases -------------------------------------------------------------------------
    @property
    def T(self):
        """All dims reversed (NumPy's .T)."""
        return self.permute(tuple(range(self.rank - 1, -1, -1))) if self.rank > 1 else self

    @property
    def mT(self):
        """The last two dims swapped (a batch of matrices transposed)."""
        if self.rank < 2:
            raise DimOutOfRange(f"mT: needs rank >= 2, got shape {self.shape} ({self.dtype.name})")
        return self.transpose(-2, -1)

    def swapaxes(self, a, b):
        return self.transpose(a, b)

    swapdims = swapaxes

    def view(self, *shape):
        """= reshape (a copy when strides cannot express the new shape)."""
        return self.reshape(*shape)

    def size(self, dim=None):
        """The shape as a tuple, or the size of one dim (negative dims count from the end)."""
        if dim is None:
            return self.shape
        return self.shape[norm_dim(dim, self.shape, "size", dtype=self.dtype)]

    def numel(self):
        """The element count (an lc.Size when it depends on named dims)."""
        return math.prod(self.shape)

    def astype(self, dtype):
        return self.to_dtype(dtype)

    def clip(self, lo=None, hi=None, *, min=None, max=None):
        """clamp with either bound optional (torch's min= / max= too); tensor bounds broadcast."""
        lo = _pick(lo, min, None, "clip")
        hi = _pick(hi, max, None, "clip")
        if lo is None and hi is None:
            raise ValueError("clip: give at least one of lo (min) and hi (max)")
        if any(b is not None and as_scalar(b) is None for b in (lo, hi)):     # tensor bounds
            out = self if lo is None else self.broadcast_maximum(lo)
            return out if hi is None else out.broadcast_minimum(hi)
        low, high = _dtype_range(self.dtype)
        return self.clamp(low if lo is None else lo, high if hi is None else hi)

    def softmax(self, dim=-1):
        from . import nn
        return nn.softmax(self, dim)

    def log_softmax(self, dim=-1):
        from . import nn
        return nn.log_softmax(self, dim)

    def masked_fill(self, mask, value):
        """`value` where `mask` (broadcast to self's shape; u8/u32/i64, nonzero = set) is set."""
        mask = _as_mask(mask, "masked_fill")
        try:
            mask = mask.broadcast_as(self.shape)
        except BroadcastIncompatibleShapes:
            raise BroadcastIncompatibleShapes(f"masked_fill: mask shape {mask.shape} does not broadcast to "
                                              f"the tensor's shape {self.shape} (mask {mask.dtype.name}, "
                                              f"tensor {self.dtype.name})") from None
        s = as_scalar(value)
        fill = self._scalar_like(s) if s is not None else value.broadcast_as(self.shape)
        return mask.where_cond(fill, self)

    # ---- indexing by a tensor --------------------------------------------------------------
    def _index_by(self, idx):
        """t[ids] (a list, or a u32 / i64 tensor or array: index_select on dim 0, negative ids
        count from the end) or t[mask] (a u8 tensor, a bool array or a list of bools)."""
        from .tensor import Tensor, tensor
        if isinstance(idx, list) and idx and all(isinstance(v, (bool, np.bool_)) for v in idx) \
                or isinstance(idx, np.ndarray) and idx.dtype == np.bool_:
            return self._masked_select(tensor(np.asarray(idx, np.bool_)))
        if not isinstance(idx, Tensor):
            idx = tensor(np.asarray(idx, np.int64) if isinstance(idx, list) and not idx else idx)
        if idx.dtype is D.u8:
            return self._masked_select(idx)
        if idx.dtype not in (D.u32, D.i64):
            raise UnsupportedDTypeForOp(f"index: a tensor index must be u8 (a mask) or u32 / i64 (ids), got "
                                        f"{idx.dtype.name} (shape {idx.shape}) for tensor shape {self.shape}")
        if self.rank == 0:
            raise IndexOutOfBounds(f"index: a rank-0 tensor cannot be indexed by ids (ids shape {idx.shape})")
        if idx.dtype is D.i64:      # negative ids count from the end, like NumPy
            n = self.shape[0]
            idx = (idx < 0).where_cond(idx + n, idx)
        flat = idx.flatten_all() if idx.rank != 1 else idx
        return self.index_select(flat, 0).reshape(idx.shape + self.shape[1:])

    def _masked_select(self, mask):
        """The elements (or sub-arrays) where `mask`, which covers the leading dims, is set, in
        row-major order.  The mask is realized to count them; its ids come from a kernel."""
        from .ir.node import Node
        T = type(self)
        lead = self.shape[:mask.rank]
        if mask.shape != lead:
            raise IndexOutOfBounds(f"index: boolean mask shape {mask.shape} does not match the leading dims "
                                   f"of tensor shape {self.shape}")
        flat = mask.flatten_all().materializable().realize()
        count = int((flat != 0).to_dtype(D.i64).sum().item())
        ids = T(Node("nonzero", (flat._node,), None, (count,), D.i64, label="nonzero"))
        rows = self.reshape((math.prod(lead),) + self.shape[mask.rank:])
        return rows.index_select(ids, 0)

    # ---- layout --------------------------------------------------------------------------
    def flip(self, dims):
        """Reverse the order along `dims` (an int or a sequence): a view with negative strides."""
        dims = [dims] if not isinstance(dims, (tuple, list)) else list(dims)
        lay = self._node.layout
        seen = set()
        for d in dims:
            d = norm_dim(d, self.shape, "flip", dtype=self.dtype)
            if d in seen:
                raise DimOutOfRange(f"flip: dim {d} given twice ({shape_desc(self.shape, self.dtype)})")
            seen.add(d)
            lay = lay.flip(d)
        return self._view(lay, f"flip{tuple(sorted(seen))}")

    def tril(self, k=0):
        """Zero above the k-th diagonal of the last two dims."""
        return self._triangle(k, True, "tril")

    def triu(self, k=0):
        return self._triangle(k, False, "triu")

    def _triangle(self, k, lower, op):
        if self.rank < 2:
            raise DimOutOfRange(f"{op}: needs rank >= 2, got shape {self.shape} ({self.dtype.name})")
        k = as_index(k, op, "diagonal k")
        mask = triangle_mask(self.shape[-2], self.shape[-1], k, lower).broadcast_as(self.shape)
        return mask.where_cond(self, self._scalar_like(0))

    # ---- statistics ----------------------------------------------------------------------
    @names_op("var")
    def var(self, dim=None, keepdim=False, unbiased=True, *, axis=None, correction=None):
        """Variance over `dim` (None: everything); n - 1 in the denominator when unbiased
        (torch: the sum of squares over max(0, n - correction))."""
        _float_only("var", self)
        dims = _pick(dim, axis, None, "var")
        ddof = (1 if unbiased else 0) if correction is None else as_index(correction, "var", "correction")
        n = _reduced_count(self.shape, dims, dtype=self.dtype)
        xc = self.broadcast_sub(self.mean(dims, keepdim=True))
        ss = xc.sqr().sum(dims, keepdim=keepdim)
        if n.__class__ is Size:     # a size of named dims: a runtime scalar, bound at run
            return ss / size_max(n - ddof, 0)
        return ss / float(max(n - ddof, 0))     # (0: inf or NaN, as torch and NumPy)

    @names_op("std")
    def std(self, dim=None, keepdim=False, unbiased=True, *, axis=None, correction=None):
        return self.var(dim, keepdim, unbiased, axis=axis, correction=correction).sqrt()

    @names_op("logsumexp")
    def logsumexp(self, dim=None, keepdim=False, *, axis=None):
        """log(sum(exp(x))) over `dim`, shifted by the max; a row of -inf gives -inf, a +inf
        gives inf, NaN propagates (torch)."""
        _float_only("logsumexp", self)
        dims = _pick(dim, axis, None, "logsumexp")
        if self.elem_count.__class__ is int and self.elem_count == 0:   # no max to shift by: log(0) = -inf
            return self.sum(dims, keepdim=keepdim).log()
        m = self._max_over(dims)
        shift = (m.abs() == math.inf).where_cond(m._scalar_like(0), m)
        s = self.broadcast_sub(shift).exp().sum(dims, keepdim=True).log() + shift
        return s if keepdim else _drop(s, dims, self)

    def _max_over(self, dims):
        """max with keepdim over any set of dims (max itself takes one dim)."""
        return self._reduce("max", dims, True)

    @names_op("norm")
    def norm(self, dim=None, keepdim=False, *, axis=None):
        """Frobenius / L2 norm: sqrt(sum(x^2)) over `dim` (None: everything)."""
        _float_only("norm", self)
        return self.sqr().sum(_pick(dim, axis, None, "norm"), keepdim=keepdim).sqrt()

    @names_op("all")
    def all(self, dim=None, keepdim=False, *, axis=None):
        """u8: 1 where every element along `dim` (None: all) is nonzero (true for none)."""
        return self._count(self == 0, _pick(dim, axis, None, "all"), keepdim) == 0

    @names_op("any")
    def any(self, dim=None, keepdim=False, *, axis=None):
        return self._count(self != 0, _pick(dim, axis, None, "any"), keepdim) != 0

    def _count(self, flags, dims, keepdim):
        if self.dtype.storage_only:
            raise UnsupportedDTypeForOp(f"all / any: dtype {self.dtype.name} is storage-only")
        return flags.to_dtype(D.i64).sum(dims, keepdim=keepdim)


def _drop(t, dims, like):
    """Drop the size-1 `dims` of a keepdim result (None: every dim)."""
    if dims is None:
        return t.reshape(())
    dims = [dims] if not isinstance(dims, (tuple, list)) else dims
    keep = {norm_dim(d, like.shape, "reduce") for d in dims} if like.shape else set()
    return t.reshape(tuple(s for i, s in enumerate(t.shape) if i not in keep))


def _dtype_range(dt):
    """The lowest and highest value of `dt` (the open bound of a one-sided clip)."""
    if dt.is_float:
        return -math.inf, math.inf
    if dt.is_signed:
        return -(1 << (dt.bits - 1)), (1 << (dt.bits - 1)) - 1
    return 0, (1 << dt.bits) - 1
