"""The driver side of lc.dask.run: the dask graph of stages.

Each stage is one `da.blockwise` call of a StageFn (a compiled lazycandle program per block).
Blockwise indices are class ids for the classes chunked in that stage; every other dim gets a
fresh index of its own (it is one chunk: an input dim the output lacks hands the task a list
of that one block, unwrapped without a copy).
A cut (a reduce or matmul over a chunked class) is a partial stage followed by a tree of
CombineFn levels, `split_every` partials at a time.
"""
from __future__ import annotations

import itertools
import math

import dask
import dask.array as da
import numpy as np

from .graph import BCAST
from .kernels import CombineFn, Stage, StageFn, pick

SPLIT_EVERY = 8


class Planner:
    """The dask arrays of a described program: its cuts in record order, then its outputs."""

    def __init__(self, desc, dims, chunks, arrays):
        self.desc, self.dims, self.chunks, self.arrays = desc, dims, chunks, arrays
        self.token = dask.base.tokenize(desc.key(), sorted((k, v.name) for k, v in arrays.items()))
        self.values = {}           # cut rec -> dask array of its (keepdim) value
        self._fresh = itertools.count(len(dims.full))

    def outputs(self):
        for r, rec in enumerate(self.desc.recs):
            if rec.kind == "op" and any(c in self.chunks for c in self.dims.reduced.get(r, ())):
                self.values[r] = self._cut(r)
        return [self._output(i) for i in range(len(self.desc.outputs))]

    # ---- stages --------------------------------------------------------------------------
    def _inputs(self, roots, frozen):
        """Feed / cut records a stage computing `roots` reads, in record order."""
        seen, stack, found = set(), list(roots), set()
        while stack:
            r = stack.pop()
            if r in seen:
                continue
            seen.add(r)
            rec = self.desc.recs[r]
            if r in frozen or rec.kind in ("ph", "buf"):
                found.add(r)
            elif rec.kind == "op":
                stack.extend(s.rec for s in rec.srcs)
        return sorted(found)

    def _blockwise(self, stage, roots, out_classes, out_dtype, adjust=(), extra=()):
        """One blockwise stage; `out_classes` per output dim (None: size 1); `adjust` are output
        positions whose class is reduced to size 1 per block; `extra` = (array, class) inputs."""
        frozen = set(self.values)
        recs = self._inputs(roots, frozen)
        stage_cls = {c for r in recs for c in self.dims.rec[r] if c in self.chunks}
        args, specs = [], []
        for r in recs:
            rec = self.desc.recs[r]
            arr = self.values[r] if r in self.values else self.arrays[rec.op]
            cls = self.dims.rec[r]
            args += [arr, tuple(c if c in stage_cls else next(self._fresh) for c in cls)]
            specs.append((f"__cut{r}" if r in self.values else rec.op,
                          tuple(c if c in stage_cls else None for c in cls)))
        for arr, c in extra:
            args += [arr, (c,)]
            specs.append(("__arange", (c,)))
        out_ind, new_axes, adjust_chunks = [], {}, {}
        for pos, c in enumerate(out_classes):
            if c in stage_cls:
                out_ind.append(c)
                if pos in adjust:
                    adjust_chunks[c] = 1
            else:
                i = next(self._fresh)
                out_ind.append(i)
                new_axes[i] = 1 if c is None or pos in adjust else self.dims.full[c]
        fn = StageFn(self.token, self.desc, self.dims, stage, frozen, specs)
        dt = np.dtype(_np_dtype(out_dtype))
        return da.blockwise(fn, tuple(out_ind), *args, dtype=dt, concatenate=False, new_axes=new_axes,
                            adjust_chunks=adjust_chunks, meta=np.empty((0,) * len(out_ind), dt),
                            token=f"lazycandle-{stage.kind}{stage.index}-{self.token}")

    def _output(self, i):
        src = self.desc.outputs[i]
        m = self.dims.maps[("o", i)]
        if src.rec in self.values and m is not None and BCAST not in m:
            kept = [k for k in m if k >= 0]
            if kept == sorted(kept):       # a cut's value with size-1 dims dropped or added
                return self.values[src.rec].reshape(src.shape)
        dtype = self.desc.recs[src.rec].dtype
        return self._blockwise(Stage("out", i), [src.rec], self.dims.out[i], dtype)

    def _cut(self, r):
        """The value of a reduce / matmul over a chunked class: partials, then a combine tree."""
        rec = self.desc.recs[r]
        cls = self.dims.rec[r]
        if rec.category == "matmul":
            k = self.dims.reduced[r][0]
            part = self._blockwise(Stage("part", r), [r], (k,) + cls, rec.dtype, adjust=(0,))
            return self._tree([part], [0], [(CombineFn("sum", 0), (0,))])[0][0]
        red = self.dims.reduced[r]
        out_cls = list(cls)
        for d, c in zip(rec.arg, red):
            out_cls[d] = c
        adjust = tuple(rec.arg)
        axes = list(rec.arg)
        if rec.op in ("argmax", "argmin"):
            d, c = rec.arg[0], red[0]
            offsets = da.arange(self.dims.full[c], chunks=(self.chunks[c],), dtype=np.uint32)
            val_dt, idx_dt = np.dtype(_np_dtype(self.desc.recs[rec.srcs[0].rec].dtype)), np.dtype(np.uint32)
            pair = self._blockwise(Stage("part", r), [r], out_cls, "u32", adjust, [(offsets, c)])
            val, idx = (pair.map_blocks(pick, i, dtype=dt, meta=np.empty((0,) * pair.ndim, dt))
                        for i, dt in ((0, val_dt), (1, idx_dt)))
            fns = [(CombineFn(rec.op[3:], d), (0,)), (CombineFn("argidx", d, rec.op), (0, 1))]
            return self._tree([val, idx], axes, fns)[1]
        part = self._blockwise(Stage("part", r), [r], out_cls, rec.dtype, adjust)
        kind = "sum" if rec.op == "mean" else rec.op
        val = self._tree([part], axes, [(CombineFn(kind, ax), (0,)) for ax in axes], per_axis=True)[0]
        if rec.op == "mean":
            count = math.prod(rec.srcs[0].shape[d] for d in rec.arg)
            val = val.map_blocks(CombineFn("scale", None, 1.0 / count), dtype=val.dtype)
        return val

    def _tree(self, arrs, axes, fns, per_axis=False):
        """Combine partials along each of `axes` until one block remains; `fns` are
        (CombineFn, indices of arrs it reads), one per array (or, with per_axis, one per axis
        for a single array)."""
        for n, ax in enumerate(axes):
            level = [fns[n]] if per_axis else fns
            while arrs[0].numblocks[ax] > 1:
                nb = arrs[0].numblocks[ax]
                groups = tuple(min(SPLIT_EVERY, nb - i) for i in range(0, nb, SPLIT_EVERY))
                arrs = [a.rechunk({ax: groups}) for a in arrs]
                out_chunks = tuple((1,) * len(groups) if k == ax else ch for k, ch in enumerate(arrs[0].chunks))
                arrs = [da.map_blocks(fn, *[arrs[j] for j in use], chunks=out_chunks,
                                      dtype=arrs[use[-1]].dtype,
                                      meta=np.empty((0,) * arrs[0].ndim, arrs[use[-1]].dtype))
                        for fn, use in level]
        return arrs


def _np_dtype(name):
    from ..dtype import DType
    return DType.from_name(name).numpy
