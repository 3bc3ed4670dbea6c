"""Named (symbolic) dims: `lc.placeholder("x", ("n", 768))`, bound to sizes at `Program.run`.

Tracing: a named dim is an `lc.Size` (sizes.py), an expression that every shape rule carries
along (`n - 1`, `8*n`, `b*t`, `(n + 1)//2`).  Node shapes, view strides and offsets, node args
and scalar operands (`t / n`) may hold Sizes.  A check an op cannot decide before the sizes are
known (`n` against `m` in a broadcast, a slice bound against the dim, a negative size) is
attached to the op's node (`require`) with the typed error the op raises for concrete sizes.

Binding: `bind(targets, sizes)` rebuilds the graph with every Size evaluated at the bound sizes,
runs the attached checks, and checks what the ops check on concrete sizes: no negative size, no
view reading outside its buffer, no max/min over an empty dim."""
from __future__ import annotations

import sys
import threading
import weakref
from math import prod

from . import caches
from .errors import EmptyReduction, FeedError, ShapeMismatch
from .sizes import Size, decide_eq, decide_ge0, evaluate as _evaluate, has_size

__all__ = ["Size", "require", "require_ge0", "require_eq", "bind", "checks_of", "placeholder_shape",
           "shape_spec", "is_symbolic", "names_used", "evaluate"]

# node -> its bind-time checks: (size that must be >= 0 ("ge0") or == 0 ("eq0"), kind, error class,
# message).  Weak: a check lives as long as the node it guards.
_checks: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_lock = threading.Lock()        # graphs are built from several threads at once
caches.renew_lock_after_fork(sys.modules[__name__], "_lock")


def require(node, checks, first=False) -> None:
    """Attach bind-time `checks` ((size, "ge0" | "eq0", error class, message), ...) to `node`
    (`first`: before those it has, when the op that made it calls the one that built it)."""
    if checks:
        with _lock:
            old = _checks.get(node, ())
            _checks[node] = tuple(checks) + old if first else old + tuple(checks)


def checks_of(node) -> tuple:
    with _lock:
        return _checks.get(node, ())


def require_ge0(out: list, x, error, message) -> None:
    """x >= 0 must hold: raise `error` now when it provably does not, else add a bind-time check
    to `out` when undecided."""
    got = decide_ge0(x)
    if got is False:
        raise error(message)
    if got is None:
        out.append((x, "ge0", error, message))


def require_eq(out: list, a, b, error, message) -> None:
    got = decide_eq(a, b)
    if got is False:
        raise error(message)
    if got is None:
        out.append((a - b, "eq0", error, message))


def is_symbolic(v) -> bool:
    return v.__class__ is Size


def shape_spec(shape) -> tuple:
    """A placeholder's shape as the user wrote it: names as str, sizes as int."""
    return tuple(d.name if d.__class__ is Size else d for d in shape)


def placeholder_shape(shape):
    """A placeholder shape with every str in it as its named Size (the sizes are checked by
    layout.as_shape afterwards, like any shape)."""
    if isinstance(shape, str):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        return shape
    out = []
    for d in shape:
        if isinstance(d, str):
            if not d.isidentifier():
                raise ValueError(f"placeholder: a named dim must be an identifier, got {d!r}")
            d = Size.symbol(d)
        elif d.__class__ is Size and d.name is None:
            raise ValueError(f"placeholder: a dim is a size or a name, got the expression {d}")
        out.append(d)
    return tuple(out)


def evaluate(v, sizes: dict, what):
    """Size `v` (or an int, or a tuple of them) at the bound `sizes`; `what()` describes v."""
    try:
        return _evaluate(v, sizes)
    except KeyError as e:
        raise FeedError(f"run: {what()} uses named dim {e.args[0]!r}, which no input names") from None


def run_checks(node, sizes: dict) -> None:
    """Raise the error of the first check attached to `node` that fails at `sizes`."""
    for x, kind, error, message in checks_of(node):
        v = evaluate(x, sizes, lambda: message)
        if (v < 0) if kind == "ge0" else (v != 0):
            raise error(f"{message} (at {_sizes_text(sizes)})")


def _sizes_text(sizes) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(sizes.items()))


_EMPTY_FAILS = ("max", "min", "argmax", "argmin")


def const_value(v, dtype):
    """A Size scalar operand's bound value as the const of `dtype` holds it."""
    if dtype.is_int:
        m = 1 << dtype.bits
        v %= m
        return v - m if dtype.is_signed and v >= m >> 1 else v
    return float(v)


def bind(targets, sizes: dict) -> list:
    """Copies of the nodes `targets` (and everything they depend on) with every Size evaluated
    at `sizes` and the nodes' checks run.  Realized nodes are shared, not copied."""
    from .ir.node import Node
    from .layout import Layout
    order = _topo_order(targets)
    for n in order:                 # the ops' own checks first: their errors name the op
        run_checks(n, sizes)
    done: dict = {}
    for n in order:
        if n.realized:
            done[id(n)] = n
            continue

        def what(n=n):
            return f"a size of {n.label or n.op.name} (shape {n.shape})"
        shape = evaluate(n.shape, sizes, what)
        if any(d < 0 for d in shape):
            raise ShapeMismatch(f"{n.label or n.op.name}: shape {n.shape} is {shape} at {_sizes_text(sizes)}: "
                                f"a negative size")
        srcs = tuple(done[id(s)] for s in n.srcs)
        layout = None
        if n.op.category == "view":
            lay = n.layout
            layout = Layout(shape, evaluate(lay.strides, sizes, what), evaluate(lay.offset, sizes, what))
            base = srcs[0].base
            lo, hi = layout.span()
            if layout.numel and (lo < 0 or hi >= prod(base.shape)):
                raise FeedError(f"run: at {_sizes_text(sizes)}, {n.label or 'a view'} reads elements {lo}..{hi} "
                                f"of a buffer of shape {base.shape}")
        if n.op.name == "const":
            arg = const_value(evaluate(n.arg, sizes, what), n.dtype) if n.arg.__class__ is Size else n.arg
        elif n.op.name == "placeholder" or n.op.category == "elementwise":
            arg = n.arg
            if has_size(arg):        # a scalar arg (affine, clamp) that is a size: its value
                arg = tuple(const_value(evaluate(v, sizes, what), n.dtype) if v.__class__ is Size else v
                            for v in arg)
        else:
            arg = evaluate(n.arg, sizes, what)
        if n.op.name in _EMPTY_FAILS and any(srcs[0].shape[d] == 0 for d in arg):
            raise EmptyReduction(f"{n.op.name}: at {_sizes_text(sizes)}, a reduction over a zero-length dim "
                                 f"(shape {srcs[0].shape}, {srcs[0].dtype.name}, dims {arg})")
        done[id(n)] = Node(n.op, srcs, arg, shape, n.dtype, layout=layout, label=n.label)
    return [done[id(t)] for t in targets]


def _topo_order(targets) -> list:
    """The nodes behind `targets`, sources first (realized nodes are leaves)."""
    order, seen = [], set()
    for root in targets:
        stack = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            if id(n) in seen:
                continue
            if expanded or n.realized:
                seen.add(id(n))
                order.append(n)
                continue
            stack.append((n, True))
            stack.extend((s, False) for s in n.srcs if id(s) not in seen)
    return order


def names_used(cap) -> set:
    """The named dims a capture's shapes, view layouts and scalar operands use."""
    out: set = set()
    for n in list(cap.nodes) + list(cap.inputs):
        for d in n.shape:
            if d.__class__ is Size:
                out |= d.names()
    for ops in cap._raw:
        for r in ops:
            for x in r[2:]:
                if x.__class__ is tuple:
                    for d in x:
                        if d.__class__ is Size:
                            out |= d.names()
                elif x.__class__ is Size:
                    out |= x.names()
    for v in [v for v, _ in cap.scalars] + [off for _, off in cap.slots]:
        if v.__class__ is Size:
            out |= v.names()
    return out
