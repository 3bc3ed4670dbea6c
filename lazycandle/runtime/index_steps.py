"""Steps of the index / data-movement ops (registered by op name; the executor builds one per
plan).  `setup` turns the operands' layouts (strides are part of the plan's structural key)
into a kernel spec and compiles it once; `run_node` folds the run-time offsets into pointers,
runs the kernel over the thread pool and, for the index ops, turns the kernel's status word
into IndexOutOfBounds."""
from __future__ import annotations

import ctypes
from math import prod

import numpy as np

from ..codegen import index as K
from ..errors import IndexOutOfBounds
from ..layout import contiguous_strides
from . import pool
from .steps import NodeStep, register


def _addr(buf, lay) -> int:
    return buf.ctypes.data + lay.offset * buf.itemsize


def _run(fn, addrs, units, cost) -> None:
    arr = (ctypes.c_void_p * len(addrs))(*addrs)
    base = ctypes.addressof(arr)
    pool.parallel_for(lambda a, b: fn(base, None, None, a, b), 0, units, cost_per_item=cost)
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


@register("index_select", "gather", "scatter", "scatter_add", "index_add")
class IndexStep(NodeStep):
    def setup(self, cap):
        node = cap.nodes[self.out]
        op, dim = node.op.name, self.arg
        self.op, self.dim = op, dim
        t_lay, ids_lay = self.operands[0][3], self.operands[1][3]
        self.id_dtype = self.operands[1][4]
        vector_ids = op in K.VECTOR_IDS

        def ids_over(shape):
            if vector_ids:
                return tuple(ids_lay.strides[0] if d == dim else 0 for d in range(len(shape)))
            return ids_lay.strides

        if op in K.GATHER_OPS:
            S = self.shape
            self.bound = t_lay.shape[dim]
            spec = K.index_spec(op, self.dtype, self.id_dtype, S, dim, self.bound, t_lay.strides, ids_over(S),
                                contiguous_strides(S))
            runs = prod(S) > 0
        else:
            src_lay = self.operands[2][3]
            S = src_lay.shape
            self.bound = self.shape[dim]
            spec = K.index_spec(op, self.dtype, self.id_dtype, S, dim, self.bound, src_lay.strides, ids_over(S),
                                contiguous_strides(self.shape), t_lay.strides)
            runs = prod(self.shape) > 0 or prod(S) > 0
        self.spec = spec
        self.reads = _Reads(self.operands)
        self.fn = None
        if runs and spec.units > 0:
            cm, self.fn = K.get_kernel(spec)
            self.module = cm
        self.detail = (f"{op} along dim {dim}: {spec.units} units (outer {spec.outer} x mid chunks of "
                              f"{spec.mchunk} of {spec.mid} x inner blocks of {spec.block} of {spec.inner}); "
                              f"ids {self.id_dtype.name} checked < {self.bound}")

    def run_node(self, in_bufs, offsets, bufs):
        if self.fn is None:
            return
        t, lt = self.operand(0, in_bufs, offsets, bufs)
        ids, li = self.operand(1, in_bufs, offsets, bufs)
        out = bufs[self.out]
        status = np.zeros(2, np.int64)
        if self.op in K.GATHER_OPS:
            addrs = [out.ctypes.data, _addr(t, lt), _addr(ids, li), status.ctypes.data]
        else:
            src, ls = self.operand(2, in_bufs, offsets, bufs)
            addrs = [out.ctypes.data, _addr(src, ls), _addr(ids, li), status.ctypes.data, _addr(t, lt)]
        _run(self.fn, addrs, self.spec.units, self.spec.unit_cost)
        if status[0]:
            shape = self.operands[0][3].shape
            raise IndexOutOfBounds(
                f"{self.op}: index {int(status[1])} out of range for dim {self.dim} of size {self.bound} "
                f"(tensor shape {shape}, ids {self.id_dtype.name} shape {self.operands[1][3].shape})")


@register("cat")
class CatStep(NodeStep):
    """One strided copy per non-empty input into its slab of the output."""

    def setup(self, cap):
        dim = self.arg
        self.reads = _Reads(self.operands)
        out_strides = contiguous_strides(self.shape)
        self.parts = []
        start = 0
        cms = []
        for k, (_, _, _, lay, dt) in enumerate(self.operands):
            if prod(lay.shape) > 0:
                spec = K.copy_spec(dt.size_in_bytes, lay.shape, lay.strides, out_strides)
                cm, fn = K.get_kernel(spec)
                cms.append(cm)
                self.parts.append((k, start * out_strides[dim], spec, fn))
            start += lay.shape[dim]
        if cms:
            self.module = _Modules(cms)
        self.detail = f"cat along dim {dim}: {len(self.parts)} strided copies"

    def run_node(self, in_bufs, offsets, bufs):
        out = bufs[self.out]
        for k, off, spec, fn in self.parts:
            buf, lay = self.operand(k, in_bufs, offsets, bufs)
            _run(fn, [out.ctypes.data + off * out.itemsize, _addr(buf, lay)], spec.units, float(spec.block))


@register("im2col")
class Im2colStep(NodeStep):
    def setup(self, cap):
        lay, dt = self.operands[0][3], self.operands[0][4]
        kh, kw, ph, pw, sh, sw, dh, dw = self.arg
        self.spec = K.Im2colSpec(dt.size_in_bytes, *lay.shape, kh, kw, ph, pw, sh, sw, dh, dw, tuple(lay.strides))
        self.reads = _Reads(self.operands)
        self.fn = None
        if prod(self.shape) > 0:
            cm, self.fn = K.get_kernel(self.spec)
            self.module = cm
        self.detail = (f"im2col {lay.shape} -> {self.shape}: kernel ({kh}, {kw}), padding ({ph}, {pw}), "
                              f"stride ({sh}, {sw}), dilation ({dh}, {dw})")

    def run_node(self, in_bufs, offsets, bufs):
        if self.fn is None:
            return
        x, lx = self.operand(0, in_bufs, offsets, bufs)
        s = self.spec
        _run(self.fn, [bufs[self.out].ctypes.data, _addr(x, lx)], s.units, float(s.oh * s.ow))


@register("nonzero")
class NonzeroStep(NodeStep):
    """Ids of the nonzero elements of a 1-D mask; the node's length (counted by the Tensor API
    from the realized mask) caps how many the kernel writes."""

    def setup(self, cap):
        lay, dt = self.operands[0][3], self.operands[0][4]
        self.spec = K.NonzeroSpec(dt.size_in_bytes, lay.strides[0])
        self.reads = _Reads(self.operands)
        self.module, self.fn = K.get_kernel(self.spec)
        self.detail = f"nonzero ids of a {dt.name} mask of {lay.shape[0]} elements"

    def run_node(self, in_bufs, offsets, bufs):
        m, lm = self.operand(0, in_bufs, offsets, bufs)
        params = np.array([lm.shape[0], self.shape[0]], np.int64)
        ptrs = (ctypes.c_void_p * 3)(bufs[self.out].ctypes.data, _addr(m, lm), params.ctypes.data)
        self.fn(ctypes.addressof(ptrs), None, None, 0, 1)
