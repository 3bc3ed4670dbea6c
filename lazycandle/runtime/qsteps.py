"""Running the quantized-weight kernels (codegen/quantize.py, codegen/qmatmul.py) on the pool:
`run` launches one kernel over its units (blocks for quantize / dequantize); the qmatmul node's
step (`QMatmulStep`, op in ir/ops_model.py) quantizes the activations per block to int8 (path
"int8") and then splits the weight rows over the native pool's threads, as the skinny GEMM does.  (A path dequantizing panels of weight
rows to f32 for BLAS sgemm was measured here and never beat the int8 kernels, at m = 1 or 32.)"""
from __future__ import annotations

import ctypes
from math import prod

import numpy as np

from ..codegen import qmatmul as QM
from . import native_pool
from .buffers import address
from .steps import NodeStep, register


def run(fn, arrays, sizes, units: int, cost_per_unit: float, align: int = 1) -> None:
    """fn(bufs, sizes, NULL, lo, hi) over chunks of [0, units) (the native pool); `arrays` are
    numpy arrays (or raw addresses) in the kernel's buffer order, kept alive for the call."""
    if units <= 0:
        return
    addrs = (ctypes.c_void_p * len(arrays))(*[a if isinstance(a, int) else address(a) for a in arrays])
    sz = np.array(list(sizes) or [0], np.int64)
    _launch(fn, ctypes.cast(fn, ctypes.c_void_p).value, ctypes.addressof(addrs), sz.ctypes.data, units,
            cost_per_unit, align)


@register("qmatmul")
class QMatmulStep(NodeStep):
    def setup(self, cap):
        kind, N, K, path, isa, mt, nt, one = self.arg
        lx = self.operands[0][3]
        if lx.shape[-1] != K or (K > 1 and lx.strides[-1] != 1) or \
                any(s != K * prod(lx.shape[d + 1:-1]) for d, s in enumerate(lx.strides[:-1]) if lx.shape[d] > 1):
            raise ValueError(f"qmatmul: x must be contiguous rows of {K}, got {lx}")
        self.m, self.N, self.K = prod(lx.shape[:-1]), N, K
        mt, nt = one if self.m == 1 else (mt, nt)        # (a named row count bound here)
        self.nt = nt
        self.sizes = np.array([self.m, N, K], np.int64)      # made once: the call path is per token
        self.act_sizes = np.array([K], np.int64)
        self.int8 = path == "int8"
        self.spec, self.fn = QM.kernel(kind, path, isa, mt, nt)
        self.detail = (f"qmatmul ({self.m}, {K}) x ({kind} {N}, {K})^T: {self.spec.describe()}"
                       + ("; activations quantized per 32 to int8 first" if self.int8 else ""))
        self.module = self.fn._module
        self.fn_addr = ctypes.cast(self.fn, ctypes.c_void_p).value
        if self.int8:
            self.act = QM.act_kernel()[1]

    def run_node(self, in_bufs, offsets, bufs):
        m, N, K = self.m, self.N, self.K
        if m == 0 or N == 0:
            return
        x, lx = self.operand(0, in_bufs, offsets, bufs)
        w, lw = self.operand(1, in_bufs, offsets, bufs)
        xa, wa = address(x) + lx.offset * x.itemsize, address(w) + lw.offset
        oa = address(bufs[self.out])
        if self.int8:
            nc = K // 32
            xq, xd, xs = np.empty(m * K, np.int8), np.empty(m * nc, np.float32), np.empty(m * nc, np.float32)
            qa, da, sa = address(xq), address(xd), address(xs)
            act = (ctypes.c_void_p * 4)(qa, da, sa, xa)
            self.act(ctypes.addressof(act), self.act_sizes.ctypes.data, None, 0, m)   # ~1% of the work
            ptrs = (ctypes.c_void_p * 5)(oa, wa, qa, da, sa)
        else:
            ptrs = (ctypes.c_void_p * 3)(oa, wa, xa)
        _launch(self.fn, self.fn_addr, ctypes.addressof(ptrs), self.sizes.ctypes.data, N, float(K) * m, self.nt)


def _launch(fn, fn_addr, bufs, sizes, units, unit_cost, align):
    """Units over the native pool (the calling thread alone for small work)."""
    native_pool.launch(fn, fn_addr, bufs, sizes, None, 0, units, unit_cost, align)
