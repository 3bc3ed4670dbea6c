"""Capturing the unrealized part of the lazy graph.

`capture(targets)` walks the Node DAG from the targets down to realized buffers, placeholders
and constants, in a canonical order, and returns:
  * a structural key (op kinds, args, shapes, dtypes, strides, topology; never data, never the
    offsets of views into input buffers, never the value of a scalar), under which compiled
    plans are cached, and
  * the runtime bindings: the input nodes, the distinct (input, view) operand slots whose
    offsets are passed at run time, and the scalar slots (value, dtype) whose values are
    passed at run time.
Scalars are constants (`a * 2.0`, `lc.full`) and the scalar args of ops that take them
(`OpKind.scalar_args`: affine, clamp, elu, powf).  Equal scalars of one dtype share a slot.
The key holds each scalar's dtype and, where a rewrite of passes.py tests it, its value class
(`OpKind.keyed_scalars`, `ops.scalar_class`), so a new value compiles nothing.
`to_networkx(cap)` gives the same graph as a networkx DiGraph for the printers (networkx is
imported only there: it costs more than the rest of `import lazycandle`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..layout import contiguous_strides
from ..sizes import is_one, same
from .ops import VIEW, scalar_class
from .trace import argkey


@dataclass
class Operand:
    kind: str          # "in" (graph input), "node" (computed node), "const" (a scalar)
    index: int         # input index / node index; "in": the operand slot; "const": the scalar slot
    shape: tuple
    strides: tuple
    offset: int = 0    # static offset ("node"); for "in" the offset is runtime (slot)
    value: object = None
    dtype: object = None
    src: int = -1      # for "in": input index

    def key(self):
        if self.kind == "const":
            return ("c", self.index, self.dtype.name, self.shape)
        if self.kind == "in":
            return ("i", self.index, self.shape, self.strides)
        return ("n", self.index, self.shape, self.strides, self.offset)


class Capture:
    """A canonical capture.  `operands` (Operand objects) are built on first use from the raw
    operand keys, so a plan-cache hit never pays for them."""

    def __init__(self, key, inputs, slots, nodes, operands, targets, raw=None, scalars=(), args=None):
        self.key, self.inputs, self.slots, self.nodes, self.targets = key, inputs, slots, nodes, targets
        self._operands, self._raw = operands, raw
        self.scalars = scalars          # [(value, DType)] per scalar slot
        self.args = args                # per node: its structural arg (scalar args left out)
        self.extra = {}

    def derive(self, nodes, operands, targets, args):
        """A capture with the same runtime bindings over a rewritten node list (for passes)."""
        return Capture(self.key, self.inputs, self.slots, nodes, operands, targets,
                       scalars=self.scalars, args=args)

    @property
    def operands(self):
        if self._operands is None:
            self._operands = [[_operand_from_raw(r, self) for r in ops] for ops in self._raw]
        return self._operands

    @property
    def offsets(self):
        return [off for _, off in self.slots]


def _operand_from_raw(r, cap):
    if r[0] == "c":
        value, dt = cap.scalars[r[1]]
        return Operand("const", r[1], r[3], tuple(0 for _ in r[3]), value=value, dtype=dt)
    if r[0] == "i":
        return Operand("in", r[1], r[2], r[3], src=cap.slots[r[1]][0])
    return Operand("node", r[1], r[2], r[3], r[4])


def capture(targets) -> Capture:
    """Canonical capture of everything the (unrealized, non-view) `targets` depend on.  (The
    walk is on the eager realize path, once per realize: `src._base or src` is a view's base
    without the property call, a Node being always true.)"""
    index: dict = {}
    inputs, input_keys, nodes, raw, node_keys, args = [], [], [], [], [], []
    slots, slot_index = [], {}
    scalars, scalar_index = [], {}

    for root in targets:
        stack = [root]
        while stack:
            n = stack[-1]
            nid = id(n)
            if nid in index:
                stack.pop()
                continue
            kind_ = n.op
            op = kind_.name
            if n.buffer is not None or op == "placeholder":
                stack.pop()
                index[nid] = ("i", len(inputs))
                inputs.append(n)
                input_keys.append(("ph", n.arg, n.shape, n.dtype.name) if op == "placeholder"
                                  else ("buf", n.shape, n.dtype.name))
                continue
            pending = False             # sources not walked yet go first (depth first, in order)
            for s in reversed(n.srcs):
                b = s._base or s
                if id(b) not in index and not (b.buffer is None and b.op.name == "const"):
                    stack.append(b)
                    pending = True
            if pending:
                continue
            stack.pop()
            ops = []
            for src in n.srcs:
                base, lay = src._base or src, src.layout
                if base.buffer is None and base.op.name == "const":
                    value, dt = base.arg, base.dtype
                    sk = (dt.name, repr(value))
                    k = scalar_index.get(sk)
                    if k is None:
                        k = scalar_index[sk] = len(scalars)
                        scalars.append((value, dt))
                    ops.append(("c", k, dt.name, lay.shape, scalar_class(kind_, value) if kind_.keyed_scalars else None))
                    continue
                kind, idx = index[id(base)]
                if kind == "i":
                    sk = (idx, lay.shape, lay.strides, lay.offset)
                    sl = slot_index.get(sk)
                    if sl is None:
                        sl = slot_index[sk] = len(slots)
                        slots.append((idx, lay.offset))
                    ops.append(("i", sl, lay.shape, lay.strides))
                else:
                    ops.append(("n", idx, lay.shape, lay.strides, lay.offset))
            arg = n.arg
            if kind_.scalar_args:
                values = arg if isinstance(arg, tuple) else (arg,)
                for v in values:
                    sk = (n.dtype.name, repr(v))
                    k = scalar_index.get(sk)
                    if k is None:
                        k = scalar_index[sk] = len(scalars)
                        scalars.append((v, n.dtype))
                    ops.append(("c", k, n.dtype.name, (), None))
                arg = kind_.arg_class(values, n.dtype) if kind_.arg_class else None
            elif not (arg is None or isinstance(arg, (int, float, str))):
                arg = argkey(arg)
            ops = tuple(ops)
            index[nid] = ("n", len(nodes))
            nodes.append(n)
            raw.append(ops)
            args.append(arg)
            node_keys.append((op, arg, n.shape, n.dtype.name, ops))
    tgt = [index[id(t)][1] for t in targets]
    key = (tuple(input_keys), tuple(node_keys), tuple(tgt), tuple([sk[:3] for sk in slot_index]))
    return Capture(key, inputs, slots, nodes, None, tgt, raw, scalars, args)


def _contiguous_read(shape, strides) -> bool:
    try:
        return all(d == 1 or s == c for d, s, c in zip(shape, strides, contiguous_strides(shape)))
    except TypeError:       # (lc.SymbolicSizeError) sizes of named dims: a Size is not taken for 1
        return all(is_one(d) or same(s, c) for d, s, c in zip(shape, strides, contiguous_strides(shape)))


def size_signature(cap: Capture):
    """(size-class key, dims, layout) of a capture, in one pass.

    The key is the capture's key with every size abstracted: each distinct size other than 0
    and 1 becomes a symbol (numbered by first appearance, so equal sizes stay equal), and each
    read keeps only what the passes and the scheduler test of its layout -- its shape
    (symbolic), whether it walks that shape contiguously, and (node reads) whether its offset
    is 0.  Two captures with the same key get the same passes, fusion and buffers.  `dims` are
    the symbols' values in order; `layout` is every read's strides and every node read's
    offset, flattened (what a symbolic plan checks before it binds: compiler.SymbolicBinder)."""
    syms: dict = {0: 0, 1: 1}
    dims, layout = [], []

    def sym(shape):
        out = []
        for d in shape:
            s = syms.get(d)
            if s is None:
                s = syms[d] = ("d", len(syms))
                dims.append(d)
            out.append(s)
        return tuple(out)

    inputs = tuple(k[:-2] + (sym(k[-2]), k[-1]) for k in cap.key[0])
    nodes = []
    for n, arg, ops in zip(cap.nodes, cap.args, cap._raw):
        abstract = []
        for r in ops:
            if r[0] == "c":
                abstract.append(("c", r[1], r[2], sym(r[3]), r[4]))
            elif r[0] == "i":
                abstract.append(("i", r[1], sym(r[2]), _contiguous_read(r[2], r[3])))
                layout.extend(r[3])
            else:
                abstract.append(("n", r[1], sym(r[2]), _contiguous_read(r[2], r[3]), r[4] == 0))
                layout.extend(r[3])
                layout.append(r[4])
        nodes.append((n.op.name, arg, sym(n.shape), n.dtype.name, tuple(abstract)))
    key = (inputs, tuple(nodes), cap.key[2], tuple(i for i, _ in cap.slots))
    return key, tuple(dims), tuple(layout)


def size_class_key(cap: Capture):
    """The size-class key of `size_signature`."""
    return size_signature(cap)[0]


def to_networkx(cap: Capture):
    """Nodes: ("in", i) for inputs, ("n", j) for computed nodes; edge attr `slot` = operand
    position and `operand` = the Operand (layout of the read)."""
    import networkx as nx
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


def views_graph(targets):
    """The graph as the user built it, views included (a networkx DiGraph for the `graph`
    dump stage)."""
    import networkx as nx
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
