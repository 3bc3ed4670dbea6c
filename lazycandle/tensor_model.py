"""Tensor methods of the model ops: sorting (argsort, sort, topk) and cumsum.

Kernels of their own (category INDEX, steps in runtime/sort_steps.py):
  argsort  the stable sort of each last-dim row (codegen/sort.py): NaN sorts last ascending and
           first descending; ties keep their input order (like candle and np.argsort(kind="stable"))
  cumsum   an inclusive scan along one dim (codegen/scan.py)
The rest are graphs of those and of views:
  sort_take      the sorted values: each row read at its argsort ids (no bounds checks needed)
  sort_last_dim  (sort_take(t, ids), ids)
  topk           argsort of `dim` moved last (a transposed view, read through its strides),
                 narrowed to the first k, moved back: ids i64 like torch; values by gather
Errors are raised at the call: dims out of range -> DimOutOfRange (a rank-0 tensor has no dim to
sort or scan); storage-only dtypes -> UnsupportedDTypeForOp; topk with k < 0 or k > the dim's
size -> NarrowInvalidArgs (the same check as narrow's length), a non-int k -> TypeError.
"""
from __future__ import annotations

import operator

from . import dtype as D
from .errors import NarrowInvalidArgs, UnsupportedDTypeForOp
from .ir import ops_index  # noqa: F401  (registers the op kinds)
from .ir.node import Node
from .sizes import decide_ge0
from .tensor_views import norm_dim


def _computable(op, t):
    if t.dtype.storage_only:
        raise UnsupportedDTypeForOp(f"{op}: dtype {t.dtype.name} is storage-only (no ordering or arithmetic) "
                                    f"(shape {t.shape})")


class ModelMixin:
    __slots__ = ()

    def _argsort(self, op, descending: bool, id_dtype: D.DType):
        _computable(op, self)
        norm_dim(-1, self.shape, op, dtype=self.dtype)
        src = self.materializable()
        return type(self)(Node("argsort", (src._node,), (bool(descending), id_dtype.name), self.shape, id_dtype,
                               label=f"{op}({'desc' if descending else 'asc'})"))

    def arg_sort_last_dim(self, asc=True):
        """u32 ids that sort each last-dim row (stable; NaN last when ascending, first when not)."""
        return self._argsort("arg_sort_last_dim", not asc, D.u32)

    def sort_last_dim(self, asc=True):
        """(sorted values, u32 ids) of each last-dim row; stable, NaN as in arg_sort_last_dim."""
        ids = self._argsort("sort_last_dim", not asc, D.u32)
        src = self.materializable()
        values = type(self)(Node("sort_take", (src._node, ids._node), None, self.shape, self.dtype,
                                 label="sort_take"))
        return values, ids

    def topk(self, k, dim=-1, largest=True):
        """(values, i64 ids) of the k largest (or smallest) along `dim`, sorted, like torch.topk;
        equal values come in input order and NaN counts as the largest."""
        op = "topk"
        _computable(op, self)
        dim = norm_dim(dim, self.shape, op, dtype=self.dtype)
        try:
            k = operator.index(k) if not isinstance(k, bool) else None
        except TypeError:
            k = None
        if k is None:
            raise TypeError(f"{op}: k must be an int (shape {self.shape})")
        size = self.shape[dim]
        if k < 0 or decide_ge0(size - k) is False:     # (k past a named dim's size: narrow's check, at run)
            raise NarrowInvalidArgs(f"{op}: k = {k} out of range for dim {dim} of size {size} (shape {self.shape}, "
                                    f"{self.dtype.name})")
        last = self.rank - 1
        moved = self if dim == last else self.transpose(dim, last)
        ids = moved._argsort(op, largest, D.i64).narrow(last, 0, k)
        if dim != last:
            ids = ids.transpose(dim, last)
        return self.gather(ids, dim), ids

    def cumsum(self, dim):
        """Inclusive running sum along `dim`.  Integers keep their dtype and wrap; f16 / bf16 /
        f8e4m3 accumulate in f32 and round each output once (np.cumsum(x.astype(f32)).astype(dt));
        f32 accumulates in f64 and rounds each output once."""
        op = "cumsum"
        _computable(op, self)
        dim = norm_dim(dim, self.shape, op, dtype=self.dtype)
        src = self.materializable()
        return type(self)(Node("cumsum", (src._node,), dim, self.shape, self.dtype, label=f"cumsum(dim={dim})"))
