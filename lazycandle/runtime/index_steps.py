"""Steps of the index / data-movement ops (registered by op name; the executor builds one per
plan).  Their kernels take sizes and strides at run time (codegen/index.py), so the steps bind
layouts: `run_node` gets this binding's operand Layouts, makes (once per shapes and strides)
the kernel spec and its sizes array, folds the run-time offsets into pointers, runs the kernel
over the thread pool and, for the index ops, turns the kernel's status word into
IndexOutOfBounds.  One plan serves every size of its size class (symbolic_plan.py)."""
from __future__ import annotations

import ctypes
from math import prod

import numpy as np

from ..codegen import index as K
from ..errors import IndexOutOfBounds
from ..layout import contiguous_strides
from . import pool
from .buffers import address
from .steps import NodeStep, register


def _addr(buf, lay) -> int:
    return address(buf) + lay.offset * buf.itemsize


def _run(fn, addrs, units, cost, sizes) -> None:
    arr = (ctypes.c_void_p * len(addrs))(*addrs)
    base, sizes_ptr = ctypes.addressof(arr), address(sizes)
    pool.parallel_for(lambda a, b: fn(base, sizes_ptr, None, a, b), 0, units, cost_per_item=cost)
    del arr


class _Reads:
    """What the dump tool's schedule stage lists for a kernel's inputs: (dtype, strides) each."""

    def __init__(self, operands):
        self.inputs = tuple((dt.name, lay.strides) for _, _, _, lay, dt in operands)


class _Modules:
    """Several compiled modules shown as one by the dump tool (`llvm` / `asm` stages)."""

    def __init__(self, cms):
        self.cms = cms
        self.ir_text = "\n".join(cm.ir_text for cm in cms)

    def asm(self):
        return "\n".join(cm.asm() for cm in self.cms)


class _Launch:
    """One kernel call at one binding's sizes: the compiled function (None: nothing to run),
    its sizes array, units and cost per unit."""
    __slots__ = ("spec", "fn", "sizes", "units", "unit_cost", "module")

    def __init__(self, spec, sizes, runs=True):
        self.spec = spec
        self.sizes = np.array(sizes or (0,), np.int64)
        self.units = spec.extent(sizes) if runs else 0
        self.unit_cost = spec.unit_cost(sizes) if self.units else 0.0
        self.fn = self.module = None
        if self.units > 0:
            self.fn = spec.compiled()
            self.module = self.fn._module

    def run(self, addrs) -> None:
        if self.fn is not None:
            _run(self.fn, addrs, self.units, self.unit_cost, self.sizes)


class _SizedStep(NodeStep):
    """A node step whose kernels take their sizes at run time: `prepare(layouts)` makes (and
    keeps, per operand shapes and strides) what one binding's sizes need, so one plan serves
    every size of its size class (binds_layouts)."""
    binds_layouts = True
    PREPARED_KEPT = 16

    def setup(self, cap):
        self.reads = _Reads(self.operands)
        self._prepared = {}
        first = self.prepare(self.layouts())
        launches = self.launches(first)
        self.spec = launches[0].spec if len(launches) == 1 else None     # at the plan's own sizes
        mods = [ln.module for ln in launches if ln.module is not None]
        self.module = mods[0] if len(mods) == 1 else (_Modules(mods) if mods else None)
        self.detail = self.describe(first)

    def layouts(self, layouts=None):
        return layouts if layouts is not None else [o[3] for o in self.operands]

    def prepare(self, layouts):
        key = tuple((lay.shape, lay.strides) for lay in layouts)
        got = self._prepared.get(key)
        if got is None:
            if len(self._prepared) >= self.PREPARED_KEPT:
                self._prepared.clear()
            got = self._prepared[key] = self.make(layouts)
        return got

    def launches(self, prepared):
        return [prepared]

    def make(self, layouts):
        raise NotImplementedError

    def describe(self, prepared) -> str:
        return ""


@register("index_select", "gather", "scatter", "scatter_add", "index_add")
class IndexStep(_SizedStep):
    def setup(self, cap):
        self.op, self.dim = cap.nodes[self.out].op.name, self.arg
        self.id_dtype = self.operands[1][4]
        super().setup(cap)

    def make(self, layouts):
        """(launch, bound) of the kernel at these operand layouts."""
        op, dim = self.op, self.dim
        t_lay, ids_lay = layouts[0], layouts[1]

        def ids_over(shape):
            if op in K.VECTOR_IDS:
                return tuple(ids_lay.strides[0] if d == dim else 0 for d in range(len(shape)))
            return ids_lay.strides

        if op in K.GATHER_OPS:
            S = ids_lay.shape if op == "gather" else t_lay.shape[:dim] + ids_lay.shape + t_lay.shape[dim + 1:]
            bound = t_lay.shape[dim]
            spec, sizes = K.index_kernel(op, self.dtype, self.id_dtype, S, dim, bound, t_lay.strides, ids_over(S),
                                         contiguous_strides(S))
            runs = prod(S) > 0
        else:
            src_lay = layouts[2]
            S, bound = src_lay.shape, t_lay.shape[dim]
            spec, sizes = K.index_kernel(op, self.dtype, self.id_dtype, S, dim, bound, src_lay.strides, ids_over(S),
                                         contiguous_strides(t_lay.shape), t_lay.strides)
            runs = prod(t_lay.shape) > 0 or prod(S) > 0
        return _Launch(spec, sizes, runs), bound

    def launches(self, prepared):
        return [prepared[0]]

    def describe(self, prepared) -> str:
        launch, bound = prepared
        return (f"{self.op} along dim {self.dim}: {launch.units} units, sizes at run time; "
                f"ids {self.id_dtype.name} checked < {bound}")

    @property
    def kernel_operands(self) -> tuple:
        """Operand numbers of the kernel's buffers after out: data, ids, then (the scatter
        family) t; the status word is bufs[3]."""
        return (0, 1) if self.op in K.GATHER_OPS else (2, 1, 0)

    def run_node(self, in_bufs, offsets, bufs, layouts=None):
        layouts = self.layouts(layouts)
        launch, bound = self.prepare(layouts)
        if launch.fn is None:
            return
        status = np.zeros(2, np.int64)
        ops = [self.operand(n, in_bufs, offsets, bufs, layouts) for n in self.kernel_operands]
        addrs = [address(bufs[self.out]), _addr(*ops[0]), _addr(*ops[1]), address(status)]
        if len(ops) == 3:
            addrs.append(_addr(*ops[2]))
        launch.run(addrs)
        if status[0]:
            self.raise_bad_id(int(status[1]), layouts)

    def raise_bad_id(self, bad: int, layouts=None):
        layouts = self.layouts(layouts)
        raise IndexOutOfBounds(
            f"{self.op}: index {bad} out of range for dim {self.dim} of size {layouts[0].shape[self.dim]} "
            f"(tensor shape {layouts[0].shape}, ids {self.id_dtype.name} shape {layouts[1].shape})")


@register("cat")
class CatStep(_SizedStep):
    """One strided copy per non-empty input into its slab of the output."""

    def make(self, layouts):
        """[(operand, element offset in the output, launch)] of the non-empty inputs."""
        dim = self.arg
        shape = list(layouts[0].shape)
        shape[dim] = sum(lay.shape[dim] for lay in layouts)
        out_strides = contiguous_strides(tuple(shape))
        parts, start = [], 0
        for k, lay in enumerate(layouts):
            if prod(lay.shape) > 0:
                spec, sizes = K.copy_kernel(self.operands[k][4].size_in_bytes, lay.shape, lay.strides, out_strides)
                parts.append((k, start * out_strides[dim], _Launch(spec, sizes)))
            start += lay.shape[dim]
        return parts

    def launches(self, prepared):
        return [ln for _, _, ln in prepared]

    def describe(self, prepared) -> str:
        return f"cat along dim {self.arg}: {len(prepared)} strided copies, sizes at run time"

    def run_node(self, in_bufs, offsets, bufs, layouts=None):
        layouts = self.layouts(layouts)
        out = bufs[self.out]
        for k, off, launch in self.prepare(layouts):
            buf, lay = self.operand(k, in_bufs, offsets, bufs, layouts)
            launch.run([address(out) + off * out.itemsize, _addr(buf, lay)])


@register("im2col")
class Im2colStep(_SizedStep):
    def make(self, layouts):
        lay = layouts[0]
        spec, sizes = K.im2col_kernel(self.operands[0][4].size_in_bytes, lay.shape, lay.strides, self.arg)
        return _Launch(spec, sizes, prod(lay.shape) > 0 and sizes[4] > 0 and sizes[5] > 0)

    def describe(self, prepared) -> str:
        kh, kw, ph, pw, sh, sw, dh, dw = self.arg
        return (f"im2col {self.operands[0][3].shape} -> {self.shape}: kernel ({kh}, {kw}), padding ({ph}, {pw}), "
                f"stride ({sh}, {sw}), dilation ({dh}, {dw}); sizes at run time")

    def run_node(self, in_bufs, offsets, bufs, layouts=None):
        layouts = self.layouts(layouts)
        x, lx = self.operand(0, in_bufs, offsets, bufs, layouts)
        self.prepare(layouts).run([address(bufs[self.out]), _addr(x, lx)])


@register("nonzero")
class NonzeroStep(NodeStep):
    """Ids of the nonzero elements of a 1-D mask; the node's length (counted by the Tensor API
    from the realized mask, so the size of the output buffer) caps how many the kernel writes."""
    binds_layouts = True

    def setup(self, cap):
        lay, dt = self.operands[0][3], self.operands[0][4]
        self.reads = _Reads(self.operands)
        self.module, self.fn = K.get_kernel(K.nonzero_kernel(dt.size_in_bytes, lay.shape[0], lay.strides[0], 0)[0])
        self.detail = f"nonzero ids of a {dt.name} mask (sizes at run time)"

    def run_node(self, in_bufs, offsets, bufs, layouts=None):
        m, lm = self.operand(0, in_bufs, offsets, bufs, layouts)
        out = bufs[self.out]
        spec, sizes = K.nonzero_kernel(self.operands[0][4].size_in_bytes, lm.shape[0], lm.strides[0], out.shape[0])
        _, fn = K.get_kernel(spec)
        params = np.array(sizes, np.int64)
        ptrs = (ctypes.c_void_p * 2)(address(out), _addr(m, lm))
        fn(ctypes.addressof(ptrs), address(params), None, 0, 1)
