"""Constant folding of a generated straight-line function (the direct path, native_direct.py).

The direct path's source is written by several generators that know nothing of each other's
values: a size class symbol that is a constant (64), a stride of 1, a matmul's fixed k all reach
the matmul sizes and the words block as names.  `fold` evaluates, once, every expression whose
names are all known -- literals, the `constants` given, and calls of the `pure` functions on
them -- substitutes the values, splits tuple and list displays into their elements (so
`s0 = (m0, n0, 64)` becomes per element, constant ones folded), drops the assignments no
later statement reads and the checks that always pass.  What is left computes only what
depends on the sizes.  Only straight-line code is handled: assignments, `if ...: return
None` checks and one final return, as the generators write them."""
from __future__ import annotations

import ast

_FOLDABLE = (int, float, bool, tuple, type(None))


def fold(source: str, pure: dict, constants: dict) -> ast.FunctionDef:
    """The function defined by `source` with its constant parts evaluated (as an AST)."""
    fn = ast.parse(source).body[0]
    folder = _Folder(pure, constants)
    body = []
    for stmt in fn.body:
        body.extend(folder.statement(stmt))
    fn.body = _drop_unread(body, set(pure))
    return ast.fix_missing_locations(fn)


def literal(node):
    """(True, value) when `node` is a constant, else (False, None)."""
    return (True, node.value) if isinstance(node, ast.Constant) else (False, None)


class _Folder(ast.NodeTransformer):
    def __init__(self, pure, constants):
        self.pure = pure
        self.env = {k: ast.Constant(v) for k, v in constants.items()}   # name -> Constant | Name | Tuple
        self.fresh = 0
        self.checks = set()         # the checks written so far (ast.dump of their tests)
        self.lower = {}             # name -> a lower bound the checks so far prove
        self.values = {}            # ast.dump of a value assigned -> the name holding it

    # ---- expressions ----------------------------------------------------------------
    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and node.id in self.env:
            return _copy(self.env[node.id])
        return node

    def visit_Subscript(self, node):
        node = self.generic_visit(node)
        if isinstance(node.value, (ast.Tuple, ast.List)) and isinstance(node.slice, ast.Constant):
            at, elts = node.slice.value, node.value.elts
            if isinstance(at, int) and -len(elts) <= at < len(elts):
                return elts[at]
        return self._evaluated(node)

    def _display(self, node):
        node = self.generic_visit(node)
        elts = []
        for e in node.elts:          # *(a, b) inside a display: its elements
            if isinstance(e, ast.Starred) and isinstance(e.value, (ast.Tuple, ast.List)):
                elts.extend(e.value.elts)
            elif isinstance(e, ast.Starred) and isinstance(e.value, ast.Constant) and isinstance(e.value.value, tuple):
                elts.extend(ast.Constant(v) for v in e.value.value)
            else:
                elts.append(e)
        node.elts = elts
        return self._evaluated(node) if isinstance(node, ast.Tuple) else node

    visit_Tuple = visit_List = _display

    def generic_expr(self, node):
        return self._evaluated(self.generic_visit(node))

    def visit_Compare(self, node):
        """Also a comparison of a name with a constant its lower bound decides."""
        node = self._evaluated(self.generic_visit(node))
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            low, (known, c) = self._lower(node.left), literal(node.comparators[0])
            if low is not None and known and type(c) is int:
                op = node.ops[0]
                if isinstance(op, (ast.Eq, ast.Lt)) and c < low + isinstance(op, ast.Lt):
                    return ast.Constant(False)
                if isinstance(op, ast.NotEq) and c < low or isinstance(op, ast.GtE) and c <= low \
                        or isinstance(op, ast.Gt) and c < low:
                    return ast.Constant(True)
        return node

    def visit_Call(self, node):
        """Also max(x, c) -> x where x's lower bound is at least the constant c."""
        node = self._evaluated(self.generic_visit(node))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "max" \
                and len(node.args) == 2 and not node.keywords:
            for x, y in (node.args, node.args[::-1]):
                known, c = literal(y)
                low = self._lower(x)
                if known and type(c) is int and low is not None and low >= c:
                    return x
        return node

    def _lower(self, node):
        """A lower bound of int expression `node` from the checks so far, or None."""
        known, value = literal(node)
        if known:
            return value if type(value) is int else None
        if isinstance(node, ast.Name):
            return self.lower.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            a, b = self._lower(node.left), self._lower(node.right)
            if a is None or b is None or isinstance(node.op, ast.Mult) and (a < 0 or b < 0):
                return None
            return a + b if isinstance(node.op, ast.Add) else a * b
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "max":
            lows = [x for x in map(self._lower, node.args) if x is not None]
            return max(lows) if lows else None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.BinOp) \
                and isinstance(node.operand.op, ast.FloorDiv) and isinstance(node.operand.left, ast.UnaryOp) \
                and isinstance(node.operand.left.op, ast.USub):           # -(-a // k): a / k rounded up
            a, (known, k) = self._lower(node.operand.left.operand), literal(node.operand.right)
            return -(-a // k) if a is not None and known and type(k) is int and k > 0 else None
        return None

    def _test(self, node):
        """`node` as a condition (_truth), a name whose lower bound is positive decided."""
        node = _truth(node)
        if isinstance(node, ast.Name) and (self.lower.get(node.id) or 0) > 0:
            return ast.Constant(True)
        return node

    def visit_BinOp(self, node):
        """Also x * 1, 1 * x, x + 0, 0 + x, x - 0 -> x (the generators write them for unit
        coefficients and zero offsets)."""
        node = self._evaluated(self.generic_visit(node))
        if not isinstance(node, ast.BinOp):
            return node
        left, right = literal(node.left), literal(node.right)
        unit = 1 if isinstance(node.op, ast.Mult) else 0 if isinstance(node.op, (ast.Add, ast.Sub)) else None
        if unit is None:
            return node
        if right[0] and right[1] == unit and type(right[1]) is int:
            return node.left
        if left[0] and left[1] == unit and type(left[1]) is int and not isinstance(node.op, ast.Sub):
            return node.right
        return node

    def visit_IfExp(self, node):
        node = self.generic_visit(node)
        node.test = self._test(node.test)
        known, value = literal(node.test)
        if known:
            return node.body if value else node.orelse
        if isinstance(node.body, ast.Constant) and isinstance(node.orelse, ast.Constant) \
                and node.body.value == node.orelse.value and type(node.body.value) is type(node.orelse.value):
            return node.body            # both branches the same constant (tests here have no side effects)
        return node

    def visit_UnaryOp(self, node):
        node = self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = _truth(node.operand)
        return self._evaluated(node)

    def visit_BoolOp(self, node):
        return self._evaluated(self.generic_visit(node))

    def _evaluated(self, node):
        """`node` as a Constant when every name in it is a pure function and it evaluates."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id not in self.pure or isinstance(sub, (ast.Starred, ast.List)):
                return node
        try:
            value = eval(compile(ast.fix_missing_locations(ast.Expression(node)), "<fold>", "eval"),
                         {"__builtins__": {}}, dict(self.pure))
        except Exception:           # left to run (and raise) as written
            return node
        return ast.Constant(value) if isinstance(value, _FOLDABLE) and _plain(value) else node

    # ---- statements -----------------------------------------------------------------
    def statement(self, stmt) -> list:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], self.visit(stmt.value)
            if isinstance(target, ast.Name):
                return self._bind(target.id, value)
            if isinstance(value, ast.Constant) and type(value.value) is tuple:     # a display folded whole
                value = ast.Tuple([ast.Constant(v) for v in value.value], ast.Load())
            if isinstance(target, ast.Tuple) and isinstance(value, (ast.Tuple, ast.List)) \
                    and len(value.elts) == len(target.elts) and all(isinstance(t, ast.Name) for t in target.elts):
                return [s for t, v in zip(target.elts, value.elts) for s in self._bind(t.id, v)]
            for t in ast.walk(target):           # assigned by unpacking a value: no longer known
                if isinstance(t, ast.Name):
                    self.env.pop(t.id, None)
            stmt.value = value
            return [stmt]
        if isinstance(stmt, ast.If) and not stmt.orelse:
            stmt.test = self._test(self.visit(stmt.test))
            known, value = literal(stmt.test)
            seen = ast.dump(stmt.test)
            if known and not value or seen in self.checks:
                return []               # a check that always passes, or one made before
            self.checks.add(seen)       # (every name is assigned once: the same test, the same outcome)
            test = stmt.test            # `if x < c: return None`: x >= c from here on
            if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Lt) \
                    and isinstance(test.left, ast.Name) and literal(test.comparators[0])[0] \
                    and type(test.comparators[0].value) is int and _returns_none(stmt.body):
                c = test.comparators[0].value
                self.lower[test.left.id] = max(self.lower.get(test.left.id, c), c)
            return [stmt]
        return [self.visit(stmt)]

    def _bind(self, name, value) -> list:
        if isinstance(value, (ast.Constant, ast.Name)):
            self.env[name] = value
            return []
        if isinstance(value, (ast.Tuple, ast.List)):
            out, elts = [], []
            for e in value.elts:
                if isinstance(e, (ast.Constant, ast.Name)):
                    elts.append(e)
                else:
                    self.fresh += 1
                    part = f"_{name}_{self.fresh}"
                    out += self._bind(part, e)
                    elts.append(self.env.get(part, ast.Name(part, ast.Load())))
            self.env[name] = ast.Tuple(elts, ast.Load())
            return out
        key = ast.dump(value)
        if key in self.values and not _calls_outside(value, self.pure):
            self.env[name] = ast.Name(self.values[key], ast.Load())     # the same value computed before
            return []
        self.env.pop(name, None)
        self.values[key] = name
        low = self._lower(value)
        if low is not None:
            self.lower[name] = low
        return [ast.Assign([ast.Name(name, ast.Store())], value)]


def _returns_none(body) -> bool:
    return len(body) == 1 and isinstance(body[0], ast.Return) and \
        (body[0].value is None or isinstance(body[0].value, ast.Constant) and body[0].value.value is None)


def _calls_outside(node, pure) -> bool:
    """Whether `node` calls anything but the pure functions (its value may change per call)."""
    return any(isinstance(c, ast.Call) and not (isinstance(c.func, ast.Name) and c.func.id in pure)
               for c in ast.walk(node))


def _truth(node):
    """`node` as a condition: constant operands of `and` / `or` and of `not` decided."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _truth(node.operand)
        known, value = literal(inner)
        return ast.Constant(not value) if known else ast.UnaryOp(ast.Not(), inner)
    if not isinstance(node, ast.BoolOp):
        return node
    is_and = isinstance(node.op, ast.And)
    kept = []
    for v in (_truth(v) for v in node.values):
        known, value = literal(v)
        if not known:
            kept.append(v)
        elif bool(value) != is_and:
            return ast.Constant(not is_and)       # a false operand of `and`, a true one of `or`
    if not kept:
        return ast.Constant(is_and)
    return kept[0] if len(kept) == 1 else ast.BoolOp(node.op, kept)


def _plain(value) -> bool:
    return not isinstance(value, tuple) or all(isinstance(v, (int, float, bool)) for v in value)


def _copy(node):
    return ast.parse(ast.unparse(node), mode="eval").body if not isinstance(node, (ast.Constant, ast.Name)) \
        else (ast.Constant(node.value) if isinstance(node, ast.Constant) else ast.Name(node.id, ast.Load()))


def _drop_unread(body, pure) -> list:
    """The statements without the assignments of pure values nothing after them reads."""
    read, out = set(), []
    for stmt in reversed(body):
        if isinstance(stmt, ast.Assign):
            names = {t.id for t in ast.walk(stmt.targets[0]) if isinstance(t, ast.Name)}
            if not names & read and not _calls_outside(stmt.value, pure):
                continue
        read |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        out.append(stmt)
    return out[::-1]
