"""Reductions: sum / mean over any dims, max / min / argmax / argmin over one dim, and the
`_all` forms.  Each builds one reduce node with keepdim semantics; the non-keepdim forms are a
view that drops the reduced dims."""
from __future__ import annotations

from math import prod

from . import dtype as D
from .errors import DimOutOfRange, EmptyReduction, ShapeMismatch, UnsupportedDTypeForOp
from .ir.node import Node
from .layout import as_index
from .tensor_views import norm_dim

# argmax / argmin return u32 indices, so the dim they reduce can hold at most this many elements
MAX_ARG_DIM = 2 ** 32 - 1


def _dims(dims, shape, op):
    """The reduced dims as a sorted tuple of non-negative ints (a rank-0 tensor takes 0 or -1,
    like torch); NumPy's rules for the type of each dim."""
    try:
        dims = [dims] if isinstance(dims, str) else list(dims)
    except TypeError:           # one dim (an int, a NumPy integer, a 0-d array)
        dims = [dims]
    if not dims:
        raise ValueError(f"{op}: no dims given")
    if not shape:
        for d in dims:
            if as_index(d, op, "dim") not in (0, -1):
                raise DimOutOfRange(f"{op}: dim {d} out of range for a rank-0 tensor (only 0 and -1)")
        return (0,)
    return tuple(sorted({norm_dim(d, shape, op) for d in dims}))


class ReduceMixin:
    __slots__ = ()

    def _reduce(self, kind, dims, keepdim):
        op = f"{kind}_keepdim" if keepdim else kind
        if self.dtype.storage_only:
            raise UnsupportedDTypeForOp(f"{op}: dtype {self.dtype.name} is storage-only (no arithmetic)")
        if kind == "mean" and not self.dtype.is_float:
            raise UnsupportedDTypeForOp(f"{op}: mean needs a float dtype, got {self.dtype.name}")
        dims = _dims(dims, self.shape, op)
        x = self.unsqueeze(0) if self.rank == 0 else self
        shape = tuple(1 if i in dims else d for i, d in enumerate(x.shape))
        # max / min / arg* need an element of the reduced dims for every output element
        if kind not in ("sum", "mean") and prod(shape) and any(x.shape[d] == 0 for d in dims):
            raise EmptyReduction(f"{op}: reduction over a zero-length dim (shape {self.shape}, dims {dims})")
        if kind.startswith("arg") and x.shape[dims[0]] > MAX_ARG_DIM:
            raise ShapeMismatch(f"{op}: dim {dims[0]} of shape {self.shape} ({self.dtype.name}) is longer than "
                                f"{MAX_ARG_DIM}, the most elements its u32 indices can number")
        out_dt = D.u32 if kind.startswith("arg") else x.dtype
        t = type(self)(Node(kind, (x._node,), dims, shape, out_dt))
        if self.rank == 0:
            return t.reshape(())
        if not keepdim:
            t = t.reshape(tuple(d for i, d in enumerate(shape) if i not in dims))
        return t

    def sum_keepdim(self, dims): return self._reduce("sum", dims, True)
    def sum(self, dims): return self._reduce("sum", dims, False)
    def mean_keepdim(self, dims): return self._reduce("mean", dims, True)
    def mean(self, dims): return self._reduce("mean", dims, False)

    def _one_dim(self, kind, dim, keepdim):
        return self._reduce(kind, (as_index(dim, kind, "dim (one int)"),), keepdim)

    def max_keepdim(self, dim): return self._one_dim("max", dim, True)
    def max(self, dim): return self._one_dim("max", dim, False)
    def min_keepdim(self, dim): return self._one_dim("min", dim, True)
    def min(self, dim): return self._one_dim("min", dim, False)
    def argmax_keepdim(self, dim): return self._one_dim("argmax", dim, True)
    def argmax(self, dim): return self._one_dim("argmax", dim, False)
    def argmin_keepdim(self, dim): return self._one_dim("argmin", dim, True)
    def argmin(self, dim): return self._one_dim("argmin", dim, False)

    def _all(self, kind):
        x = self.flatten_all() if self.rank != 1 else self
        return x._reduce(kind, (0,), False)

    def sum_all(self): return self._all("sum")
    def mean_all(self): return self._all("mean")
    def max_all(self): return self._all("max")
    def min_all(self): return self._all("min")
