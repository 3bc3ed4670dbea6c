"""Running the quantized-weight kernels (codegen/quantize.py, codegen/qmatmul.py) on the pool:
`run` launches one kernel over its units (blocks for quantize / dequantize); the qmatmul_act
node's step quantizes the activations per block to int8 (path "int8") and the qmatmul node's
step splits the weight rows over the native pool's threads, as the skinny GEMM does: two
kernel calls in the plan's native program (ops in ir/ops_model.py).  (A path dequantizing panels of weight
rows to f32 for BLAS sgemm was measured here and never beat the int8 kernels, at m = 1 or 32.)"""
from __future__ import annotations

import ctypes
from math import prod

import numpy as np

from ..codegen import qmatmul as QM
from . import native_pool
from .buffers import address
from .steps import Launch, SizedStep, register


def run(fn, arrays, sizes, units: int, cost_per_unit: float, align: int = 1) -> None:
    """fn(bufs, sizes, NULL, lo, hi) over chunks of [0, units) (the native pool); `arrays` are
    numpy arrays (or raw addresses) in the kernel's buffer order, kept alive for the call."""
    if units <= 0:
        return
    addrs = (ctypes.c_void_p * len(arrays))(*[a if isinstance(a, int) else address(a) for a in arrays])
    sz = np.array(list(sizes) or [0], np.int64)
    _launch(fn, ctypes.cast(fn, ctypes.c_void_p).value, ctypes.addressof(addrs), sz.ctypes.data, units,
            cost_per_unit, align)


def _rows(lay, K, what):
    """Row count of a contiguous (..., K) operand layout (rows of K back to back)."""
    if lay.shape[-1] != K or (K > 1 and lay.strides[-1] != 1) or \
            any(s != K * prod(lay.shape[d + 1:-1]) for d, s in enumerate(lay.strides[:-1]) if lay.shape[d] > 1):
        raise ValueError(f"qmatmul: {what} must be contiguous rows of {K}, got {lay}")
    return prod(lay.shape[:-1])


@register("qmatmul_act")
class QActStep(SizedStep):
    """x's rows quantized per 32 values to int8 blocks (codegen/qmatmul.build_act) into the
    node's u8 buffer, which the qmatmul step after it reads: both run in the native program."""

    def setup(self, cap):
        self.kernel_buffers = [("node", self.out), ("operand", 0)]
        self.act = QM.act_kernel()
        super().setup(cap)

    def make(self, layouts):
        K = self.arg[0]
        m = _rows(layouts[0], K, "x")
        spec, fn = self.act
        return Launch(spec, (K, m), m, float(K), fn if m else None)

    def describe(self, launch) -> str:
        return f"int8 activation blocks of {launch.units} row(s) of {self.arg[0]} for qmatmul"


@register("qmatmul")
class QMatmulStep(SizedStep):
    """out = x @ W.T from the blocks: weight rows split over the pool (units), the tile
    chosen per binding (`one` when the rows bind to 1)."""

    def setup(self, cap):
        self.kernel_buffers = [("node", self.out), ("operand", 1), ("operand", 0)]
        super().setup(cap)

    def make(self, layouts):
        kind, N, K, path, isa, mt, nt, one = self.arg
        lx = layouts[0]
        m = _rows(lx, lx.shape[-1], "x") if path == "int8" else _rows(lx, K, "x")
        mt, nt = one if m == 1 else (mt, nt)
        spec, fn = QM.kernel(kind, path, isa, mt, nt)
        return Launch(spec, (m, N, K), N if m else 0, float(K) * m, fn if m and N else None)

    def describe(self, launch) -> str:
        kind, N, K, path = self.arg[:4]
        return (f"qmatmul ({launch.sizes[0]}, {K}) x ({kind} {N}, {K})^T: {launch.spec.describe()}"
                + ("; activations quantized per 32 to int8 first" if path == "int8" else ""))


def _launch(fn, fn_addr, bufs, sizes, units, unit_cost, align):
    """Units over the native pool (the calling thread alone for small work)."""
    native_pool.launch(fn, fn_addr, bufs, sizes, None, 0, units, unit_cost, align)
