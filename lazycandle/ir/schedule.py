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
from .kernels import EwSpec, RedSpec, runtime_sizes, stride_class, tile_dim
from .ops import ELEMENTWISE, REDUCE


@dataclass
class Kernel:
    kind: str                       # "elementwise", ...
    nodes: list                     # captured node indices fused in, topological
    outputs: list                   # node indices written to buffers, in output order
    inputs: list = field(default_factory=list)   # ("slot", s) | ("node", j, offset): what each kernel input reads
    spec: object = None             # codegen spec (its structure is the compile cache key)
    scalars: list = field(default_factory=list)  # capture scalar slot of each kernel scalar slot
    loop_shape: tuple = ()          # fused kernels: the merged iteration shape
    loop_strides: tuple = ()        # fused kernels: each input's strides over loop_shape
    sizes: tuple = ()               # fused kernels: the runtime `sizes` argument
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
    consumers = [set() for _ in nodes]
    for j, ops in enumerate(operands):
        for o in ops:
            if o.kind == "node":
                consumers[o.index].add(j)
    targets = set(cap.targets)
    group_of, members, notes = {}, {}, []
    for j, (n, ops) in enumerate(zip(nodes, operands)):
        gid = j
        members[gid] = {j}
        group_of[j] = gid
        if n.op.category == REDUCE:
            o = ops[0]
            if o.kind == "node" and nodes[o.index].op.category == ELEMENTWISE and o.shape == nodes[o.index].shape \
                    and _identity_read(o, o.shape):
                G = members[group_of[o.index]]
                private = not (G & targets) and all(consumers[y] <= G | {j} for y in G)
                if private:
                    for y in members.pop(group_of[o.index]):
                        group_of[y] = gid
                        members[gid].add(y)
                else:
                    notes.append(f"n{j} ({n.op.name}) reads n{o.index} from a buffer: its producers are used elsewhere")
            continue
        if n.op.category != ELEMENTWISE:
            continue
        direct, indirect = [], set()
        for o in ops:
            if o.kind != "node":
                continue
            p = o.index
            if nodes[p].op.category == ELEMENTWISE and nodes[p].shape == n.shape and _identity_read(o, n.shape):
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
    return bind_kernels(cap, groups, mat), mat, notes


def bind_kernels(cap: Capture, groups, mat) -> list:
    """The kernels of `groups` (node index lists, in execution order) over this capture's
    concrete layouts: fused kernels get their spec (shape class) and runtime sizes."""
    kernels = []
    for g in groups:
        kind = cap.nodes[g[-1]].op.category
        if kind in (ELEMENTWISE, REDUCE):
            kernels.append(_fused_kernel(cap, g, mat))
        else:
            reads = [("slot", o.index) if o.kind == "in" else ("node", o.index, o.offset)
                     for o in cap.operands[g[0]] if o.kind != "const"]
            kernels.append(Kernel(kind, g, [j for j in g if j in mat], reads))
    return kernels


def _merge_classed(shape, strides_list, red):
    """merge_dims for a reduction: only dims of the same class (kept / reduced) merge, and at
    least one reduced dim survives."""
    dims = [(d, r, [s[i] for s in strides_list]) for i, (d, r) in enumerate(zip(shape, red)) if d != 1]
    if not any(r for _, r, _ in dims):
        dims.append((1, True, [0] * len(strides_list)))
    out = [list(dims[0][:2]) + [list(dims[0][2])]]
    for d, r, st in dims[1:]:
        prev = out[-1]
        if prev[1] == r and all(ps == s * d for ps, s in zip(prev[2], st)):
            prev[0] *= d
            prev[2] = list(st)
        else:
            out.append([d, r, list(st)])
    return (tuple(x[0] for x in out), tuple(x[1] for x in out),
            [tuple(x[2][k] for x in out) for k in range(len(strides_list))])


def _fused_kernel(cap: Capture, group, mat) -> Kernel:
    """An elementwise group, or a reduction with its private elementwise producers."""
    sink = cap.nodes[group[-1]]
    red_node = group[-1] if sink.op.category == REDUCE else None
    members = set(group) - {red_node}
    shape = cap.operands[red_node][0].shape if red_node is not None else cap.nodes[group[0]].shape
    in_keys, in_strides, in_dtypes, inputs = {}, [], [], []
    instr_of, instrs, scalar_of, scalars = {}, [], {}, []

    def ref(o):
        if o.kind == "const":
            k = scalar_of.get(o.index)
            if k is None:
                k = scalar_of[o.index] = len(scalars)
                scalars.append(o.index)
            return ("s", k, o.dtype.name)
        if o.kind == "node" and o.index in members and cap.nodes[o.index].shape == shape and _identity_read(o, shape):
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

    for j in group:
        n, ops = cap.nodes[j], cap.operands[j]
        refs = tuple(ref(o) for o in ops)
        instr_of[j] = len(instrs)
        if j == red_node:
            dt = dtype_of(ops[0])
            instrs.append(("copy", None, dt.name, dt.name, refs))
        else:
            instrs.append((n.op.name, cap.args[j], dtype_of(ops[n.op.arity - 1]).name, n.dtype.name, refs))
    scalar_dtypes = tuple(cap.scalars[k][1].name for k in scalars)
    def classes(strides):
        return tuple((dt.name, tuple(stride_class(x) for x in st)) for dt, st in zip(in_dtypes, strides))

    if red_node is not None:
        red = tuple(i in sink.arg for i in range(len(shape)))
        mshape, mred, mstrides = _merge_classed(shape, in_strides, red)
        spec = RedSpec(mred, classes(mstrides), tuple(instrs), sink.op.name, ((len(instrs) - 1, sink.dtype.name),),
                       scalar_dtypes)
        return Kernel(REDUCE, list(group), [red_node], inputs, spec, scalars=scalars, loop_shape=mshape,
                      loop_strides=tuple(mstrides), sizes=runtime_sizes(mshape, mstrides))
    outputs = [j for j in group if j in mat]
    mshape, mstrides = merge_dims(shape, in_strides + [contiguous_strides(shape)])
    mshape, mstrides = ((mshape, mstrides[:-1]) if prod(shape) else ((0,), [(0,)] * len(in_strides)))
    cls = classes(mstrides)
    spec = EwSpec(len(mshape), cls, tuple(instrs), tuple((instr_of[j], cap.nodes[j].dtype.name) for j in outputs),
                  scalar_dtypes, tile_dim([c for _, c in cls]))
    return Kernel(ELEMENTWISE, list(group), outputs, inputs, spec, scalars=scalars, loop_shape=mshape,
                  loop_strides=tuple(mstrides), sizes=runtime_sizes(mshape, mstrides))
