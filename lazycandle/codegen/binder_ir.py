"""LLVM IR of a direct binder: the constant-folded straight-line function that turns a named-dim
program's sizes into its native words (runtime/native_direct.py), compiled once per size class
so a new size costs one native call instead of interpreted Python.

The folded function is Python of a small form -- assignments of int/float/bool expressions,
`if ...: return None` checks, the arena request, the setting check and the words written at the
end -- and Python's integer semantics are kept exactly or not at all: + - * and unary minus are
overflow-checked, // and % are floor division and modulo with a zero check, / is a checked
float division, and max/min/conditional expressions must agree on their operand types.  Any
overflow, zero divisor or failed check returns BAIL (every operand is evaluated: where Python
would have skipped one that fails, this bails too) (the caller runs the layered path, which
decides in Python); a form outside this set makes `build` return None (the Python function
stays).  The words are stored only after every check passed.

    i64 @bind(i64* args, i64* words)      args: [arena base, arena bytes, top, sizes...]
      -> OK (words written) | BAIL | GROW (args[2] = the arena bytes needed; call again)

`run_module` is the direct path's one native call around it (bind when the sizes are new, the
feed and output pointers, the status words, the program's segments):

    i64 @run(i64* args, i64* words) -> OK | BAIL | GROW (as bind's; nothing ran) | FAILED (a
      segment reported a bad id)"""
from __future__ import annotations

import ast

import llvmlite.ir as ir

from .llvmutil import I1, I64, F64
from .loops import new_module

OK, BAIL, GROW, FAILED = 0, 1, 2, 3
I64P = I64.as_pointer()
_INT_MAX = (1 << 63) - 1


def run_module(rebind_at: int, writes, status, n_segments: int, n_refs: int, scalars_at: int,
               threads_at: int) -> str:
    """IR text of `run`: when args[rebind_at] is non-zero, `bind(args, words)` first (returning
    its code unless OK); then words[pos] = args[a] + byte offset for each (pos, a, offset) of
    `writes` (feed, realized-input and output pointers), the `status` words zeroed ((args index
    of their address, count), or None), and the segments `seg0`.. called in order as
    seg(words, words + n_refs, args[scalars_at], args[threads_at]).  `bind` and the segments
    are external: the caller links them by address (jit.link_ir imports)."""
    m = new_module("lc_direct_run")
    i8p = ir.IntType(8).as_pointer()
    bind = ir.Function(m, ir.FunctionType(I64, [I64P, I64P]), "bind")
    seg_ty = ir.FunctionType(I64, [i8p, i8p, i8p, I64])
    segs = [ir.Function(m, seg_ty, f"seg{i}") for i in range(n_segments)]
    fn = ir.Function(m, ir.FunctionType(I64, [I64P, I64P]), "run")
    args, words = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def arg(k):
        return b.load(b.gep(args, [I64(k)]))

    rebind, write = fn.append_basic_block("rebind"), fn.append_basic_block("write")
    b.cbranch(b.icmp_signed("!=", arg(rebind_at), I64(0)), rebind, write)
    b.position_at_end(rebind)
    rc = b.call(bind, [args, words])
    failed = fn.append_basic_block("bind.failed")
    b.cbranch(b.icmp_signed("!=", rc, I64(OK)), failed, write)
    ir.IRBuilder(failed).ret(rc)
    b.position_at_end(write)
    for pos, a, off in writes:
        b.store(b.add(arg(a), I64(off)), b.gep(words, [I64(pos)]))
    if status is not None:
        at, count = status
        base = b.inttoptr(arg(at), I64P)
        for c in range(count):
            b.store(I64(0), b.gep(base, [I64(c)]))
    w8, sizes8 = b.bitcast(words, i8p), b.bitcast(b.gep(words, [I64(n_refs)]), i8p)
    sc, threads = b.inttoptr(arg(scalars_at), i8p), arg(threads_at)
    for seg in segs:
        ok = fn.append_basic_block("ran")
        bad = fn.append_basic_block("bad.id")
        b.cbranch(b.icmp_signed("!=", b.call(seg, [w8, sizes8, sc, threads]), I64(0)), bad, ok)
        ir.IRBuilder(bad).ret(I64(FAILED))
        b.position_at_end(ok)
    b.ret(I64(OK))
    return str(m)


class Unsupported(Exception):
    """A form the binder does not compile (the Python function runs instead)."""


def build(statements, words: dict) -> str | None:
    """IR text of the folded function body `statements` (reading `sizes[i]`; `x =
    arena_at_least(top)` and `base = x[1]` for the arena), storing `words` (word position ->
    expression node) at the end.  None when a form is not one this module compiles."""
    try:
        return _Builder().function(statements, words)
    except Unsupported:
        return None


class _Builder:
    def __init__(self):
        self.arena_var = None
        self.m = new_module("lc_direct_binder")
        self.fn = ir.Function(self.m, ir.FunctionType(I64, [I64P, I64P]), "bind")
        args, self.words = self.fn.args
        self.b = b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.base, self.arena_bytes = (b.load(b.gep(args, [I64(k)])) for k in (0, 1))
        self.top, self.sizes = b.gep(args, [I64(2)]), b.gep(args, [I64(3)])
        bail = self.fn.append_basic_block("bail")
        ir.IRBuilder(bail).ret(I64(BAIL))
        self.bail = bail
        self.env = {}

    def function(self, statements, words):
        for stmt in statements:
            self.statement(stmt)
        b = self.b
        values = []
        for pos, e in sorted(words.items()):
            v = self.number(self.expr(e))
            if v.type != I64:
                raise Unsupported("a float word")
            values.append((pos, v))
        for pos, v in values:
            b.store(v, b.gep(self.words, [I64(pos)]))
        b.ret(I64(OK))
        return str(self.m)

    # ---- statements ---------------------------------------------------------------------
    def statement(self, s):
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            name, v = s.targets[0].id, s.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "arena_at_least":
                self.arena(v)
                self.arena_var = name
                self.env[name] = "arena"
            elif isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name) and v.value.id == self.arena_var \
                    and isinstance(v.slice, ast.Constant) and v.slice.value == 1:
                self.env[name] = self.base
            else:
                self.env[name] = self.expr(v)
        elif isinstance(s, ast.If) and not s.orelse and len(s.body) == 1 and _returns_none(s.body[0]):
            self.check(self.truth(self.expr(s.test)))
        elif isinstance(s, ast.Return):
            return                          # the caller knows what the Python function returns
        else:
            raise Unsupported(ast.dump(s))

    def arena(self, call):
        """`arena = arena_at_least(top)`: GROW (with *top) when the arena passed is smaller."""
        if len(call.args) != 1:
            raise Unsupported("arena_at_least")
        top = self.expr(call.args[0])
        b = self.b
        grow = self.fn.append_basic_block("grow")
        cont = self.fn.append_basic_block("arena.ok")
        b.cbranch(b.icmp_signed(">", top, self.arena_bytes), grow, cont)
        g = ir.IRBuilder(grow)
        g.store(top, self.top)
        g.ret(I64(GROW))
        b.position_at_end(cont)

    def check(self, failed):
        """Continue when `failed` is false, else BAIL."""
        cont = self.fn.append_basic_block("ok")
        self.b.cbranch(failed, self.bail, cont)
        self.b.position_at_end(cont)

    # ---- expressions --------------------------------------------------------------------
    def expr(self, e):
        b = self.b
        if isinstance(e, ast.Constant):
            v = e.value
            if isinstance(v, bool):
                return ir.Constant(I1, int(v))
            if isinstance(v, int):
                if not -_INT_MAX - 1 <= v <= _INT_MAX:
                    raise Unsupported("a constant beyond i64")
                return I64(v)
            if isinstance(v, float):
                return ir.Constant(F64, v)
            raise Unsupported(repr(v))
        if isinstance(e, ast.Name):
            v = self.env.get(e.id)
            if v is None or isinstance(v, str):
                raise Unsupported(e.id)
            return v
        if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name) and e.value.id == "sizes" \
                and isinstance(e.slice, ast.Constant) and isinstance(e.slice.value, int):
            return b.load(b.gep(self.sizes, [I64(e.slice.value)]))
        if isinstance(e, ast.UnaryOp):
            x = self.expr(e.operand)
            if isinstance(e.op, ast.USub):
                return self.arith(ast.Sub(), self.zero_like(x), x)
            if isinstance(e.op, ast.Not):
                return b.not_(self.truth(x))
            if isinstance(e.op, ast.UAdd):
                return x
            raise Unsupported("unary op")
        if isinstance(e, ast.BinOp):
            return self.arith(e.op, self.expr(e.left), self.expr(e.right))
        if isinstance(e, ast.Compare):
            return self.compare(e)
        if isinstance(e, ast.BoolOp):        # Python's value: `a or b` is a if a else b
            vals = [self.expr(v) for v in e.values]
            if any(v.type != vals[0].type for v in vals):
                vals = [self.number(v) for v in vals]
                if any(v.type != I64 for v in vals):
                    raise Unsupported("and/or of mixed types")
            out = vals[-1]
            for v in reversed(vals[:-1]):
                t = self.truth(v)
                out = b.select(t, v, out) if isinstance(e.op, ast.Or) else b.select(t, out, v)
            return out
        if isinstance(e, ast.IfExp):
            c, x, y = self.truth(self.expr(e.test)), self.expr(e.body), self.expr(e.orelse)
            if x.type != y.type:
                raise Unsupported("a conditional of mixed types")
            return b.select(c, x, y)
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id in ("max", "min") \
                and len(e.args) >= 2 and not e.keywords:
            vals = [self.expr(a) for a in e.args]
            if any(v.type != vals[0].type for v in vals) or vals[0].type == I1:
                raise Unsupported("max/min of mixed types")
            out = vals[0]
            for v in vals[1:]:
                if v.type == F64:       # Python's max keeps the first of equals; NaN never reaches here
                    pick = b.fcmp_ordered(">" if e.func.id == "max" else "<", v, out)
                else:
                    pick = b.icmp_signed(">" if e.func.id == "max" else "<", v, out)
                out = b.select(pick, v, out)
            return out
        raise Unsupported(ast.dump(e))

    def zero_like(self, x):
        return ir.Constant(F64, 0.0) if x.type == F64 else I64(0)

    def truth(self, x):
        if x.type == I1:
            return x
        if x.type == F64:
            return self.b.fcmp_unordered("!=", x, ir.Constant(F64, 0.0))
        return self.b.icmp_signed("!=", x, I64(0))

    def number(self, x):
        return self.b.zext(x, I64) if x.type == I1 else x

    def arith(self, op, x, y):
        b = self.b
        x, y = self.number(x), self.number(y)
        if isinstance(op, ast.Div) or F64 in (x.type, y.type):
            if isinstance(op, (ast.FloorDiv, ast.Mod, ast.BitAnd, ast.BitOr)):
                raise Unsupported("a float floor division or bit op")
            x, y = (v if v.type == F64 else b.sitofp(v, F64) for v in (x, y))
            if isinstance(op, ast.Div):
                self.check(b.fcmp_ordered("==", y, ir.Constant(F64, 0.0)))
                return b.fdiv(x, y)
            fop = {ast.Add: b.fadd, ast.Sub: b.fsub, ast.Mult: b.fmul}.get(type(op))
            if fop is None:
                raise Unsupported("float op")
            return fop(x, y)
        if isinstance(op, (ast.Add, ast.Sub, ast.Mult)):
            name = {ast.Add: "sadd", ast.Sub: "ssub", ast.Mult: "smul"}[type(op)]
            ty = ir.LiteralStructType([I64, I1])
            f = self.m.globals.get(f"llvm.{name}.with.overflow.i64") or ir.Function(
                self.m, ir.FunctionType(ty, [I64, I64]), f"llvm.{name}.with.overflow.i64")
            r = b.call(f, [x, y])
            self.check(b.extract_value(r, 1))
            return b.extract_value(r, 0)
        if isinstance(op, (ast.FloorDiv, ast.Mod)):
            self.check(b.icmp_signed("==", y, I64(0)))
            minus_one = b.icmp_signed("==", y, I64(-1))
            if isinstance(op, ast.FloorDiv):
                self.check(b.and_(b.icmp_signed("==", x, I64(-_INT_MAX - 1)), minus_one))
            # x % -1 is 0 for every x, and srem(INT_MIN, -1) traps: take it modulo 1 instead
            r = b.srem(x, b.select(minus_one, I64(1), y))
            # floor semantics: a non-zero remainder of the other sign than y moves q down, r up by y
            adjust = b.and_(b.icmp_signed("!=", r, I64(0)),
                            b.icmp_signed("!=", b.icmp_signed("<", r, I64(0)), b.icmp_signed("<", y, I64(0))))
            if isinstance(op, ast.FloorDiv):
                return b.sub(b.sdiv(x, y), b.zext(adjust, I64))
            return b.select(adjust, b.add(r, y), r)
        if isinstance(op, ast.BitAnd):
            return b.and_(x, y)
        if isinstance(op, ast.BitOr):
            return b.or_(x, y)
        raise Unsupported("int op")

    def compare(self, e):
        b = self.b
        ops = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
        left = self.expr(e.left)
        out = None
        for op, right_node in zip(e.ops, e.comparators):
            sym = ops.get(type(op))
            if sym is None:
                raise Unsupported("comparison")
            right = self.expr(right_node)
            x, y = self.number(left), self.number(right)
            if F64 in (x.type, y.type):
                x, y = (v if v.type == F64 else b.sitofp(v, F64) for v in (x, y))
                c = b.fcmp_unordered(sym, x, y) if sym == "!=" else b.fcmp_ordered(sym, x, y)
            else:
                c = b.icmp_signed(sym, x, y)
            out = c if out is None else b.and_(out, c)
            left = right
        return out


def _returns_none(s) -> bool:
    return isinstance(s, ast.Return) and isinstance(s.value, ast.Constant) and s.value.value is None
