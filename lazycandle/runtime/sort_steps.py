"""Steps of the model ops argsort, sort_take and cumsum (registered by op name; the executor
builds one per plan).  Their kernels take sizes at run time, so the steps bind layouts: `run_node`
makes (once per operand shapes and strides) the kernel spec and its sizes array, folds the
run-time offset into the input pointer and runs rows / lines over the native pool.  argsort gives
every chunk of rows its own workspace (one row of composites): `_run_rows`.

sort_last_dim is two nodes (ids, then the values read at the ids), but one kernel: when the plan
has a sort_take of the same input reading this argsort's ids, the argsort kernel also writes the
values, into a buffer it leaves in the run's buffer table under `_values_key(ids node)`; the
sort_take step then adopts that buffer as its output instead of running its own kernel (which
it still does when the ids come from elsewhere, e.g. realized earlier)."""
from __future__ import annotations

import ctypes
from math import prod

import numpy as np

from ..codegen import pool_ir, scan as SC, sort as SO, task_ir
from ..dtype import DType
from ..layout import contiguous_strides, merge_dims
from . import native_pool
from .buffers import address, alloc
from .steps import KeptByLayouts, NodeStep, register


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


def _launch(spec, sizes, runs):
    """(spec, compiled function or None, sizes array, rows) of a row kernel."""
    fn = SO.get_kernel(spec)[1] if runs else None
    return spec, fn, np.array(sizes, np.int64), spec.extent(sizes)


def _rows(fn, ptrs, sizes, nrows: int, row_cost: float) -> None:
    """Kernel fn (pointers `ptrs`) over rows [0, nrows) on the native pool."""
    arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
    native_pool.launch(fn, native_pool.fn_address(fn), ctypes.addressof(arr), address(sizes), None, 0, nrows,
                       row_cost)


WIDE_SPLIT_BYTES = 1 << 18      # workspaces up to this size: one per chunk of the pool's finer split


def _run_rows(fn, ptrs, slot: int, ws_bytes: int, sizes, nrows: int, row_cost: float) -> None:
    """Kernel fn over rows [0, nrows), each call (a chunk of rows) with its own 64-byte aligned
    workspace of ws_bytes in pointer slot `slot`: codegen/task_ir.py's lc_task_scratch takes the
    next of `parts` workspaces per chunk, and the section is cut into at most `parts` chunks."""
    t = native_pool.split_threads(nrows, row_cost)
    parts = t * (pool_ir.CHUNKS_PER_THREAD if ws_bytes <= WIDE_SPLIT_BYTES else 1) if t > 1 else 1
    parts = min(parts, nrows)
    stride = (ws_bytes + 63) // 64 * 64
    ws = np.empty(parts * stride + 64, np.uint8)
    ptrs = list(ptrs)
    ptrs[slot] = 0
    assert len(ptrs) <= task_ir.MAX_INNER_BUFS
    inner = (ctypes.c_void_p * len(ptrs))(*ptrs)
    counter = np.zeros(1, np.int64)
    wrap = (ctypes.c_void_p * 6)(native_pool.fn_address(fn), ctypes.addressof(inner), address(sizes), 0,
                                 (address(ws) + 63) & ~63, address(counter))
    wsizes = np.array([len(ptrs), slot, stride], np.int64)
    scratch, scratch_addr = native_pool.tasks()["lc_task_scratch"]
    if t == 1:
        scratch(ctypes.addressof(wrap), address(wsizes), None, 0, nrows)
    else:
        native_pool.parallel(scratch_addr, ctypes.addressof(wrap), address(wsizes), 0, 0, nrows, 1, t, parts)


@register("argsort")
class ArgsortStep(NodeStep):
    binds_layouts = True

    def setup(self, cap):
        lay, dt = self.operands[0][3], self.operands[0][4]
        descending, id_name = self.arg
        mine = cap.operands[self.out][0]
        self.values = any(node.op.name == "sort_take" and ops[1].kind == "node" and ops[1].index == self.out
                          and _same_read(ops[0], mine) for node, ops in zip(cap.nodes, cap.operands))

        def make(lay):
            outer, ostr = _split_rows(lay.shape, lay.strides)
            spec, sizes = SO.sort_kernel(dt, outer, ostr, lay.shape[-1], lay.strides[-1], descending,
                                         DType.from_name(id_name), self.values)
            return _launch(spec, sizes, prod(lay.shape) > 0)

        self.kernels = KeptByLayouts(lambda lays: make(lays[0]))
        s, fn, _, _ = self.kernels((lay,))
        self.spec = s
        if fn is not None:
            self.module = fn._module
        self.detail = (f"argsort {'descending' if descending else 'ascending'} of rows of {lay.shape[-1]} "
                       f"{dt.name}: {s.comp_bits}-bit (key, index) composites, bitonic network over "
                       f"{s.padded} with vectors of {s.width}; {id_name} ids"
                       + ("; also writes the sorted values for sort_take" if self.values else ""))

    def run_node(self, in_bufs, offsets, bufs, layouts=None):
        x, lx = self.operand(0, in_bufs, offsets, bufs, layouts)
        spec, fn, sizes, nrows = self.kernels((lx,))
        if fn is None:
            return
        out_addr = address(bufs[self.out])
        in_addr = address(x) + lx.offset * x.itemsize
        extra = []
        if self.values:
            vals = alloc(prod(lx.shape), self.operands[0][4])
            bufs[_values_key(self.out)] = vals
            extra = [address(vals)]
        _run_rows(fn, [out_addr, in_addr, 0] + extra, 2, spec.workspace_bytes, sizes, nrows, spec.row_cost)


@register("sort_take")
class SortTakeStep(NodeStep):
    binds_layouts = True

    def setup(self, cap):
        lay, dt = self.operands[0][3], self.operands[0][4]
        ids_lay = self.operands[1][3]
        if ids_lay.strides != contiguous_strides(ids_lay.shape):
            raise TypeError("sort_take: ids must be argsort's own contiguous output")

        def make(lay):
            outer, ostr = _split_rows(lay.shape, lay.strides)
            spec, sizes = SO.take_kernel(dt.size_in_bytes, outer, ostr, lay.shape[-1], lay.strides[-1])
            return _launch(spec, sizes, prod(lay.shape) > 0)

        self.kernels = KeptByLayouts(lambda lays: make(lays[0]))
        self.spec, fn, _, _ = self.kernels((lay,))
        if fn is not None:
            self.module = fn._module
        self.detail = (f"sorted values: rows of {lay.shape[-1]} read at their argsort ids "
                       f"(or adopted from the argsort kernel when it ran in this plan)")

    def run_node(self, in_bufs, offsets, bufs, layouts=None):
        kind, ids_index = self.operands[1][0], self.operands[1][1]
        written = bufs.pop(_values_key(ids_index), None) if kind == "node" else None
        if written is not None:
            bufs[self.out] = written
            return
        x, lx = self.operand(0, in_bufs, offsets, bufs, layouts)
        ids, li = self.operand(1, in_bufs, offsets, bufs, layouts)
        _, fn, sizes, nrows = self.kernels((lx,))
        if fn is None:
            return
        _rows(fn, [address(bufs[self.out]), address(x) + lx.offset * x.itemsize,
                   address(ids) + li.offset * ids.itemsize], sizes, nrows, float(lx.shape[-1]))


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
        _rows(fn, [address(bufs[self.out]), address(x) + lx.offset * x.itemsize], sizes, lines, n)
