"""Horizontal fusion: independent elementwise kernels of one structure become ONE kernel.

An optimizer step writes every parameter with its own fused kernel (p, m, v of AdamW), all
of one expression DAG over inputs of different lengths; so do many small kernels of other
graphs.  Launched one by one, each pays a launch and its own thread split, and the bias-sized
ones (256 floats) are all launch.  Kernels that are rank-1 elementwise (every input
contiguous or broadcast), of one spec (same instructions, dtypes and stride classes) and at
the same ALAP level of the kernel DAG (the longest path from them to the graph's end; two
kernels of one level never reach each other, so merging them cannot close a cycle) become
one HSpec kernel: a table of segments (each its own pointers, scalars and length) walked by
one loop, with the thread split over the total element count, so small segments share a
task and large ones are cut.  Bucketing is by a hashable key: linear in the kernel count.

Layout of a merged kernel (codegen/horizontal.py reads it): bufs = every segment's inputs
(segment-major), then every segment's outputs; scalars = every segment's scalar slots; sizes
= (segment count, length of each segment)."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

from .kernels import EwSpec, KernelSpec
from .ops import ELEMENTWISE

ENABLED = True          # tests switch it off to compare with the per-kernel schedule


@dataclass(frozen=True)
class HSpec(KernelSpec):
    """Segments of one rank-1 elementwise kernel `ew`, run as one kernel over their
    concatenated index space; sizes = (count, len_0, len_1, ...)."""
    ew: EwSpec
    rank = 1                # (what the runtime asks of a rank-1 elementwise spec: its
    tile = None             # units are elements, so chunks split on multiples of W)

    def extent(self, sizes) -> int:
        return sum(sizes[1:])

    def cost(self, sizes) -> float:
        return float(len(self.ew.instrs) * sum(sizes[1:]))

    def extent_source(self, sizes):
        return "(" + " + ".join(f"({t})" for t in sizes[1:]) + ")"

    def cost_source(self, sizes):
        return f"{float(len(self.ew.instrs))!r} * {self.extent_source(sizes)}"

    def describe(self) -> str:
        return "horizontal " + self.ew.describe()


def _shape_free(spec: EwSpec) -> EwSpec:
    """`spec` without its stride classes: a kernel of at most one element reads element 0 of
    every input whatever its classes are, so it fits any kernel of the same instructions."""
    return replace(spec, inputs=tuple((dt, None) for dt, _ in spec.inputs))


def _candidate(k) -> bool:
    s = k.spec
    return k.kind == ELEMENTWISE and type(s) is EwSpec and s.rank == 1 and k.epilogue is None and \
        all(c in (0, 1) for _, cls in s.inputs for c in cls)


def _tiny(k) -> bool:
    n = k.sizes[0]
    return n.__class__ is int and n <= 1


def fuse_horizontal(cap, kernels, kernel_cls) -> list:
    """`kernels` (in execution order) with every bucket of same-structure rank-1 elementwise
    kernels of one ALAP level merged into one; the result is in an execution order that is
    its own fixed point (a replay of its groups gives the same order)."""
    if not ENABLED or len(kernels) < 2:
        return kernels
    kernel_of = {j: i for i, k in enumerate(kernels) for j in k.nodes}
    consumers = [set() for _ in kernels]
    for i, k in enumerate(kernels):
        for j in k.nodes:
            for o in cap.operands[j]:
                if o.kind == "node" and kernel_of[o.index] != i:
                    consumers[kernel_of[o.index]].add(i)
    level = [0] * len(kernels)
    for i in reversed(range(len(kernels))):
        level[i] = min((level[c] - 1 for c in consumers[i]), default=0)
    buckets, tiny = {}, {}
    for i, k in enumerate(kernels):
        if _candidate(k):
            if _tiny(k):
                tiny.setdefault((level[i], _shape_free(k.spec)), []).append(i)
            else:
                buckets.setdefault((level[i], k.spec), []).append(i)
    for (lv, spec), members in buckets.items():
        tiny_key = (lv, _shape_free(spec))
        members.extend(tiny.pop(tiny_key, ()))
    buckets.update(tiny)
    merged = [[i] for i in range(len(kernels))]
    for members in buckets.values():
        if len(members) > 1:
            members.sort()
            for i in members:
                merged[i] = None
            merged[members[-1]] = members
    return _ordered(kernels, [m for m in merged if m is not None], consumers, kernel_cls)


def _merge(parts, kernel_cls):
    """One kernel running `parts` (kernels of one structure) as segments."""
    big = [k for k in parts if not _tiny(k)]
    spec = (big or parts)[0].spec
    cat = [x for k in parts for x in k.inputs], [x for k in parts for x in k.outputs]
    return kernel_cls(ELEMENTWISE, [j for k in parts for j in k.nodes], cat[1], cat[0], HSpec(spec),
                      scalars=[s for k in parts for s in k.scalars],
                      loop_strides=tuple(st for k in parts for st in k.loop_strides),
                      sizes=(len(parts),) + tuple(k.sizes[0] for k in parts),
                      parts=[list(k.nodes) for k in parts])


def _ordered(kernels, merged, consumers, kernel_cls) -> list:
    """The merged kernels in topological order, each at the place of its last member (a heap
    keyed by that place: the input order wherever it is still valid)."""
    new_of = {}
    for g, members in enumerate(merged):
        for i in members:
            new_of[i] = g
    succs = [set() for _ in merged]
    indeg = [0] * len(merged)
    for i, cs in enumerate(consumers):
        for c in cs:
            a, b = new_of[i], new_of[c]
            if b not in succs[a]:
                succs[a].add(b)
                indeg[b] += 1
    heap = [(merged[g][-1], g) for g in range(len(merged)) if not indeg[g]]
    heapq.heapify(heap)
    out = []
    while heap:
        _, g = heapq.heappop(heap)
        members = merged[g]
        out.append(kernels[members[0]] if len(members) == 1 else _merge([kernels[i] for i in members], kernel_cls))
        for s in succs[g]:
            indeg[s] -= 1
            if not indeg[s]:
                heapq.heappush(heap, (merged[s][-1], s))
    return out
