"""IR nodes of the lazy graph.  A Tensor is a handle on a Node.  Non-view nodes own (once
realized) a contiguous buffer of their shape; a view node records which non-view node's buffer
it reads (`base`) and how (`layout`, strides and offset in elements), so every view is already
folded into strides when it is created."""
from __future__ import annotations

import itertools

from ..layout import CONTIGUOUS_LAYOUTS, contiguous_layout
from .ops import OPS, SOURCE, VIEW
from .trace import PENDING, node_trace

_ids = itertools.count()

# Set by the autograd layer: keep_origin(node) says whether a node being realized keeps how it
# was computed (reverse mode walks realized nodes through it).  None: never.
KEEP_ORIGIN = None


_BUFFER = OPS["buffer"]
_MATMUL = OPS["matmul"]


class Origin:
    """How a realized node was computed: its op, sources, arg and layout at realize time."""
    __slots__ = ("op", "srcs", "arg", "layout", "base", "shape", "dtype", "id")

    def __init__(self, n):
        self.op, self.srcs, self.arg, self.layout = n.op, n.srcs, n.arg, n.layout
        self.base, self.shape, self.dtype, self.id = n.base, n.shape, n.dtype, n.id


class Node:
    __slots__ = ("op", "srcs", "arg", "shape", "dtype", "_base", "layout", "buffer", "label", "id", "origin", "trace",
                 "traces", "__weakref__")

    def __init__(self, op, srcs, arg, shape, dtype, layout=None, buffer=None, label=None):
        if op.__class__ is str:
            op = OPS[op]
        self.op = op
        if srcs.__class__ is not tuple:
            srcs = tuple(srcs)
        self.srcs = srcs
        self.arg = arg
        if shape.__class__ is not tuple:
            shape = tuple(shape)
        self.shape = shape
        self.dtype = dtype
        self.buffer = buffer
        self.label = label          # what the user called (for dumps): "transpose(0, 1)"
        self.id = next(_ids)
        self.origin = None
        self.traces = None          # ir/trace.py: traces of ops built on this node once it is realized
        cat = op.category
        if cat is VIEW:
            src = srcs[0]
            self._base = src._base or src      # the base, without the property call
            self.layout = layout
            self.trace = None
        else:
            self._base = None          # itself (not stored: a self-reference would be a cycle)
            self.layout = CONTIGUOUS_LAYOUTS.get(shape) or contiguous_layout(shape)
            # the eager realize's key of the expression (ir/trace.py), while it is unrealized; a
            # matmul's is built when asked (an eager `a @ b` realizes by its own path, without it)
            self.trace = None if cat is SOURCE or buffer is not None else PENDING if op is _MATMUL else node_trace(self)

    @property
    def base(self):
        return self if self._base is None else self._base

    @property
    def realized(self) -> bool:
        return self.buffer is not None

    def set_buffer(self, buf) -> None:
        """Become a realized buffer node (drops the sources so the graph behind can be freed,
        unless KEEP_ORIGIN asks to keep them in `origin`)."""
        if KEEP_ORIGIN is not None and self.srcs and KEEP_ORIGIN(self):
            self.origin = Origin(self)
        self.op = _BUFFER
        self.srcs = ()
        self.arg = None
        self.buffer = buf
        self.trace = None
        if self._base is not None:      # a view becomes contiguous (other nodes already are)
            self._base = None
            self.layout = contiguous_layout(self.shape)

    def __repr__(self):
        return f"Node#{self.id}({self.op.name}, {self.shape}, {self.dtype.name})"


_CONST, _VIEW = OPS["const"], OPS["view"]


def computed_node(op, srcs: tuple, arg, shape: tuple, dtype, layout):
    """What `Node(op, srcs, arg, shape, dtype)` builds for a computed op other than matmul whose
    plain shape tuple some earlier Node() has checked and whose contiguous `layout` it made,
    without Node()'s generic checks (an eager op built again, usually on cold caches)."""
    n = _new(Node)
    n.op, n.srcs, n.arg, n.shape, n.dtype, n._base, n.layout = op, srcs, arg, shape, dtype, None, layout
    n.buffer = n.label = n.origin = n.traces = None
    n.id = next(_ids)
    n.trace = node_trace(n)
    return n


def view_node(src, shape: tuple, layout, label):
    """What `Node("view", (src,), None, shape, src.dtype, layout=layout, label=label)` builds
    for a checked shape and layout, without Node()'s generic checks."""
    v = _new(Node)
    v.op, v.srcs, v.arg, v.shape, v.dtype, v._base, v.layout = _VIEW, (src,), None, shape, src.dtype, src._base or src, layout
    v.buffer = v.origin = v.trace = v.traces = None
    v.label = label
    v.id = next(_ids)
    return v


def broadcast_scalar(value, dtype, shape: tuple, layout, label):
    """The two nodes of a scalar operand, built without Node()'s generic checks: a const node
    of `value` (already exact in `dtype`) and its view broadcasting it to `shape` (a
    non-empty shape some node already has: Node() has checked it) by `layout` (strides 0) --
    what `Node("const", ...)` then `Node("view", ...)` build; returns the view."""
    c = _new(Node)
    c.op, c.srcs, c.arg, c.shape, c.dtype, c._base, c.layout = _CONST, (), value, (), dtype, None, _SCALAR_LAYOUT
    c.buffer = c.label = c.origin = c.trace = c.traces = None
    c.id = next(_ids)
    return view_node(c, shape, layout, label)


_new = object.__new__
_SCALAR_LAYOUT = contiguous_layout(())
