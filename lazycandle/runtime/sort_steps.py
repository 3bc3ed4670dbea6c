"""Steps of the model ops argsort, sort_take and cumsum (registered by op name; the executor
builds one per plan).  `setup` turns the operand's layout into a kernel spec and compiles it
once; `run_node` folds the run-time offset into the input pointer and runs rows / lines over the
thread pool.  argsort gives every chunk of rows its own workspace (one row of composites).

sort_last_dim is two nodes (ids, then the values read at the ids), but one kernel: when the plan
has a sort_take of the same input reading this argsort's ids, the argsort kernel also writes the
values, into a buffer it leaves in the run's buffer table under `_values_key(ids node)`; the
sort_take step then adopts that buffer as its output instead of running its own kernel (which
it still does when the ids come from elsewhere, e.g. realized earlier)."""
from __future__ import annotations

import ctypes
from math import prod

import numpy as np

from ..codegen import scan as SC, sort as SO
from ..dtype import DType
from ..layout import contiguous_strides, merge_dims
from . import pool
from .buffers import alloc
from .steps import NodeStep, register


def _split_rows(shape, strides):
    """Sizes and strides of the dims before the last, merged where the strides allow."""
    if len(shape) <= 1:
        return (1,), (0,)
    sizes, (st,) = merge_dims(shape[:-1], [strides[:-1]])
    return sizes, st


def _values_key(ids_node: int):
    return ("sorted values", ids_node)


def _same_read(a, b) -> bool:
    if a.kind != b.kind:
        return False
    if a.kind == "in":
        return a.index == b.index                  # one slot: one run-time address
    return (a.index, a.strides, a.offset) == (b.index, b.strides, b.offset)


@register("argsort")
class ArgsortStep(NodeStep):
    def setup(self, cap):
        lay, dt = self.operands[0][3], self.operands[0][4]
        descending, id_name = self.arg
        outer, ostr = _split_rows(lay.shape, lay.strides)
        n = lay.shape[-1]
        mine = cap.operands[self.out][0]
        self.values = any(node.op.name == "sort_take" and ops[1].kind == "node" and ops[1].index == self.out
                          and _same_read(ops[0], mine) for node, ops in zip(cap.nodes, cap.operands))
        self.spec = SO.sort_spec(dt, outer, ostr, n, lay.strides[-1], descending, DType.from_name(id_name),
                                 self.values)
        self.fn = None
        if prod(lay.shape) > 0:
            self.module, self.fn = SO.get_kernel(self.spec)
        s = self.spec
        self.detail = (f"argsort {'descending' if descending else 'ascending'} of {s.rows} rows of {n} "
                              f"{dt.name}: {s.comp_bits}-bit (key, index) composites, bitonic network over "
                              f"{s.padded} with vectors of {s.width}; {id_name} ids"
                              + ("; also writes the sorted values for sort_take" if self.values else ""))

    def run_node(self, in_bufs, offsets, bufs):
        if self.fn is None:
            return
        x, lx = self.operand(0, in_bufs, offsets, bufs)
        out_addr = bufs[self.out].ctypes.data
        in_addr = x.ctypes.data + lx.offset * x.itemsize
        fn, nbytes = self.fn, self.spec.workspace_bytes
        extra = []
        if self.values:
            vals = alloc(prod(self.shape), self.operands[0][4])
            bufs[_values_key(self.out)] = vals
            extra = [vals.ctypes.data]

        def rows(a, b):
            ws = np.empty(nbytes + 64, np.uint8)
            ptrs = [out_addr, in_addr, ws.ctypes.data + (-ws.ctypes.data) % 64] + extra
            addrs = (ctypes.c_void_p * len(ptrs))(*ptrs)
            fn(ctypes.addressof(addrs), None, None, a, b)

        pool.parallel_for(rows, 0, self.spec.rows, cost_per_item=self.spec.row_cost)


@register("sort_take")
class SortTakeStep(NodeStep):
    def setup(self, cap):
        lay, dt = self.operands[0][3], self.operands[0][4]
        ids_lay = self.operands[1][3]
        if ids_lay.strides != contiguous_strides(ids_lay.shape):
            raise TypeError("sort_take: ids must be argsort's own contiguous output")
        outer, ostr = _split_rows(lay.shape, lay.strides)
        self.spec = SO.TakeSpec(dt.size_in_bytes, lay.shape[-1], outer, ostr, lay.strides[-1])
        self.fn = None
        if prod(lay.shape) > 0:
            self.module, self.fn = SO.get_kernel(self.spec)
        self.detail = (f"sorted values: {self.spec.rows} rows of {self.spec.n} read at their argsort ids "
                              f"(or adopted from the argsort kernel when it ran in this plan)")

    def run_node(self, in_bufs, offsets, bufs):
        kind, ids_index = self.operands[1][0], self.operands[1][1]
        written = bufs.pop(_values_key(ids_index), None) if kind == "node" else None
        if written is not None:
            bufs[self.out] = written
            return
        if self.fn is None:
            return
        x, lx = self.operand(0, in_bufs, offsets, bufs)
        ids, li = self.operand(1, in_bufs, offsets, bufs)
        addrs = (ctypes.c_void_p * 3)(bufs[self.out].ctypes.data, x.ctypes.data + lx.offset * x.itemsize,
                                      ids.ctypes.data + li.offset * ids.itemsize)
        base, fn = ctypes.addressof(addrs), self.fn
        pool.parallel_for(lambda a, b: fn(base, None, None, a, b), 0, self.spec.rows, cost_per_item=float(self.spec.n))


@register("cumsum")
class CumsumStep(NodeStep):
    """Its kernel takes sizes at run time (codegen/scan.py): one plan serves every size."""
    binds_layouts = True

    def setup(self, cap):
        dt = self.operands[0][4]
        self._launch = {}
        self.module, self.spec = self._prepare(self.operands[0][3])[:2]
        self.detail = f"cumsum along dim {self.arg} of {dt.name} (sizes at run time)"

    def _prepare(self, lay):
        """(module, spec, fn, sizes array, lines, line length) at input layout `lay`."""
        key = (lay.shape, lay.strides)
        got = self._launch.get(key)
        if got is None:
            if len(self._launch) >= 16:
                self._launch.clear()
            spec, sizes = SC.scan_kernel(self.operands[0][4], lay.shape, self.arg, lay.strides,
                                         contiguous_strides(lay.shape))
            module = fn = None
            if prod(lay.shape) > 0:
                module, fn = SC.get_kernel(spec)
            got = self._launch[key] = (module, spec, fn, np.array(sizes, np.int64), spec.extent(sizes),
                                       spec.unit_cost(sizes))
        return got

    def run_node(self, in_bufs, offsets, bufs, layouts=None):
        x, lx = self.operand(0, in_bufs, offsets, bufs, layouts)
        _, _, fn, sizes, lines, n = self._prepare(lx)
        if fn is None:
            return
        addrs = (ctypes.c_void_p * 2)(bufs[self.out].ctypes.data, x.ctypes.data + lx.offset * x.itemsize)
        base, sizes_ptr = ctypes.addressof(addrs), sizes.ctypes.data
        pool.parallel_for(lambda a, b: fn(base, sizes_ptr, None, a, b), 0, lines, cost_per_item=n)
