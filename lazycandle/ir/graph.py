"""Capturing the unrealized part of the lazy graph.

`capture(targets)` walks the Node DAG from the targets down to realized buffers, placeholders
and constants, in a canonical order, and returns:
  * a structural key (op kinds, args, shapes, dtypes, strides, topology; never data, never the
    offsets of views into input buffers), under which compiled plans are cached, and
  * the runtime bindings: the input nodes and the distinct (input, view) operand slots whose
    offsets are passed at run time.
`to_networkx(cap)` gives the same graph as a networkx DiGraph for passes, the scheduler and
the printers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from .ops import VIEW


@dataclass
class Operand:
    kind: str          # "in" (graph input), "node" (computed node), "const"
    index: int         # input index / node index; for "in": the operand slot index
    shape: tuple
    strides: tuple
    offset: int = 0    # static offset ("node"); for "in" the offset is runtime (slot)
    value: object = None
    dtype: object = None
    src: int = -1      # for "in": input index

    def key(self):
        if self.kind == "const":
            return ("c", self.value, self.dtype.name, self.shape)
        if self.kind == "in":
            return ("i", self.index, self.shape, self.strides)
        return ("n", self.index, self.shape, self.strides, self.offset)


@dataclass
class Capture:
    key: tuple
    inputs: list                # base Nodes: realized buffers or placeholders
    slots: list                 # (input index, offset) per "in" operand slot
    nodes: list                 # computed Nodes, topological
    operands: list              # list[list[Operand]] per computed node
    targets: list               # node index per target
    extra: dict = field(default_factory=dict)

    @property
    def offsets(self):
        return [off for _, off in self.slots]


def _argkey(a):
    if isinstance(a, tuple):
        return tuple(_argkey(x) for x in a)
    if hasattr(a, "size_in_bytes"):
        return ("dtype", a.name)
    return a


def is_input(n) -> bool:
    return n.realized or n.op.name == "placeholder"


def capture(targets) -> Capture:
    """Canonical capture of everything the (unrealized, non-view) `targets` depend on."""
    index: dict = {}
    inputs, input_keys, nodes, operands, node_keys = [], [], [], [], []
    slots, slot_index = [], {}

    def operand(src):
        base, lay = src.base, src.layout
        if base.op.name == "const" and not base.realized:
            return Operand("const", -1, lay.shape, lay.strides, value=base.arg, dtype=base.dtype)
        kind, idx = index[id(base)]
        if kind == "in":
            sk = (idx, lay.shape, lay.strides, lay.offset)
            s = slot_index.get(sk)
            if s is None:
                s = slot_index[sk] = len(slots)
                slots.append((idx, lay.offset))
            return Operand("in", s, lay.shape, lay.strides, src=idx)
        return Operand("node", idx, lay.shape, lay.strides, lay.offset)

    for root in targets:
        stack = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            if id(n) in index:
                continue
            if is_input(n):
                index[id(n)] = ("in", len(inputs))
                inputs.append(n)
                input_keys.append(("ph", n.arg) if n.op.name == "placeholder" else ("buf",))
                input_keys[-1] += (n.shape, n.dtype.name)
                continue
            if not expanded:
                stack.append((n, True))
                for s in reversed(n.srcs):
                    b = s.base
                    if id(b) not in index and not (b.op.name == "const" and not b.realized):
                        stack.append((b, False))
                continue
            ops = [operand(s) for s in n.srcs]
            index[id(n)] = ("node", len(nodes))
            nodes.append(n)
            operands.append(ops)
            node_keys.append((n.op.name, _argkey(n.arg), n.shape, n.dtype.name, tuple(o.key() for o in ops)))
    tgt = [index[id(t)][1] for t in targets]
    key = (tuple(input_keys), tuple(node_keys), tuple(tgt), tuple(sk[:3] for sk in slot_index))
    return Capture(key, inputs, slots, nodes, operands, tgt)


def to_networkx(cap: Capture) -> nx.DiGraph:
    """Nodes: ("in", i) for inputs, ("n", j) for computed nodes; edge attr `slot` = operand
    position and `operand` = the Operand (layout of the read)."""
    g = nx.DiGraph()
    for i, n in enumerate(cap.inputs):
        g.add_node(("in", i), kind="input", op=n.op.name, shape=n.shape, dtype=n.dtype,
                   name=n.arg if n.op.name == "placeholder" else None)
    for j, (n, ops) in enumerate(zip(cap.nodes, cap.operands)):
        g.add_node(("n", j), kind=n.op.category, op=n.op.name, arg=n.arg, shape=n.shape, dtype=n.dtype,
                   operands=ops, target=j in cap.targets)
        for pos, o in enumerate(ops):
            if o.kind == "in":
                g.add_edge(("in", o.src), ("n", j), slot=pos, operand=o)
            elif o.kind == "node":
                g.add_edge(("n", o.index), ("n", j), slot=pos, operand=o)
    return g


def views_graph(targets) -> nx.DiGraph:
    """The graph as the user built it, views included (for the `graph` dump stage)."""
    g = nx.DiGraph()
    seen = set()
    stack = list(targets)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        g.add_node(n.id, op=n.op.name, label=n.label, arg=n.arg, shape=n.shape, dtype=n.dtype,
                   realized=n.realized, view=n.op.category == VIEW)
        for s in n.srcs:
            g.add_edge(s.id, n.id)
            stack.append(s)
    return g
