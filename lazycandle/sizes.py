"""`lc.Size`: a size that depends on named dims, as an expression of its own.

A Size is a polynomial with integer coefficients over *atoms*: named dims (`("d", name)`, each
an integer >= 0; the symbols "#k" of a size class, compiler.SymbolicBinder, are >= 2) and
opaque terms `("//", a, b)`, `("%", a, b)`, `("min", a, b)`, `("max", a, b)` whose operands
are ints or Sizes.  The form is canonical (terms sorted, zero coefficients dropped, constant
results plain ints), so equal expressions compare and hash equal.  Comparisons are decided
when the atoms' lower bounds prove them (`n + 1 > 0`, `n != n + 2`); anything else that needs
a Python value (`int()`, `bool()`, `range()`, an undecided `==` or `<`) raises
SymbolicSizeError naming the dims: a graph never computes with a stand-in value.  Bound sizes
are evaluated by `evaluate(env)`, or by the Python source `source(var)` gives."""
from __future__ import annotations

import numbers

from .errors import SymbolicSizeError


def _akey(atom):
    """Sort key of an atom: named dims first, by name; opaque terms by their text."""
    return (0, atom[1], "") if atom[0] == "d" else (1, atom[0], _atom_text(atom))


def _mono_key(item):
    mono = item[0]
    return (-len(mono), tuple(_akey(a) for a in mono))


def _norm(poly: dict):
    """The canonical value of `poly` ({monomial: coefficient}): an int when constant."""
    items = [(m, c) for m, c in poly.items() if c]
    if all(not m for m, _ in items):
        return items[0][1] if items else 0
    self = object.__new__(Size)
    self.terms = tuple(sorted(items, key=_mono_key))
    self._hash = None
    return self


def _poly(x) -> dict:
    if x.__class__ is Size:
        return dict(x.terms)
    return {(): x} if x else {}


def _coerce(x):
    """An operand of Size arithmetic as an int or a Size; NotImplemented for others (tensors
    reflect); a float raises (a size times a float has no size value before the run)."""
    if x.__class__ is Size or x.__class__ is int:
        return x
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, float):
        raise SymbolicSizeError("a named-dim size combined with a float has no value before the program runs; "
                                "use it as a tensor operand (t * n), which the run fills in")
    return NotImplemented


def _add(a, b, sign=1):
    p = _poly(a)
    for m, c in _poly(b).items():
        p[m] = p.get(m, 0) + sign * c
    return _norm(p)


def _mul(a, b):
    out: dict = {}
    for ma, ca in _poly(a).items():
        for mb, cb in _poly(b).items():
            m = tuple(sorted(ma + mb, key=_akey))
            out[m] = out.get(m, 0) + ca * cb
    return _norm(out)


def _atom(kind, a, b):
    self = object.__new__(Size)
    self.terms = ((((kind, a, b),), 1),)
    self._hash = None
    return self


def _exact_quotient(a, b):
    """a / b when b is one term dividing every term of a exactly (b*t*4 / t = 4*b), else None."""
    if b.__class__ is not Size or len(b.terms) != 1:
        return None
    mb, cb = b.terms[0]
    out = {}
    for m, c in _poly(a).items():
        rest = list(m)
        for atom in mb:
            if atom not in rest:
                return None
            rest.remove(atom)
        if c % cb:
            return None
        out[tuple(rest)] = c // cb
    return _norm(out)


def floordiv(a, b):
    if b.__class__ is int:
        if b == 0:
            raise ZeroDivisionError(f"size {a} // 0")
        if b == 1 or a.__class__ is int:
            return a if b == 1 else a // b
        if b > 0:
            p = _poly(a)
            const = p.pop((), 0)
            if all(c % b == 0 for c in p.values()):      # (b*q + r) // b = q + r // b for integer q
                return _add(_norm({m: c // b for m, c in p.items()}), const // b)
        return _atom("//", a, b)
    q = _exact_quotient(a, b)
    return q if q is not None else _atom("//", a, b)


def mod(a, b):
    if b.__class__ is int:
        if b == 0:
            raise ZeroDivisionError(f"size {a} % 0")
        if a.__class__ is int:
            return a % b
        if b > 0:
            p = _poly(a)
            const = p.pop((), 0)
            if all(c % b == 0 for c in p.values()):
                return const % b
        return _atom("%", a, b)
    if _exact_quotient(a, b) is not None:
        return 0
    return _atom("%", a, b)


def _pick(kind, a, b):
    """min / max of two sizes: the one the bounds prove, else an opaque term."""
    d = _add(a, b, -1)
    lo, hi = lower(d), upper(d)
    if lo is not None and lo >= 0:              # a >= b
        return b if kind == "min" else a
    if hi is not None and hi <= 0:              # a <= b
        return a if kind == "min" else b
    x, y = sorted((a, b), key=lambda v: (v.__class__ is not Size, repr(v)))      # min(n, 4)
    return _atom(kind, x, y)


def size_min(a, b):
    """min(a, b) of sizes (ints or Sizes) as a size: an expression when undecided."""
    return _pick("min", _check(a), _check(b))


def size_max(a, b):
    return _pick("max", _check(a), _check(b))


def _check(x):
    y = _coerce(x)
    if y is NotImplemented:
        raise TypeError(f"expected an int or an lc.Size, got {type(x).__name__}")
    return y


# ---- bounds -------------------------------------------------------------------------------
def _atom_lower(atom):
    kind = atom[0]
    if kind == "d":
        return 2 if atom[1].startswith("#") else 0
    a, b = atom[1], atom[2]
    if kind == "%":
        return 0 if b.__class__ is int and b > 0 else None
    if kind == "//":
        la = lower(a)
        return la // b if b.__class__ is int and b > 0 and la is not None else None
    la, lb = lower(a), lower(b)
    if kind == "min":
        return None if la is None or lb is None else min(la, lb)
    return max((v for v in (la, lb) if v is not None), default=None)


def lower(x):
    """A lower bound of size `x` proved from its atoms' lower bounds (each atom written
    L + y, y >= 0, and the polynomial in the y's expanded), or None."""
    if x.__class__ is int:
        return x
    shifted: dict = {}
    for mono, coef in x.terms:
        parts = [{(): coef}]
        for atom in mono:
            lo = _atom_lower(atom)
            if lo is None:
                return None
            nxt = []
            for p in parts:
                for m, c in p.items():
                    if lo:
                        nxt.append({m: c * lo})
                    nxt.append({m + (atom,): c})
            parts = nxt
        for p in parts:
            for m, c in p.items():
                m = tuple(sorted(m, key=_akey))
                shifted[m] = shifted.get(m, 0) + c
    if any(c < 0 for m, c in shifted.items() if m):
        return None
    return shifted.get((), 0)


def upper(x):
    lo = lower(_mul(x, -1))
    return None if lo is None else -lo


def decide_ge0(x):
    """True / False when x >= 0 is proved either way, else None."""
    if x.__class__ is int:
        return x >= 0
    lo = lower(x)
    if lo is not None and lo >= 0:
        return True
    hi = upper(x)
    if hi is not None and hi < 0:
        return False
    return None


def decide_eq(a, b):
    """True / False when a == b is proved either way (sizes or ints), else None."""
    if a.__class__ is int and b.__class__ is int:
        return a == b
    d = _add(a, b, -1)
    if d.__class__ is int:
        return d == 0
    lo, hi = lower(d), upper(d)
    if (lo is not None and lo > 0) or (hi is not None and hi < 0):
        return False
    return None


def same(a, b) -> bool:
    """Whether sizes (or tuples of them) are provably equal (False when undecided)."""
    if a.__class__ is tuple or b.__class__ is tuple:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if a.__class__ is int and b.__class__ is int:
        return a == b
    return decide_eq(a, b) is True


def growth_key(x) -> int:
    """An int that orders sizes by how they grow with their names (each name taken as 2**32):
    for choosing an order of dims or strides (a view's gradient), never as a size's value."""
    if x.__class__ is int:
        return x
    return x.evaluate(_Huge())


class _Huge(dict):
    def __missing__(self, name):
        return 1 << 32


def is_one(d) -> bool:
    """Whether size `d` is the literal 1 (a Size is never taken for 1: a named dim bound to 1
    reads the same elements through its stride)."""
    return d.__class__ is int and d == 1


# ---- the value ----------------------------------------------------------------------------
class Size:
    """A size computed from named dims: `n`, `2*n + 1`, `b*t`, `n//2`, `min(n, 4)`.  Supports
    `+ - * // %` and `.min()` / `.max()` with ints and other Sizes; `t * s` makes it a
    runtime scalar.  Its Python value exists only once the program runs."""
    __slots__ = ("terms", "_hash")

    @staticmethod
    def symbol(name: str) -> "Size":
        return _norm({(("d", name),): 1})

    def names(self) -> set:
        out = set()
        for mono, _ in self.terms:
            for atom in mono:
                if atom[0] == "d":
                    out.add(atom[1])
                else:
                    out |= set().union(*(v.names() for v in atom[1:] if v.__class__ is Size))
        return out

    @property
    def name(self):
        """The dim's name when this Size is one named dim, else None."""
        t = self.terms
        return t[0][0][0][1] if len(t) == 1 and t[0][1] == 1 and len(t[0][0]) == 1 and t[0][0][0][0] == "d" else None

    def evaluate(self, env: dict) -> int:
        """The value at the bound sizes `env` ({name: int}); KeyError for a name not in it."""
        total = 0
        for mono, coef in self.terms:
            for atom in mono:
                coef *= _atom_value(atom, env)
            total += coef
        return total

    def source(self, var: dict) -> str:
        """Python source of the value, names read as `var[name]`."""
        parts = []
        for mono, coef in self.terms:
            parts.append("*".join([str(coef)] + [_atom_source(a, var) for a in mono]))
        return "(" + " + ".join(parts) + ")"

    def min(self, other):
        return size_min(self, other)

    def max(self, other):
        return size_max(self, other)

    # -- arithmetic
    def __add__(self, o):
        o = _coerce(o)
        return o if o is NotImplemented else _add(self, o)

    __radd__ = __add__

    def __sub__(self, o):
        o = _coerce(o)
        return o if o is NotImplemented else _add(self, o, -1)

    def __rsub__(self, o):
        o = _coerce(o)
        return o if o is NotImplemented else _add(o, self, -1)

    def __mul__(self, o):
        o = _coerce(o)
        return o if o is NotImplemented else _mul(self, o)

    __rmul__ = __mul__

    def __floordiv__(self, o):
        o = _coerce(o)
        return o if o is NotImplemented else floordiv(self, o)

    def __rfloordiv__(self, o):
        o = _coerce(o)
        return o if o is NotImplemented else floordiv(o, self)

    def __mod__(self, o):
        o = _coerce(o)
        return o if o is NotImplemented else mod(self, o)

    def __rmod__(self, o):
        o = _coerce(o)
        return o if o is NotImplemented else mod(o, self)

    def __neg__(self):
        return _mul(self, -1)

    def __pos__(self):
        return self

    def __pow__(self, e):
        if e.__class__ is int and e >= 0:
            out = 1
            for _ in range(e):
                out = _mul(out, self)
            return out
        return NotImplemented

    def __truediv__(self, o):
        if not isinstance(o, (int, float, Size, numbers.Number)):
            return NotImplemented       # a tensor: its reflected division makes n a runtime scalar
        raise _undecided(self, f"{self} / {o!r}", "divide a tensor by it instead (t / n is a runtime scalar)")

    def __rtruediv__(self, o):
        if not isinstance(o, (int, float, Size, numbers.Number)):
            return NotImplemented
        raise _undecided(self, f"{o!r} / {self}", "divide a tensor by it instead (t / n is a runtime scalar)")

    def __divmod__(self, o):
        return self // o, self % o

    # -- comparisons: decided when the bounds prove them
    def __eq__(self, o):
        o = _coerce(o) if not isinstance(o, float) else NotImplemented
        if o is NotImplemented:
            return NotImplemented
        got = decide_eq(self, o)
        if got is None:
            raise _undecided(self, f"{self} == {o}")
        return got

    def __ne__(self, o):
        got = self.__eq__(o)
        return got if got is NotImplemented else not got

    def _order(self, o, op, strict, flip):
        o = _coerce(o) if not isinstance(o, float) else NotImplemented
        if o is NotImplemented:
            return NotImplemented
        d = _add(o, self, -1) if flip else _add(self, o, -1)    # the claim: d < 0 (strict) or d <= 0
        lo, hi = lower(d), upper(d)
        if hi is not None and (hi < 0 or (not strict and hi <= 0)):
            return True
        if lo is not None and (lo > 0 or (strict and lo >= 0)):
            return False
        raise _undecided(self, f"{self} {op} {o}")

    def __lt__(self, o): return self._order(o, "<", True, False)
    def __le__(self, o): return self._order(o, "<=", False, False)
    def __gt__(self, o): return self._order(o, ">", True, True)
    def __ge__(self, o): return self._order(o, ">=", False, True)

    def __hash__(self):
        h = self._hash
        if h is None:
            h = self._hash = hash(("lc.Size", self.terms))
        return h

    # -- no Python value before the run
    def __bool__(self):
        got = decide_eq(self, 0)
        if got is None:
            raise _undecided(self, f"bool({self})")
        return not got

    def __index__(self):
        raise _undecided(self, f"{self} as an int (int(), range(), len(), an index)")

    def __int__(self):
        raise _undecided(self, f"int({self})")

    def __float__(self):
        raise _undecided(self, f"float({self})")

    def __complex__(self):
        raise _undecided(self, f"complex({self})")

    def __iter__(self):
        raise _undecided(self, f"iterating over {self}")

    def __repr__(self):
        out = ""
        for mono, coef in self.terms:
            body = "*".join(_atom_text(a) for a in mono)
            if not body:
                body = str(abs(coef))
            elif abs(coef) != 1:
                body = f"{abs(coef)}*{body}"
            if out:
                out += (" - " if coef < 0 else " + ") + body
            else:
                out = ("-" if coef < 0 else "") + body
        return out

    __str__ = __repr__

    def __format__(self, spec):
        return format(repr(self), spec)

    def __reduce__(self):
        return (_from_terms, (self.terms,))


def _from_terms(terms):
    return _norm(dict(terms))


def _undecided(s: Size, what: str, hint: str = "") -> SymbolicSizeError:
    names = ", ".join(repr(n) for n in sorted(s.names()) if not n.startswith("#")) or "a size class symbol"
    return SymbolicSizeError(f"{what}: the size depends on named dim(s) {names}, whose value is known only when "
                             f"the program runs; a graph cannot branch on it or compute it in Python"
                             + (f" ({hint})" if hint else ""))


def _operand_text(v) -> str:
    text = repr(v)
    return f"({text})" if v.__class__ is Size and (" " in text or len(v.terms) > 1) else text


def _atom_text(atom) -> str:
    kind = atom[0]
    if kind == "d":
        return atom[1]
    a, b = atom[1], atom[2]
    if kind in ("min", "max"):
        return f"{kind}({a!r}, {b!r})"
    return f"{_operand_text(a)}{'//' if kind == '//' else ' % '}{_operand_text(b)}"


def _value(v, env):
    return v.evaluate(env) if v.__class__ is Size else v


def _atom_value(atom, env):
    kind = atom[0]
    if kind == "d":
        return env[atom[1]]
    a, b = _value(atom[1], env), _value(atom[2], env)
    if kind == "//":
        return a // b
    if kind == "%":
        return a % b
    return min(a, b) if kind == "min" else max(a, b)


def _source(v, var) -> str:
    return v.source(var) if v.__class__ is Size else str(v)


def _atom_source(atom, var) -> str:
    kind = atom[0]
    if kind == "d":
        return var[atom[1]]
    a, b = _source(atom[1], var), _source(atom[2], var)
    if kind in ("min", "max"):
        return f"{kind}({a}, {b})"
    return f"({a} {kind} {b})"


def evaluate(x, env: dict):
    """Ints as they are, Sizes at `env`, tuples element by element."""
    if x.__class__ is Size:
        return x.evaluate(env)
    if x.__class__ is tuple:
        return tuple(evaluate(y, env) for y in x)
    return x


def has_size(x) -> bool:
    """Whether `x` (a size, or a tuple of them) holds a Size."""
    if x.__class__ is tuple:
        return any(d.__class__ is Size or (d.__class__ is tuple and has_size(d)) for d in x)
    return x.__class__ is Size
