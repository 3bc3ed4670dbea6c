"""Pickling a Program: its output graph is stored as a flat, topologically ordered list of node
records (op name, source indices, arg, shape, dtype, view layout, the raw bytes of a realized
buffer, label, the op's bind-time checks).  Sizes of named dims pickle as their expressions
(lc.Size).  Unpickling rebuilds the nodes and compiles them again, which the kernel cache
(keyed by the graph's structure) usually answers without compiling."""
from __future__ import annotations

import numpy as np


def _topo_order(roots) -> list:
    """Every node reachable from `roots`, sources before users (iterative: graphs can be deep)."""
    order, seen = [], set()
    stack = [(n, False) for n in reversed(roots)]
    while stack:
        n, expanded = stack.pop()
        if expanded:
            order.append(n)
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.append((n, True))
        stack.extend((s, False) for s in reversed(n.srcs) if id(s) not in seen)
    return order


def graph_state(roots) -> tuple:
    """(records, indices of `roots`) describing the graph behind the nodes `roots`."""
    from .named_dims import checks_of
    order = _topo_order(roots)
    index = {id(n): i for i, n in enumerate(order)}
    records = []
    for n in order:
        data = None if n.buffer is None else np.ascontiguousarray(n.buffer).tobytes()
        layout = n.layout if n.op.category == "view" else None
        records.append((n.op.name, tuple(index[id(s)] for s in n.srcs), n.arg, n.shape, n.dtype,
                        layout, data, n.label, checks_of(n)))
    return records, [index[id(n)] for n in roots]


def rebuild_nodes(state) -> list:
    """The root nodes of a graph stored by `graph_state`."""
    from . import named_dims
    from .ir.node import Node
    from .runtime.buffers import alloc
    records, roots = state
    nodes = []
    for op, srcs, arg, shape, dtype, layout, data, label, checks in records:
        buf = None
        if data is not None:
            buf = alloc(int(np.prod(shape, dtype=np.int64)), dtype)
            buf.view(np.uint8)[:] = np.frombuffer(data, np.uint8)
        nodes.append(Node(op, tuple(nodes[i] for i in srcs), arg, shape, dtype, layout=layout, buffer=buf,
                          label=label))
        named_dims.require(nodes[-1], checks)       # the bind-time checks of its op
    return [nodes[i] for i in roots]


def rebuild_program(state):
    """The inverse of Program.__reduce__: the same outputs compiled again."""
    from .graph_api import Program
    from .tensor import Tensor
    return Program([Tensor(n) for n in rebuild_nodes(state)])
