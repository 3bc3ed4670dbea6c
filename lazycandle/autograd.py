"""Reverse-mode autodiff as a graph transformation: `loss.backward()` walks the lazy graph
behind `loss` in reverse topological order and builds the adjoint graph from each op's VJP rule
(the op table's `vjp`, rules in autograd_rules.py).  Gradients are lazy Tensors, so forward and
backward realize (and fuse) together; `lc.grad` / `lc.value_and_grad` work on placeholders, so a
whole training step compiles into one program.

Trainable tensors are `lc.Var(data)` or `t.requires_grad_()`; the functional API differentiates
with respect to its arguments instead.  Nodes built inside `lc.no_grad()` are constants."""
from __future__ import annotations

import bisect
import contextlib
import weakref

from .autograd_rules import accumulate  # (importing it attaches the rules to the op table)
from .errors import ShapeMismatch, UnsupportedDTypeForOp
from .ir import node as node_mod
from .ir.ops import VIEW
from .tensor import Tensor, ones, tensor

_TRAINABLE = weakref.WeakSet()              # nodes that gradients are taken with respect to
_HANDLES = weakref.WeakValueDictionary()    # node id -> the user's Tensor handle (for iteration)
_NO_GRAD_STARTS: list = []                  # no_grad() spans of node ids [start, end), in order
_NO_GRAD_ENDS: list = []
_CONSTANT_IDS: set = set()                  # ids of single nodes made constants (_constant)


def _mark(t: Tensor, op: str) -> Tensor:
    if not t.dtype.is_float:
        raise UnsupportedDTypeForOp(f"{op}: integer tensors have no gradient (shape {t.shape}, dtype {t.dtype.name})")
    _TRAINABLE.add(t._node)
    node_mod.KEEP_ORIGIN = _keep_origin
    _HANDLES[t._node.id] = t
    return t


def Var(data, dtype=None) -> Tensor:
    """A trainable tensor (candle's Var): a realized copy of `data` that `backward` differentiates."""
    return _mark(tensor(data, dtype).realize(), "Var")


def requires_grad_(self: Tensor, requires_grad: bool = True) -> Tensor:
    """Mark this tensor trainable (in place, like torch); returns it.  A view becomes a copy of
    itself first (gradients flow to a view's base, so the view needs a node of its own)."""
    if requires_grad:
        if self._node.op.category == VIEW:
            self._node = self.copy()._node
        return _mark(self, "requires_grad_")
    _TRAINABLE.discard(self._node)
    return self


def _replace_var(t: Tensor, new_node) -> None:
    """Point trainable `t` at `new_node` (an optimizer's updated, realized value), keeping it
    trainable; the value forgets the step's graph (else every step would keep the last)."""
    new_node.origin = None
    _TRAINABLE.discard(t._node)
    t._node = new_node
    _mark(t, "optimizer")


@contextlib.contextmanager
def no_grad():
    """Tensors built inside are constants for backward (no gradient flows through them)."""
    first = next(node_mod._ids)
    try:
        yield
    finally:
        last = next(node_mod._ids)
        while _NO_GRAD_STARTS and _NO_GRAD_STARTS[-1] >= first:    # spans nested inside this one
            _NO_GRAD_STARTS.pop()
            _NO_GRAD_ENDS.pop()
        _NO_GRAD_STARTS.append(first)
        _NO_GRAD_ENDS.append(last)


def _constant(t: Tensor) -> Tensor:
    """Make the node of `t` (a fresh one the caller just built) a constant for backward, as if
    built under no_grad() but without a span per call (a softmax's max shift is built once
    per call of an eager loop: spans would pile up); the mark goes when the node dies."""
    n = t._node
    if n.id not in _CONSTANT_IDS:
        _CONSTANT_IDS.add(n.id)
        weakref.finalize(n, _CONSTANT_IDS.discard, n.id)
    return t


def _is_constant(n) -> bool:
    if n.id in _CONSTANT_IDS:
        return True
    i = bisect.bisect_right(_NO_GRAD_STARTS, n.id) - 1
    return i >= 0 and n.id < _NO_GRAD_ENDS[i]


def _keep_origin(n) -> bool:
    """While anything is trainable, realized nodes keep their graph (so `loss.numpy()` before
    `loss.backward()` works, as in candle); nodes built under no_grad() do not.  Once nothing
    is, realizes stop asking (node.KEEP_ORIGIN None) until _mark sets it again."""
    if _any_trainable():
        return not _is_constant(n)
    node_mod.KEEP_ORIGIN = None
    if _any_trainable():            # marked meanwhile by another thread, which may have set it first
        node_mod.KEEP_ORIGIN = _keep_origin
        return not _is_constant(n)
    return False


def _any_trainable() -> bool:
    # (the WeakSet's own set and pending removals, read in C: len(WeakSet) is a Python call)
    return len(_TRAINABLE.data) > len(_TRAINABLE._pending_removals)


node_mod.KEEP_ORIGIN = _keep_origin


def _computed(n):
    """The node as it was computed: its Origin once realized (when kept), else itself."""
    return n.origin if n.origin is not None and n.realized else n


def _inputs(n) -> tuple:
    """The nodes `n`'s gradient flows to: a view's base (layouts fold views), else its sources."""
    if _is_constant(n):
        return ()
    n = _computed(n)
    if n.op.category == VIEW:
        return (n.base,)
    return n.srcs


def _topological(root) -> list:
    """Nodes reachable from `root`, inputs before users (iterative: graphs can be deep)."""
    order, seen, stack = [], {root.id}, [(root, iter(_inputs(root)))]
    while stack:
        n, it = stack[-1]
        for s in it:
            if s.id not in seen:
                seen.add(s.id)
                stack.append((s, iter(_inputs(s))))
                break
        else:
            stack.pop()
            order.append(n)
    return order


class GradStore:
    """Gradients by tensor (candle's GradStore): `grads[t]` / `grads.get(t)` (None when the loss
    does not depend on t), `len`, iteration over (tensor, gradient) pairs."""

    def __init__(self, grads: dict, nodes: dict):
        self._grads = grads          # node id -> gradient Tensor
        self._nodes = nodes          # node id -> node

    def get(self, t: Tensor):
        return self._grads.get(t._node.id)

    __getitem__ = get

    def __contains__(self, t) -> bool:
        return t._node.id in self._grads

    def __len__(self) -> int:
        return len(self._grads)

    def __iter__(self):
        for nid, g in self._grads.items():
            handle = _HANDLES.get(nid)
            yield (Tensor(self._nodes[nid]) if handle is None or handle._node.id != nid else handle), g

    def remove(self, t: Tensor):
        """Drop and return t's gradient (None if absent), like candle's GradStore::remove."""
        return self._grads.pop(t._node.id, None)

    def insert(self, t: Tensor, grad: Tensor) -> None:
        self._grads[t._node.id] = grad
        self._nodes[t._node.id] = t._node


def gradients(loss: Tensor, wrt=(), grad: Tensor | None = None, keep_all: bool = True) -> GradStore:
    """The GradStore of `loss` with respect to the trainable nodes and `wrt` (tensors).  `grad`
    seeds a non-scalar loss.  keep_all also keeps intermediate nodes' gradients (like candle)."""
    root = loss._node
    if not loss.dtype.is_float:
        raise UnsupportedDTypeForOp(f"backward: the loss is {loss.dtype.name} (shape {loss.shape}); "
                                    f"integer values have no gradient")
    if grad is None:
        if loss.elem_count != 1:
            raise ShapeMismatch(f"backward: the loss must be a scalar (one element) without a seed gradient, "
                                f"got shape {loss.shape} ({loss.dtype.name})")
        grad = ones(loss.shape, loss.dtype)
    elif grad.shape != loss.shape:
        raise ShapeMismatch(f"backward: seed gradient shape {grad.shape} differs from the loss's {loss.shape} "
                            f"(dtypes {grad.dtype.name} and {loss.dtype.name})")
    targets = {t._node.id for t in wrt} | {n.id for n in _TRAINABLE}
    order = _topological(root)
    needs = {}
    for n in order:
        needs[n.id] = n.dtype.is_float and (n.id in targets or any(needs.get(s.id) for s in _inputs(n)))
    adj, nodes = {}, {}
    if needs[root.id]:
        adj[root.id] = grad
    for n in reversed(order):
        g = adj.get(n.id)
        if g is None:
            continue
        nodes[n.id] = n
        ins = _inputs(n)
        if not ins:
            continue
        xs = tuple(Tensor(s) for s in ins)
        how = _computed(n)
        if how.op.vjp is None:
            continue
        for s, gs in zip(ins, how.op.vjp(how, g, xs, Tensor(n))):
            if gs is None or not needs[s.id]:
                continue
            prev = adj.get(s.id)
            adj[s.id] = gs if prev is None else accumulate(prev, gs)
    if not keep_all:
        adj = {k: v for k, v in adj.items() if k in targets}
    return GradStore(adj, nodes)


def backward(self: Tensor, grad: Tensor | None = None) -> GradStore:
    """Gradients of this scalar loss with respect to every trainable tensor it depends on."""
    return gradients(self, (), grad)


def _argnums(argnums, n_args, fn):
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for a in nums:
        if not -n_args <= a < n_args:
            raise IndexError(f"grad: argnums {argnums} out of range for {getattr(fn, '__name__', fn)} "
                             f"called with {n_args} arguments")
    return nums


def value_and_grad(fn, argnums=0):
    """Like JAX: a function returning (fn(*args), d fn / d args[argnums]); the gradient is a
    tuple when argnums is a tuple.  A zero gradient is returned for an argument the value does
    not depend on."""
    def wrapped(*args, **kwargs):
        nums = _argnums(argnums, len(args), fn)
        for a in nums:
            if not isinstance(args[a], Tensor):
                raise TypeError(f"grad: argument {a} of {getattr(fn, '__name__', fn)} must be an lc.Tensor, "
                                f"got {type(args[a]).__name__}")
            if not args[a].dtype.is_float:
                raise UnsupportedDTypeForOp(f"grad: argument {a} is {args[a].dtype.name} (shape {args[a].shape}); "
                                            f"integer tensors have no gradient")
        args = list(args)
        seen = set()
        for a in nums:      # a view or a repeated argument gets a node of its own to differentiate by
            if args[a]._node.op.category == VIEW or args[a]._node.id in seen:
                args[a] = args[a].copy()
            seen.add(args[a]._node.id)
        value = fn(*args, **kwargs)
        if not isinstance(value, Tensor):
            raise TypeError(f"grad: {getattr(fn, '__name__', fn)} must return a scalar lc.Tensor, "
                            f"got {type(value).__name__}")
        store = gradients(value, [args[a] for a in nums], keep_all=False)
        grads = tuple(_or_zeros(store.get(args[a]), args[a]) for a in nums)
        return value, grads[0] if isinstance(argnums, int) else grads
    return wrapped


def _or_zeros(g, t):
    from .tensor import zeros
    return zeros(t.shape, t.dtype) if g is None else g


def grad(fn, argnums=0):
    """Like JAX: a function returning d fn / d args[argnums] (fn returns a scalar tensor)."""
    vg = value_and_grad(fn, argnums)
    return lambda *args, **kwargs: vg(*args, **kwargs)[1]


Tensor.backward = backward
Tensor.requires_grad_ = requires_grad_
