"""Step of col2im (conv_transpose's sum of columns into an image): `setup` turns the columns'
layout into a kernel spec and compiles it once; `run_node` folds the run-time offset into the
pointer and runs output rows over the thread pool."""
from __future__ import annotations

import ctypes
from math import prod

from ..codegen import conv_transpose as CT
from . import pool
from .steps import NodeStep, register


@register("col2im")
class Col2imStep(NodeStep):
    def setup(self, cap):
        lay, dt = self.operands[0][3], self.operands[0][4]
        oh, ow, kh, kw, ph, pw, sh, sw, dh, dw = self.arg
        b, c, _, _, ih, iw = lay.shape
        self.spec = CT.Col2imSpec(dt.name, b, c, kh, kw, ih, iw, oh, ow, ph, pw, sh, sw, dh, dw, tuple(lay.strides))
        self.fn = None
        if prod(self.shape) > 0:
            self.module, self.fn = CT.get_kernel(self.spec)
        self.detail = (f"col2im {lay.shape} -> {self.shape}: kernel ({kh}, {kw}), padding ({ph}, {pw}), "
                       f"stride ({sh}, {sw}), dilation ({dh}, {dw})")

    def run_node(self, in_bufs, offsets, bufs):
        if self.fn is None:
            return
        x, lx = self.operand(0, in_bufs, offsets, bufs)
        ptrs = (ctypes.c_void_p * 2)(bufs[self.out].ctypes.data, x.ctypes.data + lx.offset * x.itemsize)
        base = ctypes.addressof(ptrs)
        fn = self.fn
        pool.parallel_for(lambda a, b: fn(base, None, None, a, b), 0, self.spec.units,
                          cost_per_item=self.spec.unit_cost)
        del ptrs
