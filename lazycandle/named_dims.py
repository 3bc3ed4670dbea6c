"""Named (symbolic) dims: `lc.placeholder("x", ("n", 768))`, bound to sizes at `Program.run`.

Tracing: a named dim is a *probe* size, a `NamedDim` int equal to B ** e (B = 2**40; each live
name gets the smallest exponent e keeping every sum of up to four exponents distinct, and the
exponents of names no live placeholder uses are reused, so probes stay small).  The ops are the
ordinary ones, so every shape check runs on the probe: two dims with the same name are equal, a
named dim broadcasts against 1, and against any other size (a concrete one or another name) the
op raises at the user's line, as for any two unequal sizes.  (Deferring those checks to bind time
would let a graph be built that no binding can run.)

Binding: every size, stride and offset the ops compute from probes is a polynomial in them with
small integer coefficients (n - 1, 768*n, b*t ...), and its base-B digits give that polynomial
back (degree <= 4, coefficients < 2**32).  Node shapes hold them as `Size` ints, which print as
the polynomial.  `bind(targets, sizes)` rebuilds the graph with the polynomials evaluated at the
bound sizes and checks what the ops checked on the probe: no negative size, no view reading
outside its buffer, no max/min over an empty dim.  A size that is no such polynomial (x[::2] of
a named dim, (n + 1) // 2) raises `FeedError` at run.  Limits: a named size cannot be a scalar
operand (x / x.shape[0] raises UnboundPlaceholder; use mean), and code that branches on a named
size in Python sees the probe, a huge number."""
from __future__ import annotations

import sys
import threading
import weakref
from math import prod

from . import caches
from .errors import EmptyReduction, FeedError

_BITS = 40
B = 1 << _BITS
_MAX_COEF = 1 << 32           # larger base-B digits mean the value is no polynomial of the probes
SYMBOLIC = _MAX_COEF          # a size at least this large was computed from named dims
_MAX_DEGREE = 4

_lock = threading.RLock()     # RLock: _release runs from GC finalizers
caches.renew_lock_after_fork(sys.modules[__name__], "_lock", threading.RLock)
_exponents: dict = {}         # name -> exponent e (the probe is B ** e)
_monomials: dict = {0: ()}    # sum of up to _MAX_DEGREE exponents -> the names multiplied (sorted)
_live: dict = {}              # name -> number of live placeholders using it
_decoded = caches.register("named-dim decodings", caches.LRU(4096))   # value -> its terms


def _add_name(name: str) -> int:
    """Give `name` the smallest exponent keeping every sum of up to four exponents unique.
    Exponents of names no live placeholder uses are reused, so the probes stay small."""
    e = 1
    while True:
        new = None if e in _exponents.values() else _monomials_with(name, e)
        if new is not None:
            _monomials.update(new)
            _exponents[name] = e
            _decoded.clear()          # a value may now decode that did not before
            return e
        e += 1


def track(node, shape) -> None:
    """Keep the names in `shape` registered while placeholder `node` lives."""
    names = {d.name for d in shape if isinstance(d, NamedDim)}
    if names:
        with _lock:
            for n in names:
                _live[n] = _live.get(n, 0) + 1
        weakref.finalize(node, _release, names)


def _release(names) -> None:
    global _monomials
    with _lock:
        for n in names:
            _live[n] -= 1
            if not _live[n]:
                del _live[n], _exponents[n]
                _monomials = {s: ns for s, ns in _monomials.items() if n not in ns}
        _decoded.clear()


def _monomials_with(name, e):
    """The new sums when `name` gets exponent e, or None when one collides."""
    new = {}
    for k in range(1, _MAX_DEGREE + 1):
        for rest, names in _monomials.items():
            if len(names) + k <= _MAX_DEGREE:
                s = rest + k * e
                if s in _monomials or s in new:
                    return None
                new[s] = tuple(sorted(names + (name,) * k))
    return new


def _sized(op):
    def method(self, *other):
        out = op(int(self), *other)
        return Size(out) if isinstance(out, int) and is_symbolic(out) else out
    method.__name__ = op.__name__
    return method


class Size(int):
    """A traced size computed from named dims: an int (the encoded value) that prints as the
    polynomial it encodes, e.g. `8*n`, `n - 1`, and stays a Size through int arithmetic.  Node
    shapes hold these, so messages and labels naming a shape show names, not huge numbers."""

    def __repr__(self):
        return describe(int(self))

    __str__ = __repr__

    def __reduce__(self):
        """Pickled as its polynomial: another process gives the names other probes."""
        terms = _terms(int(self))
        return (Size, (int(self),)) if terms is None else (_from_terms, (tuple(terms),))


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__",
              "__rfloordiv__", "__mod__", "__rmod__", "__neg__", "__pos__", "__abs__", "__pow__"):
    setattr(Size, _name, _sized(getattr(int, _name)))


class NamedDim(Size):
    """The size of a named dim as traced: B ** e for its name."""

    def __new__(cls, name: str):
        with _lock:
            e = _exponents.get(name)
            if e is None:
                e = _add_name(name)
        self = super().__new__(cls, B ** e)
        self.name = name
        return self

    def __repr__(self):
        return self.name

    __str__ = __repr__

    def __reduce__(self):
        return NamedDim, (self.name,)


_ANONYMOUS = "#"       # names of the size-class symbols (no placeholder name: not an identifier)


def anonymous_dims(n: int) -> tuple:
    """Probes for the symbols of a size class (compiler.SymbolicBinder): named dims "#0" ..
    that stay registered for the life of the process, so their probes never change."""
    out = []
    with _lock:
        for k in range(n):
            name = f"{_ANONYMOUS}{k}"
            if name not in _live:
                _live[name] = 1
            out.append(NamedDim(name))
    return tuple(out)


def polynomial_source(v: int, names: dict):
    """Python source of the polynomial `v` encodes over variables `names` ({dim name: variable
    name}), or None when v is no polynomial of those names."""
    if not is_symbolic(v):
        return str(int(v))
    terms = _terms(int(v))
    if terms is None or any(n not in names for _, ns in terms for n in ns):
        return None
    return "(" + " + ".join("*".join([str(c)] + [names[n] for n in ns]) for c, ns in terms) + ")"


def _from_terms(terms) -> Size:
    """The Size of the polynomial `terms` ((coefficient, names), ...) in this process."""
    return Size(sum(c * prod(NamedDim(n) for n in names) for c, names in terms))


def sized(x):
    """x (an int, or tuples of them) with every traced size as a Size, so it pickles by names."""
    if isinstance(x, tuple):
        return tuple(sized(y) for y in x)
    if is_symbolic(x) and not isinstance(x, Size) and not isinstance(x, bool):
        return Size(x)
    return x


def _terms(v: int):
    """(coefficient, names) of the polynomial v encodes; None when it encodes none."""
    hit = _decoded.get(v, _decoded)
    if hit is _decoded:
        hit = _decoded.put(v, _decode(v))
    return hit


def _decode(v: int):
    terms, pos = [], 0
    while v:
        digit = v % B
        if digit >= B >> 1:
            digit -= B
        v = (v - digit) >> _BITS
        if digit:
            names = _monomials.get(pos)
            if names is None or abs(digit) > _MAX_COEF:
                return None
            terms.append((digit, names))
        pos += 1
    return terms


def describe(v: int) -> str:
    """v as the polynomial of named dims it encodes ("8*n", "n - 1"), or as a plain number."""
    terms = _terms(v) if is_symbolic(v) else None
    if terms is None:
        return str(v) if abs(v) < 10 ** 30 else "<a size that is no polynomial of named dims>"
    out = ""
    for coef, names in reversed(terms):
        body = "*".join(names) or str(abs(coef))
        if names and abs(coef) != 1:
            body = f"{abs(coef)}*{body}"
        out += (" - " if coef < 0 else " + ") + body if out else ("-" if coef < 0 else "") + body
    return out


def sizes_of(shape) -> tuple:
    """`shape` with every traced size as a Size (a node's shape prints with names)."""
    return tuple(Size(d) if is_symbolic(d) and not isinstance(d, Size) else d for d in shape)


def is_symbolic(v) -> bool:
    return isinstance(v, int) and abs(v) >= SYMBOLIC


def shape_spec(shape) -> tuple:
    """A placeholder's shape as the user wrote it: names as str, sizes as int."""
    return tuple(d.name if isinstance(d, NamedDim) else d for d in shape)


def placeholder_shape(shape):
    """A placeholder shape with every str in it as its NamedDim (the sizes are checked by
    layout.as_shape afterwards, like any shape)."""
    if isinstance(shape, str):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        return shape
    out = []
    for d in shape:
        if isinstance(d, str) and not isinstance(d, NamedDim):
            if not d.isidentifier():
                raise ValueError(f"placeholder: a named dim must be an identifier, got {d!r}")
            d = NamedDim(d)
        out.append(d)
    return tuple(out)


def evaluate(v: int, sizes: dict, what):
    """The polynomial `v` encodes, evaluated at `sizes` ({name: int}); `what()` describes v."""
    if not is_symbolic(v):
        return v
    terms = _terms(int(v))
    if terms is None:
        raise FeedError(f"run: {what()} is not a polynomial of the named dims (e.g. it divides a "
                        f"named size); it cannot be bound to {sizes}")
    try:
        return sum(c * prod(sizes[n] for n in names) for c, names in terms)
    except KeyError as e:
        raise FeedError(f"run: {what()} uses named dim {e.args[0]!r}, which no input names") from None


def _value(x, sizes, what):
    """Evaluate every symbolic int inside a shape, stride tuple or node argument."""
    if isinstance(x, tuple):
        return tuple(_value(y, sizes, what) for y in x)
    if isinstance(x, int) and not isinstance(x, bool):
        return evaluate(x, sizes, what)
    return x


_EMPTY_FAILS = ("max", "min", "argmax", "argmin")


def bind(targets, sizes: dict) -> list:
    """Copies of the nodes `targets` (and everything they depend on) with every named dim
    replaced by its size in `sizes`.  Realized nodes are shared, not copied."""
    from .ir.node import Node
    from .layout import Layout
    done: dict = {}
    for root in targets:
        stack = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            if id(n) in done:
                continue
            if n.realized:
                done[id(n)] = n
                continue
            if not expanded:
                stack.append((n, True))
                stack.extend((s, False) for s in n.srcs if id(s) not in done)
                continue

            def what(n=n):
                return f"a size of {n.label or n.op.name} (shape {n.shape})"
            shape = _value(n.shape, sizes, what)
            if any(d < 0 for d in shape):
                raise FeedError(f"run: sizes {sizes} give {n.label or n.op.name} the negative shape {shape}")
            srcs = tuple(done[id(s)] for s in n.srcs)
            layout = None
            if n.op.category == "view":
                lay = n.layout
                layout = Layout(shape, _value(lay.strides, sizes, what), _value(lay.offset, sizes, what))
                base = srcs[0].base
                lo, hi = layout.span()
                if layout.numel and (lo < 0 or hi >= prod(base.shape)):
                    raise FeedError(f"run: with sizes {sizes}, {n.label or 'a view'} reads elements {lo}..{hi} "
                                    f"of a buffer of shape {base.shape}")
            keep_arg = n.op.name in ("placeholder", "const") or n.op.category == "elementwise"
            arg = n.arg if keep_arg else _value(n.arg, sizes, what)
            if n.op.name in _EMPTY_FAILS and any(srcs[0].shape[d] == 0 for d in arg):
                raise EmptyReduction(f"{n.op.name}: with sizes {sizes}, a reduction over a zero-length dim "
                                     f"(shape {srcs[0].shape}, {srcs[0].dtype.name}, dims {arg})")
            done[id(n)] = Node(n.op, srcs, arg, shape, n.dtype, layout=layout, label=n.label)
    return [done[id(t)] for t in targets]


def has_named_dims(nodes) -> bool:
    return any(is_symbolic(d) for n in nodes for d in n.shape)


