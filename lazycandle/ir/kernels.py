"""Specs of the fused kernels the scheduler emits: frozen, size-free values that are the kernel
cache key (codegen/elementwise.py and codegen/reduce.py build their LLVM modules).

A spec holds the shape CLASS of a kernel, not its shape: the merged rank, each input's stride
class per dim (0 broadcast, 1 unit, or RUNTIME: a stride passed at run time) and the tiling
choice.  The sizes of the merged dims and the runtime strides are the kernel's `sizes`
argument (`runtime_sizes`), so a new length of the same computation reuses the kernel."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

RUNTIME = "n"       # stride class of a stride passed at run time


def stride_class(s: int):
    return s if s in (0, 1) else RUNTIME


def runtime_sizes(shape, strides) -> tuple:
    """The `sizes` array of a kernel over merged `shape` whose inputs walk `strides`: the dim
    sizes, then every stride that is neither 0 nor 1 (input by input, dim by dim)."""
    return tuple(shape) + tuple(x for st in strides for x in st if x not in (0, 1))


def tile_dim(stride_classes):
    """The dim to tile with the output's inner dim when an input is transposed relative to the
    output (unit stride along that dim, a runtime stride along the inner dim); else None.
    Decided on stride classes alone, so one kernel serves every size (the tiled loops handle
    any edge, a dim shorter than W included)."""
    rank = len(stride_classes[0]) if stride_classes else 0
    for cls in stride_classes:
        if rank >= 2 and cls[-1] == RUNTIME:
            for d in range(rank - 1):
                if cls[d] == 1:
                    return d
    return None


@dataclass(frozen=True)
class EwSpec:
    """A fused elementwise kernel: N strided inputs, an instruction DAG, M contiguous outputs."""
    rank: int               # merged iteration rank, >= 1
    inputs: tuple           # ((dtype_name, stride classes), ...)
    instrs: tuple           # ((op_name, arg, dtype_name, out_dtype_name, refs), ...); refs:
                            # ("i", k) input k, ("v", j) instr j, ("s", k, dtype_name) scalar k
    outputs: tuple          # ((instr_index, dtype_name), ...)  contiguous outputs
    scalars: tuple          # dtype name of each runtime scalar slot
    tile: int | None        # the dim tiled with the inner dim (tile_dim), or None


OUTPUT_STRIP = 2048       # inner-output reductions: at most this many outputs (of the last dim) per unit
MIN_STRIP = 256           # rows of at least 2 x this many outputs split in two or more strips


def output_strips(m: int) -> int:
    """Units an inner-output row of m outputs splits into: ceil(m / OUTPUT_STRIP), at least 2
    once m >= 2 MIN_STRIP (so sum(0) of one row of outputs runs on two threads), made even when
    above 1 so two threads get equal halves (codegen/reduce.py computes the same)."""
    s = max(-(-m // OUTPUT_STRIP), 2 if m >= 2 * MIN_STRIP else 1)
    return s + (s & 1) if s > 1 else s


@dataclass(frozen=True)
class RedSpec:
    """A reduction with its fused elementwise producers (the reduced value is the last instr)."""
    red: tuple              # per merged dim: True when reduced (its length is the rank)
    inputs: tuple           # ((dtype_name, stride classes), ...)  see EwSpec
    instrs: tuple           # see EwSpec
    kind: str               # a reduction of ir/ops.py REDUCTIONS
    outputs: tuple          # ((instr index, out dtype name),)  -- one output
    scalars: tuple          # dtype name of each runtime scalar slot

    @property
    def rank(self) -> int:
        return len(self.red)

    @property
    def inner_reduce(self) -> bool:
        return self.red[-1]

    def out_shape(self, shape):
        return tuple(d for d, r in zip(shape, self.red) if not r)

    def parallel_extent(self, shape) -> int:
        """Units of work: one per output element (inner-reduce); one per strip of the last
        dim's outputs (inner-output, see output_strips), so sum(0) splits over threads."""
        out = self.out_shape(shape)
        if self.inner_reduce:
            return max(1, prod(out))
        return max(1, prod(out[:-1]) * output_strips(out[-1]))
