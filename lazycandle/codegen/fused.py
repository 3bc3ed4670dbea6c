"""The fused kernel kinds (elementwise, reduction, row, horizontal) in the one kernel cache,
apart from their code generators: their vector widths, their compiled-kernel caches and their
registry entries.  A generator module (codegen/elementwise.py, reduce.py, row.py,
horizontal.py, with the codecs and the vector-math library behind them) is imported only when
a kernel of its kind has to be built -- on a cache miss, or for a dump of its IR -- so a new
process whose kernels are all in LAZYCANDLE_CACHE_DIR links them without importing any (that
import is about half of its first small realize: ~5 of ~10 ms)."""
from __future__ import annotations

import importlib

from .. import dtype as D
from ..ir.horizontal import HSpec
from ..ir.kernels import EwSpec, RedSpec, RowSpec
from ..ir.ops import reduction
from . import jit, registry
from .llvmutil import ltype
from .loops import KERNEL_FN


def bits(dt) -> int:
    """Bits of `dt`'s compute type."""
    return ltype(dt.compute).width if dt.compute.startswith("i") else {"float": 32, "double": 64}[dt.compute]


def ew_lanes(spec) -> int:
    """W of an elementwise kernel (and of a row kernel's output pass): the widest compute type
    it touches fills a register."""
    widest = max([bits(D.DType.from_name(dt)) for dt, _ in spec.inputs] +
                 [bits(D.DType.from_name(ins[3])) for ins in spec.instrs] +
                 [bits(D.DType.from_name(ins[2])) for ins in spec.instrs] + [8])
    return max(4, jit.vector_bits() // widest)


def red_lanes(spec: RedSpec) -> int:
    """W of a reduce kernel (float sums accumulate in f64, so they count as 64-bit)."""
    widest = max([bits(D.DType.from_name(dt)) for dt, _ in spec.inputs] +
                 [bits(D.DType.from_name(i[3])) for i in spec.instrs] + [32])
    if reduction(spec.kind).acc == "f64" and D.DType.from_name(spec.instrs[-1][3]).is_float:
        widest = 64
    return max(2, jit.vector_bits() // widest)


def _generator(module: str, name: str):
    """build(spec) -> (IR text, function name) of codegen/<module>.py, imported at the first
    call; the function's __module__ is that module's (the kernel cache's disk namespace)."""
    qualified = f"{__package__}.{module}"

    def build(spec):
        return importlib.import_module(qualified).build(spec, name), name
    build.__module__ = qualified
    return build


ew_kernels = jit.KernelCache(_generator("elementwise", "ew"), KERNEL_FN)
red_kernels = jit.KernelCache(_generator("reduce", "red"), KERNEL_FN)
row_kernels = jit.KernelCache(_generator("row", "row"), KERNEL_FN)
h_kernels = jit.KernelCache(_generator("horizontal", "hew"), KERNEL_FN)
for _cls, _cache, _lanes in ((EwSpec, ew_kernels, ew_lanes), (RedSpec, red_kernels, red_lanes),
                             (RowSpec, row_kernels, ew_lanes), (HSpec, h_kernels, lambda spec: ew_lanes(spec.ew))):
    registry.register(_cls, lambda spec, cache=_cache: cache.build(spec)[0], _cache, _lanes)
