"""The run-time `sizes` argument of the node-step kernels (index, copy, scan, im2col, nonzero,
sort): their specs key on stride CLASSES (0, 1 or RUNTIME, ir/kernels.stride_class) and merged
ranks; every size, and every stride that is not 0 or 1, is an i64 the kernel reads from its
`i64* sizes` argument, in the order the spec's `*_kernel` function (which also makes the spec)
wrote them.  So one compiled kernel serves every size of its shape class."""
from __future__ import annotations

import llvmlite.ir as ir

from ..ir.kernels import RUNTIME, stride_class
from .llvmutil import I64


def classes(strides) -> tuple:
    """The stride class of each stride (what a spec keys on)."""
    return tuple(stride_class(s) for s in strides)


def runtime_values(strides) -> tuple:
    """The strides a kernel reads at run time (those of class RUNTIME), in order."""
    return tuple(s for s in strides if s not in (0, 1))


class SizesReader:
    """Loads the kernel's `sizes` argument in order: `next()` a size, `strides(classes)` one
    operand's strides (constants for classes 0 / 1, loaded for RUNTIME)."""

    def __init__(self, b: ir.IRBuilder, fn: ir.Function):
        self.b, self.ptr, self.at = b, fn.args[1], 0

    def next(self, name: str = "size"):
        v = self.b.load(self.b.gep(self.ptr, [I64(self.at)], inbounds=True), name=name, align=8)
        self.at += 1
        return v

    def many(self, count: int, name: str = "size") -> list:
        return [self.next(name) for _ in range(count)]

    def strides(self, stride_classes) -> list:
        return [self.next("stride") if c == RUNTIME else I64(c) for c in stride_classes]


def _is_const(v, value) -> bool:
    return isinstance(v, ir.Constant) and v.constant == value


def unravel(b, r, sizes) -> list:
    """Indices (last fastest) of flat index r over `sizes` (i64 values or ints)."""
    idx = [None] * len(sizes)
    for d in range(len(sizes) - 1, 0, -1):
        n = I64(sizes[d]) if isinstance(sizes[d], int) else sizes[d]
        idx[d] = b.urem(r, n)
        r = b.udiv(r, n)
    idx[0] = r
    return idx


def dot(b, idx, strides):
    """sum(idx[d] * strides[d]) with constant 0 / 1 strides folded."""
    acc = I64(0)
    for i, s in zip(idx, strides):
        if isinstance(s, int):
            s = I64(s)
        if _is_const(s, 0):
            continue
        acc = b.add(acc, i if _is_const(s, 1) else b.mul(i, s))
    return acc


def scaled(b, i, s):
    """i * s with a constant 0 / 1 stride folded."""
    if _is_const(s, 0):
        return I64(0)
    return i if _is_const(s, 1) else b.mul(i, s)


class OuterRows:
    """Extent and cost of a kernel over rows: one unit per row of the `rank` outer dims (the
    first `rank` sizes), each costing the row length (the next size)."""

    def extent(self, sizes) -> int:
        n = 1
        for d in sizes[:self.rank]:
            n *= d
        return n

    def unit_cost(self, sizes) -> float:
        return float(sizes[self.rank])

    def cost(self, sizes) -> float:
        return self.extent(sizes) * self.unit_cost(sizes)
