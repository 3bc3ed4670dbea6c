"""The memory planner: which intermediate buffers of a plan share memory.

Liveness runs once per plan (a buffer lives from the kernel that first writes it to its last
reader); buffers whose lifetimes do not overlap share a slot, and at any binding every slot is
as large as its largest buffer, the slots back to back in one 64-byte aligned arena.  The
native program (native_program.py) and the per-kernel reference path (executor.run_python)
both lay their buffers out from it."""
from __future__ import annotations

from .steps import NodeStep

ALIGN = 64


def lifetimes(plan):
    """[(node, first kernel, last kernel)] of the plan's intermediate buffers, in order of first
    write: live from the kernel that first writes it to its last reader, inclusive (a buffer no
    kernel writes is live throughout)."""
    n_k = len(plan.kernels)
    first, last = {}, {}
    for i, k in enumerate(plan.kernels):
        for bind in k.inputs:
            if bind[0] == "node":
                last[bind[1]] = i
        for j in k.outputs:
            first.setdefault(j, i)
    for i, step in enumerate(plan.steps):
        if isinstance(step, NodeStep):
            for kind, idx, *_ in step.operands:
                if kind == "node":
                    last[idx] = max(last.get(idx, i), i)
    targets = set(plan.targets)
    out = []
    for j in sorted(plan.materialized - targets, key=lambda j: (first.get(j, 0), j)):
        if j in first:
            out.append((j, first[j], max(last.get(j, first[j]), first[j])))
        else:
            out.append((j, 0, n_k))
    return out


def _nbytes(numel, dt) -> int:
    return -(-max(numel * dt.numpy.itemsize, 1) // ALIGN) * ALIGN


def slots(plan):
    """({node: slot}, slot count), decided once per plan (`plan.arena_slots`): from lifetimes
    only, so it holds for every binding of the plan's size class; a buffer takes the free slot
    whose size at the plan's own binding fits it best."""
    got = plan.arena_slots
    if got is not None:
        return got
    numels = plan.binding.numels
    slot_of, ends, sizes = {}, [], []          # per slot: last kernel of its latest buffer, own-binding bytes
    for j, start, end in lifetimes(plan):
        want = _nbytes(numels[j], plan.dtypes[j])
        free = [s for s, e in enumerate(ends) if e < start]
        if free:
            s = min(free, key=lambda s: (sizes[s] < want, abs(sizes[s] - want)))
            ends[s], sizes[s] = end, max(sizes[s], want)
        else:
            s = len(ends)
            ends.append(end)
            sizes.append(want)
        slot_of[j] = s
    plan.arena_slots = got = (slot_of, len(ends))
    return got


def layout(plan, numels):
    """({node: byte offset}, arena bytes) of the plan's intermediate buffers at buffer sizes
    `numels`: each slot as large as its largest buffer, the slots back to back."""
    slot_of, n = slots(plan)
    size = [ALIGN] * n
    for j, s in slot_of.items():
        nb = (numels[j] * plan.dtypes[j].numpy.itemsize + ALIGN - 1) & -ALIGN
        if nb > size[s]:
            size[s] = nb
    at, top = [0] * n, 0
    for s, nb in enumerate(size):
        at[s] = top
        top += nb
    return {j: at[s] for j, s in slot_of.items()}, top


def views(arena, offsets, numels, dtypes) -> dict:
    """{node: 1-D array} of the buffers at `offsets` in the uint8 array `arena`."""
    bufs = {}
    for j, off in offsets.items():
        dt = dtypes[j].numpy
        bufs[j] = arena[off:off + numels[j] * dt.itemsize].view(dt)
    return bufs
