"""The scheduler: groups captured nodes into kernels.

Elementwise fusion is maximal: every elementwise node joins the group of its elementwise
producers that it reads element-for-element (same shape, contiguous, offset 0), so any DAG of
elementwise ops over inputs of any layout becomes ONE kernel.  A merge is refused when it would
create a cycle between kernels (the new member would also read a group member through a view,
or two groups are connected through a third kernel).  A node is materialised (written to a
buffer) when it is a target or when a node of another kernel reads it; inside its own kernel it
stays a register value.  Non-elementwise nodes (reduce, matmul, index ops) are kernels of their
own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import networkx as nx

from ..layout import contiguous_strides, merge_dims
from .graph import Capture
from .ops import ELEMENTWISE


@dataclass
class Kernel:
    kind: str                       # "elementwise", ...
    nodes: list                     # captured node indices fused in, topological
    outputs: list                   # node indices written to buffers, in output order
    inputs: list = field(default_factory=list)   # ("slot", s) | ("node", j, offset): what each kernel input reads
    spec: object = None             # codegen spec (its structure is the compile cache key)
    why: list = field(default_factory=list)      # notes on fusion decisions (for the dump)


def _identity_read(o, shape) -> bool:
    return o.kind == "node" and o.shape == shape and o.offset == 0 and \
        all(d == 1 or s == c for d, s, c in zip(shape, o.strides, contiguous_strides(shape)))


def group_nodes(cap: Capture):
    """Assign every captured node to a kernel group.  Returns (groups in execution order, notes)."""
    nodes, operands = cap.nodes, cap.operands
    anc = []                       # anc[j]: computed nodes j depends on, transitively
    for j, ops in enumerate(operands):
        a = set()
        for o in ops:
            if o.kind == "node":
                a.add(o.index)
                a |= anc[o.index]
        anc.append(a)
    group_of, members, notes = {}, {}, []
    for j, (n, ops) in enumerate(zip(nodes, operands)):
        gid = j
        members[gid] = {j}
        group_of[j] = gid
        if n.op.category != ELEMENTWISE:
            continue
        direct, indirect = [], set()
        for o in ops:
            if o.kind != "node":
                continue
            p = o.index
            if nodes[p].op.category == ELEMENTWISE and _identity_read(o, n.shape):
                direct.append(group_of[p])
            else:
                indirect.add(p)
                indirect |= anc[p]
        merged = []
        for g in dict.fromkeys(direct):
            G = members[g]
            if G & indirect:
                notes.append(f"n{j} not fused with group of n{min(G)}: it also reads that group through a view")
                continue
            if any(any(anc[y] & G for y in members[h]) or any(anc[y] & members[h] for y in G) for h in merged):
                notes.append(f"n{j}: groups of n{min(G)} and another member are connected through another kernel")
                continue
            merged.append(g)
        for g in merged:
            for y in members.pop(g):
                group_of[y] = gid
                members[gid].add(y)
    # order groups topologically
    dag = nx.DiGraph()
    dag.add_nodes_from(members)
    for j, ops in enumerate(operands):
        for o in ops:
            if o.kind == "node" and group_of[o.index] != group_of[j]:
                dag.add_edge(group_of[o.index], group_of[j])
    order = list(nx.lexicographical_topological_sort(dag))
    return [sorted(members[g]) for g in order], group_of, notes


def materialized(cap: Capture, group_of) -> set:
    """Nodes that need a buffer: targets and nodes read by another kernel."""
    out = set(cap.targets)
    for j, ops in enumerate(cap.operands):
        for o in ops:
            if o.kind == "node" and group_of[o.index] != group_of[j]:
                out.add(o.index)
    return out


def schedule(cap: Capture):
    """Kernels in execution order, plus the set of materialised nodes and fusion notes."""
    groups, group_of, notes = group_nodes(cap)
    mat = materialized(cap, group_of)
    kernels = []
    for g in groups:
        n0 = cap.nodes[g[0]]
        kind = n0.op.category
        if kind == ELEMENTWISE:
            kernels.append(_elementwise_kernel(cap, g, mat))
        else:
            kernels.append(Kernel(kind, g, [j for j in g if j in mat]))
    return kernels, mat, notes


def _elementwise_kernel(cap: Capture, group, mat) -> Kernel:
    from ..codegen.elementwise import EwSpec
    members = set(group)
    shape = cap.nodes[group[0]].shape
    in_keys, in_strides, in_dtypes, inputs = {}, [], [], []
    instr_of, instrs = {}, []

    def ref(o):
        if o.kind == "const":
            return ("c", o.value, o.dtype.name)
        if o.kind == "node" and o.index in members and _identity_read(o, shape):
            return ("v", instr_of[o.index])
        if o.kind == "in":
            key = ("slot", o.index, o.strides)
            dt = cap.inputs[o.src].dtype
            bind = ("slot", o.index)
        else:
            key = ("node", o.index, o.strides, o.offset)
            dt = cap.nodes[o.index].dtype
            bind = ("node", o.index, o.offset)
        k = in_keys.get(key)
        if k is None:
            k = in_keys[key] = len(inputs)
            inputs.append(bind)
            in_strides.append(o.strides)
            in_dtypes.append(dt)
        return ("i", k)

    def dtype_of(o):
        if o.kind == "const":
            return o.dtype
        if o.kind == "in":
            return cap.inputs[o.src].dtype
        return cap.nodes[o.index].dtype

    from .graph import _argkey
    for j in group:
        n, ops = cap.nodes[j], cap.operands[j]
        refs = tuple(ref(o) for o in ops)
        instr_of[j] = len(instrs)
        instrs.append((n.op.name, _argkey(n.arg), dtype_of(ops[-1]).name, n.dtype.name, refs))
    outputs = [j for j in group if j in mat]
    mshape, mstrides = merge_dims(shape, in_strides + [contiguous_strides(shape)])
    spec = EwSpec(mshape if prod(shape) else (0,), tuple((dt.name, s) for dt, s in zip(in_dtypes, mstrides[:-1])),
                  tuple(instrs), tuple((instr_of[j], cap.nodes[j].dtype.name) for j in outputs))
    return Kernel(ELEMENTWISE, list(group), outputs, inputs, spec)
