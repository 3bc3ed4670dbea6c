"""The compiled direct binder (codegen/binder_ir.py): Python's integer semantics exactly or a
bail -- floor division and modulo of negative operands, overflow beyond i64, zero divisors,
`and`/`or` values, chained comparisons, max/min, conditional expressions -- the arena
request protocol, and forms it does not compile (None: the Python function stays)."""
import ast
import ctypes

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from lazycandle.codegen import binder_ir, jit

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1

EXPRESSIONS = [
    "a // b", "a % b", "-(-a // b)", "-(--(-a // 16) // 6) * 6", "a * b", "a + b", "a - b", "-a",
    "max(a, b, 3)", "min(a, b)", "a or 1", "a and b", "(a or 1) * 2", "1 if a < b <= 7 else 2",
    "a * 4 + 63 & -64", "a | b", "1099511627776 if 2.0 * a * 64 / max(b, 1) >= 65536.0 and a > 1 else 1",
    "max(1, -(-a // b))", "a == b", "a != b",
]


def _compile(source: str):
    """(native call(a, b) -> (rc, word), python function) of `def f(sizes): ... x = ...`."""
    fn = ast.parse(source).body[0]
    statements, ret = fn.body[:-1], fn.body[-1]
    text = binder_ir.build(statements, {0: ret.value})
    assert text is not None, source
    module = jit.link_ir(text, ["bind"])
    native = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)(module.address("bind"))
    scope = {"max": max, "min": min}
    exec(compile(source, "<test>", "exec"), scope)

    def call(a, b, base=0, nbytes=1 << 20):
        args = np.array([base, nbytes, 0, a, b], np.int64)
        words = np.zeros(1, np.int64)
        rc = native(args.ctypes.data, words.ctypes.data)
        return rc, int(words[0]), int(args[2])
    call.module = module
    return call, scope["f"]


def _python(f, a, b):
    """What the compiled form must give: the word, or BAIL where Python fails, returns None or
    leaves i64."""
    try:
        v = f((a, b))
    except ZeroDivisionError:
        return binder_ir.BAIL, None
    if v is None:
        return binder_ir.BAIL, None
    v = int(v)
    if not I64_MIN <= v <= I64_MAX:
        return binder_ir.BAIL, None
    return binder_ir.OK, v


_COMPILED = {}


def _compiled(expr):
    if expr not in _COMPILED:
        _COMPILED[expr] = _compile(f"def f(sizes):\n    a = sizes[0]\n    b = sizes[1]\n    return {expr}\n")
    return _COMPILED[expr]


_ints = st.one_of(st.integers(-70, 70), st.integers(I64_MIN, I64_MAX),
                  st.sampled_from([0, 1, -1, I64_MIN, I64_MAX, 1 << 31, 1 << 32, (1 << 62) + 1]))


@pytest.mark.parametrize("expr", EXPRESSIONS)
@settings(max_examples=60, deadline=None)
@given(a=_ints, b=_ints)
@example(a=I64_MIN, b=-1)       # srem(INT_MIN, -1) traps in the CPU; Python's INT_MIN % -1 is 0
def test_compiled_expression_is_python_or_bails(expr, a, b):
    call, f = _compiled(expr)
    rc, word, _ = call(a, b)
    want_rc, want = _python(f, a, b)
    if want_rc == binder_ir.BAIL:
        assert rc == binder_ir.BAIL, (expr, a, b, word)
    else:
        # the compiled form may bail where an intermediate leaves i64 and Python's result is back in range
        assert rc in (binder_ir.OK, binder_ir.BAIL), (expr, a, b)
        if rc == binder_ir.OK:
            assert word == want, (expr, a, b)
        else:
            assert _leaves_i64_on_the_way(expr, a, b), (expr, a, b)


def _leaves_i64_on_the_way(expr, a, b) -> bool:
    """Whether some sub-expression of `expr` is outside i64 or fails at (a, b) in Python."""
    tree = ast.parse(expr, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Call, ast.IfExp, ast.BoolOp)):
            try:
                v = eval(compile(ast.Expression(node), "<sub>", "eval"), {"max": max, "min": min, "a": a, "b": b})
            except ZeroDivisionError:
                return True
            if isinstance(v, int) and not I64_MIN <= v <= I64_MAX:
                return True
    return False


def test_small_operands_never_bail_where_python_succeeds():
    """Sizes as the binder meets them: every expression agrees exactly, no spurious bail."""
    for expr in EXPRESSIONS:
        call, f = _compiled(expr)
        for a in range(-20, 21):
            for b in range(-20, 21):
                want_rc, want = _python(f, a, b)
                rc, word, _ = call(a, b)
                assert rc == want_rc, (expr, a, b)
                if rc == binder_ir.OK:
                    assert word == want, (expr, a, b)


def test_a_failed_check_bails_before_any_word_is_written():
    call, _ = _compile("def f(sizes):\n    a = sizes[0]\n    b = sizes[1]\n    if a < 2:\n        return None\n"
                       "    if a == b:\n        return None\n    return a * b\n")
    assert call(5, 3)[:2] == (binder_ir.OK, 15)
    assert call(1, 3)[0] == binder_ir.BAIL
    assert call(4, 4)[0] == binder_ir.BAIL


def test_the_arena_request_grows_then_binds_with_the_base():
    call, _ = _compile("def f(sizes):\n    a = sizes[0]\n    b = sizes[1]\n    top = a * 64\n"
                       "    arena = arena_at_least(top)\n    base = arena[1]\n    return base + b\n")
    rc, _, top = call(10, 3, base=4096, nbytes=100)
    assert (rc, top) == (binder_ir.GROW, 640)
    assert call(10, 3, base=4096, nbytes=640)[:2] == (binder_ir.OK, 4099)


@pytest.mark.parametrize("body", ["return foo(a)", "return a ** 2", "return a / 2", "return a if b else 1.5",
                                  "return max(a, 1.5)", "return a << 2", "return (a, b)"])
def test_forms_outside_the_set_are_not_compiled(body):
    fn = ast.parse(f"def f(sizes):\n    a = sizes[0]\n    b = sizes[1]\n    {body}\n").body[0]
    assert binder_ir.build(fn.body[:-1], {0: fn.body[-1].value}) is None


_SEGMENT_IR = """
define i64 @seg0(i8* %words, i8* %sizes, i8* %scalars, i64 %threads) {
  %w = bitcast i8* %words to i64*
  %p = load i64, i64* %w
  %q = getelementptr i64, i64* %w, i64 1
  %ptr = load i64, i64* %q
  %sum = add i64 %ptr, %threads
  %out = getelementptr i64, i64* %w, i64 6
  store i64 %sum, i64* %out
  %rcp = bitcast i8* %scalars to i64*
  %rc = load i64, i64* %rcp
  ret i64 %rc
}
"""


def test_run_module_binds_when_asked_writes_the_pointers_zeroes_the_status_and_runs_the_segments():
    """binder_ir.run_module, the direct path's one native call, on a bind of one word and a
    segment that records a pointer word and returns the code it is handed: bind only with
    the rebind flag, nothing written or run when bind bails, FAILED when a segment fails."""
    fn = ast.parse("def f(sizes):\n    if sizes[0] < 0:\n        return None\n    return sizes[0] * 2\n").body[0]
    bind = jit.link_ir(binder_ir.build(fn.body[:-1], {0: fn.body[-1].value}), ["bind"])
    seg = jit.link_ir(_SEGMENT_IR, ["seg0"])
    # args: [arena base, arena bytes, top, size, rebind, pointer, scalars, threads, status address]
    text = binder_ir.run_module(4, [(1, 5, 16)], (8, 3), 1, 2, 6, 7)
    run = jit.link_ir(text, ["run"], imports={"bind": bind.address("bind"), "seg0": seg.address("seg0")})
    native = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)(run.address("run"))
    status, seg_rc = np.full(3, 7, np.int64), np.zeros(1, np.int64)

    def call(size, rebind, words):
        args = np.array([0, 1 << 20, 0, size, rebind, 1000, seg_rc.ctypes.data, 2, status.ctypes.data], np.int64)
        status[:] = 7
        return native(args.ctypes.data, words.ctypes.data)

    words = np.full(8, -1, np.int64)
    assert call(21, 1, words) == binder_ir.OK
    assert words[0] == 42 and words[1] == 1016 and words[6] == 1018 and not status.any()
    assert call(5, 0, words) == binder_ir.OK and words[0] == 42          # no rebind: the bound word stays
    words[:] = -1
    assert call(-3, 1, words) == binder_ir.BAIL
    assert (words == -1).all() and (status == 7).all()                      # nothing written, nothing ran
    seg_rc[0] = 9
    assert call(4, 1, words) == binder_ir.FAILED and words[0] == 8
