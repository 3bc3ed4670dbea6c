"""Kernel specs: the KernelSpec protocol every kernel kind follows, and the specs of the fused
kernels the scheduler emits (frozen, size-free values that are the kernel cache key;
codegen/elementwise.py and codegen/reduce.py build their LLVM modules).

A spec holds the shape CLASS of a kernel, not its shape: the merged rank, each input's stride
class per dim (0 broadcast, 1 unit, or RUNTIME: a stride passed at run time) and the tiling
choice.  The sizes of the merged dims and the runtime strides are the kernel's `sizes`
argument (`runtime_sizes`), so a new length of the same computation reuses the kernel."""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from ..layout import contiguous_strides, merge_dims

RUNTIME = "n"       # stride class of a stride passed at run time


def stride_class(s: int):
    return s if s in (0, 1) else RUNTIME


def runtime_sizes(shape, strides) -> tuple:
    """The `sizes` array of a kernel over merged `shape` whose inputs walk `strides`: the dim
    sizes, then every stride that is neither 0 nor 1 (input by input, dim by dim)."""
    return tuple(shape) + tuple(x for st in strides for x in st if x not in (0, 1))


def ew_loop(shape, in_strides):
    """(merged iteration shape, each input's strides over it) of an elementwise kernel over
    `shape` that reads its inputs by `in_strides` and writes contiguous outputs."""
    mshape, mstrides = merge_dims(shape, list(in_strides) + [contiguous_strides(shape)])
    return (mshape, mstrides[:-1]) if prod(shape) else ((0,), [(0,)] * len(in_strides))


def ew_classes(dtypes, mstrides) -> tuple:
    """An EwSpec's `inputs`: (dtype name, stride classes) per input."""
    return tuple((dt, tuple(stride_class(x) for x in st)) for dt, st in zip(dtypes, mstrides))


def rebound_ew(spec, shape, in_strides):
    """(spec, runtime sizes) of elementwise kernel `spec` over another `shape` and input strides:
    the instructions stay, the merged rank and stride classes may change with the sizes."""
    mshape, mstrides = ew_loop(shape, in_strides)
    inputs = ew_classes([dt for dt, _ in spec.inputs], mstrides)
    spec = replace(spec, rank=len(mshape), inputs=inputs, tile=tile_dim([c for _, c in inputs]))
    return spec, runtime_sizes(mshape, mstrides)


TILE_SUPER = 8      # a tiled elementwise kernel's unit spans TILE_SUPER x TILE_SUPER tiles of W x W


class KernelSpec:
    """What every kernel kind's spec is (a frozen dataclass subclassing this; no fields here):

      key              the value the one kernel cache (codegen/jit.py) keys the kernel by;
      build()          the kernel's LLVM module text;
      compiled()       the compiled function, from the kernel cache;
      lanes()          the vector width W it runs at on this host;
      extent(sizes)    the iteration extent split over the pool (0: nothing to run), for the
                       run-time `sizes` of the kernel (a spec of a kernel that bakes its sizes
                       ignores them);
      cost(sizes)      the work of the whole call, in element-ops (the pool's split heuristic);
      describe()       one line for the dump tool.

    build / compiled / lanes are the code generator's: ir never imports codegen, so each
    codegen module registers its functions for its spec class (codegen/registry.py), looked
    up here by type(spec)."""

    codegen: dict = {}          # spec class -> codegen.registry.Codegen (filled by codegen)

    @property
    def key(self):
        return self

    def _codegen(self):
        impl = KernelSpec.codegen.get(type(self))
        if impl is None:
            raise LookupError(f"no code generator registered for {type(self).__name__} "
                              f"(its codegen module registers it on import)")
        return impl

    def build(self) -> str:
        return self._codegen().build(self)

    def compiled(self):
        return self._codegen().compiled(self)

    def lanes(self) -> int:
        return self._codegen().lanes(self)

    def extent(self, sizes) -> int:
        return 1

    def cost(self, sizes) -> float:
        return 1.0

    def extent_source(self, sizes) -> str | None:
        """`extent` as a Python expression of the size tokens `sizes` (source strings), for
        generated binders (runtime/native_direct.py); None: they call `extent`."""
        return None

    def cost_source(self, sizes) -> str | None:
        """`cost` as a Python expression of the size tokens `sizes`, or None (as extent_source)."""
        return None

    def describe(self) -> str:
        return type(self).__name__


def _product(tokens) -> str:
    """The product of size tokens as a Python expression ("1" for none)."""
    return "(" + " * ".join(f"({t})" for t in tokens) + ")" if tokens else "1"


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
class EwSpec(KernelSpec):
    """A fused elementwise kernel: N strided inputs, an instruction DAG, M contiguous outputs.
    Its `sizes`: the merged dims, then the runtime strides (runtime_sizes)."""
    rank: int               # merged iteration rank, >= 1
    inputs: tuple           # ((dtype_name, stride classes), ...)
    instrs: tuple           # ((op_name, arg, dtype_name, out_dtype_name, refs), ...); refs:
                            # ("i", k) input k, ("v", j) instr j, ("s", k, dtype_name) scalar k
    outputs: tuple          # ((instr_index, dtype_name), ...)  contiguous outputs
    scalars: tuple          # dtype name of each runtime scalar slot
    tile: int | None        # the dim tiled with the inner dim (tile_dim), or None

    def extent(self, sizes) -> int:
        """Units the kernel's range [lo, hi) counts: outer rows, or super-tiles when tiled."""
        shape = sizes[:self.rank]
        if not prod(shape):
            return 0
        t = self.tile
        if t is None:
            return shape[0] if len(shape) == 1 else prod(shape[:-1])
        others = prod(d for i, d in enumerate(shape[:-1]) if i != t)
        sb = TILE_SUPER * self.lanes()
        return others * -(-shape[t] // sb) * -(-shape[-1] // sb)

    def cost(self, sizes) -> float:
        return float(len(self.instrs) * prod(sizes[:self.rank]))

    def extent_source(self, sizes):
        if self.tile is not None:
            return None
        shape = _product(sizes[:self.rank])
        return shape if self.rank == 1 else f"({_product(sizes[:self.rank - 1])} if {shape} else 0)"

    def cost_source(self, sizes):
        return f"{float(len(self.instrs))!r} * {_product(sizes[:self.rank])}"

    def describe(self) -> str:
        tiled = f", tiled dims ({self.tile}, {self.rank - 1})" if self.tile is not None else ""
        return (f"elementwise rank {self.rank}, {len(self.instrs)} ops, {len(self.inputs)} in / "
                f"{len(self.outputs)} out, strides {[c for _, c in self.inputs]}{tiled}")


OUTPUT_STRIP = 2048       # inner-output reductions: at most this many outputs (of the last dim) per unit
MIN_STRIP = 32            # rows of at least 2 x this many outputs split in two or more strips
# (a narrow row unsplit is one unit: sum(0) of (16384, 256) f32 ran on one thread at any
# setting, 578 us at 2 threads; split in two strips 394-414 us, and (65536, 64) 721 -> 455;
# 1-thread times unchanged, since one call walks the strips of a row it runs as one)


def output_strips(m: int) -> int:
    """Units an inner-output row of m outputs splits into: ceil(m / OUTPUT_STRIP), at least 2
    once m >= 2 MIN_STRIP (so sum(0) of one row of outputs runs on two threads), made even when
    above 1 so two threads get equal halves (codegen/reduce.py computes the same)."""
    s = max(-(-m // OUTPUT_STRIP), 2 if m >= 2 * MIN_STRIP else 1)
    return s + (s & 1) if s > 1 else s


@dataclass(frozen=True)
class RedSpec(KernelSpec):
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


    def extent(self, sizes) -> int:
        out = [d for d, r in zip(sizes, self.red) if not r]
        if not prod(out):
            return 0
        return prod(out) if self.red[-1] else max(1, prod(out[:-1]) * output_strips(out[-1]))

    def cost(self, sizes) -> float:
        return float(len(self.instrs) * prod(sizes[:self.rank]))

    def describe(self) -> str:
        return (f"{self.kind} reduction rank {self.rank} reducing dims "
                f"{[d for d, r in enumerate(self.red) if r]}, {len(self.instrs)} ops, {len(self.inputs)} in")


@dataclass(frozen=True)
class RowSpec(KernelSpec):
    """A row kernel: reductions over the last (row) dim fused with their producers and with the
    consumers that read their results broadcast along the row, one unit per row.  `instrs` is
    one DAG in node order, like EwSpec's; an instr whose op is a reduction of ir/ops.py
    REDUCTIONS reduces its one operand (a per-element value) over the row.  Each instr has a
    level: "e" (a value per element of the row) or "r" (one value per row: a reduction's result,
    or an elementwise op on such values); an "e" instr reading an "r" value reads it broadcast.
    The stages (passes over the row) follow from the DAG: see `stages`."""
    rank: int               # merged rank; the last dim is the row, the others are walked per unit
    inputs: tuple           # ((dtype_name, stride classes), ...)  see EwSpec; a per-row input has row stride 0
    instrs: tuple           # see EwSpec; op may be a reduction kind (its result is a row value)
    levels: tuple           # per instr: "e" | "r"
    outputs: tuple          # ((instr index, dtype_name), ...): full rows for "e", one per row for "r"
    scalars: tuple          # dtype name of each runtime scalar slot

    def is_reduction(self, j) -> bool:
        from .ops import REDUCTIONS
        return self.instrs[j][0] in REDUCTIONS

    def needs(self) -> tuple:
        """Per instr: the last stage whose reductions it depends on (-1: none)."""
        need, stage = [], {}
        for j, ins in enumerate(self.instrs):
            d = max((stage[r[1]] if r[1] in stage else need[r[1]] for r in ins[4] if r[0] == "v"), default=-1)
            need.append(d)
            if self.is_reduction(j):
                stage[j] = d + 1
        return tuple(need)

    def stages(self) -> tuple:
        """The reductions of each pass over the row: a reduction runs in the pass after the
        last one it depends on; then one more pass writes the full-row outputs."""
        need = self.needs()
        out: list = []
        for j in range(len(self.instrs)):
            if self.is_reduction(j):
                while len(out) <= need[j] + 1:
                    out.append([])
                out[need[j] + 1].append(j)
        return tuple(tuple(s) for s in out)

    def extent(self, sizes) -> int:
        """One unit per row; nothing to run when any dim is empty."""
        shape = sizes[:self.rank]
        return prod(shape[:-1]) if prod(shape) else 0

    def cost(self, sizes) -> float:
        return float(len(self.instrs) * prod(sizes[:self.rank]))

    def extent_source(self, sizes):
        return f"({_product(sizes[:self.rank - 1])} if {_product(sizes[:self.rank])} else 0)"

    def cost_source(self, sizes):
        return f"{float(len(self.instrs))!r} * {_product(sizes[:self.rank])}"

    def describe(self) -> str:
        return (f"row kernel rank {self.rank}, {len(self.stages())} reducing passes, "
                f"{len(self.instrs)} ops, {len(self.inputs)} in")
