"""Reductions: sum / mean over any dims, max / min / argmax / argmin over one dim, and the
`_all` forms.  Each builds one reduce node with keepdim semantics; the non-keepdim forms are a
view that drops the reduced dims."""
from __future__ import annotations

from . import dtype as D
from .errors import EmptyReduction, UnsupportedDTypeForOp
from .ir.node import Node
from .tensor_views import norm_dim


def _dims(dims, rank, op):
    if isinstance(dims, int) or not hasattr(dims, "__iter__"):
        dims = (dims,)
    out = sorted({norm_dim(d, rank, op) for d in dims})
    if not out:
        raise ValueError(f"{op}: no dims given")
    return tuple(out)


class ReduceMixin:
    __slots__ = ()

    def _reduce(self, kind, dims, keepdim):
        op = f"{kind}_keepdim" if keepdim else kind
        if self.dtype.storage_only:
            raise UnsupportedDTypeForOp(f"{op}: dtype {self.dtype.name} is storage-only (no arithmetic)")
        if kind == "mean" and not self.dtype.is_float:
            raise UnsupportedDTypeForOp(f"{op}: mean needs a float dtype, got {self.dtype.name}")
        x = self
        if self.rank == 0:
            x = self.unsqueeze(0)
            dims = (0,)
        dims = _dims(dims, x.rank, op)
        if kind not in ("sum", "mean") and any(x.shape[d] == 0 for d in dims):
            raise EmptyReduction(f"{op}: reduction over a zero-length dim (shape {self.shape}, dims {dims})")
        shape = tuple(1 if i in dims else d for i, d in enumerate(x.shape))
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
        if not isinstance(dim, int) and not hasattr(dim, "__index__"):
            raise TypeError(f"{kind}: takes one int dim, got {dim!r}")
        return self._reduce(kind, (int(dim),), keepdim)

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
