"""The direct path of a named-dim program (runtime/native_direct.py, issue 9): a new size of a
size class that runs natively is one generated, constant-folded function writing the native
words, then the native call.  It must give what the per-kernel path gives, bit for bit, keep
every check the layered binding makes (view bounds, the class conditions, the small-m
matmul's bucket edges, bad ids) by falling back to it, stay right under threads, and be
cleared by lc.clear_caches()."""
import ast
import os

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.layout import Layout
from lazycandle.runtime import fold
from lazycandle.runtime import matmul as MM, matmul_skinny as SK

from conftest import run_in_threads, run_probe

from decode_cases import D, decode_program as _decode_program, decode_feeds as _feeds


def _warm(prog, feeds_of, sizes):
    """Run `prog` natively at `sizes` until the direct path of their class is derived."""
    for s in sizes:
        for _ in range(2):
            prog.run(**feeds_of(s))
    assert prog._traced.direct, "no direct path was derived"


def _direct_ran(prog, sizes) -> bool:
    return any(r.bound_sizes() == sizes for r in prog._traced.direct)


def test_direct_path_is_bit_identical_to_the_per_kernel_path_across_sizes(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog = _decode_program()
    _warm(prog, lambda L: _feeds(3, L), (5, 6))
    direct = 0
    for m in (3, 1, 2, 15, 16, 17):             # the small-m rule's 16 / 17 edge: another class or bucket
        for L in (0, 1, 2, 3, 7, 31, 33, 63, 65, 127, 129, 300, 3):
            if L == 0:
                continue                          # softmax over L = 0 is an EmptyReduction (its max)
            f = _feeds(m, L)
            monkeypatch.setenv("LAZYCANDLE_EXEC", "python")
            slow = prog.run(**f)[0]
            monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
            fast = prog.run(**f)[0]
            direct += _direct_ran(prog, {"m": m, "L": L})
            assert fast.shape == slow.shape == (m, D)
            assert np.array_equal(fast, slow), (m, L)
    assert direct >= 9          # m = 3 at every L but 1


def test_a_named_size_equal_to_a_fixed_size_binds_by_formula(monkeypatch):
    """A length equal to the head dim (L = D) or to the rows (L = m) is in the class the
    program was derived for: the plan was scheduled over distinct symbols, so the direct path
    binds it, nothing is rebuilt, and it is bit-identical to the per-kernel path."""
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog = _decode_program()
    _warm(prog, lambda L: _feeds(3, L), (5, 6))
    for m in (7, 5):        # each row count's small-m kernel class (by the host's vector width) once
        prog.run(**_feeds(m, 40 + m))
    bound = len(prog._bound)
    for m, L in ((3, D), (3, 3), (7, 7), (5, 5)):
        f = _feeds(m, L)
        fast = prog.run(**f)[0]
        assert _direct_ran(prog, {"m": m, "L": L}), (m, L)
        monkeypatch.setenv("LAZYCANDLE_EXEC", "python")
        slow = prog.run(**f)[0]
        monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
        assert np.array_equal(fast, slow), (m, L)
    assert len(prog._bound) == bound + 4        # (the per-kernel runs bind through the traced binder)


def test_a_size_of_zero_and_one_fall_back_and_still_match(monkeypatch):
    x = lc.placeholder("x", ("n", 3), lc.f32)
    prog = lc.compile([x.sum(0), x * 2.0 + 1.0])
    _warm(prog, lambda n: {"x": np.ones((n, 3), np.float32) * n}, (4, 5))
    for n in (0, 1, 2, 7, 0, 9):
        xs = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        s, d = prog(x=xs)
        np.testing.assert_array_equal(s, xs.sum(0))
        np.testing.assert_array_equal(d, xs * 2.0 + 1.0)
        assert _direct_ran(prog, {"n": n}) == (n >= 2)


def test_a_view_out_of_range_at_a_new_size_still_raises_the_ops_error():
    x = lc.placeholder("x", ("n", 4), lc.f32)
    prog = lc.compile([x.narrow(0, 2, 3) * 3.0])
    _warm(prog, lambda n: {"x": np.ones((n, 4), np.float32)}, (6, 7))
    np.testing.assert_array_equal(prog(x=np.ones((9, 4), np.float32))[0], np.full((3, 4), 3.0, np.float32))
    assert _direct_ran(prog, {"n": 9})
    with pytest.raises(lc.NarrowInvalidArgs, match="narrow"):
        prog(x=np.zeros((4, 4), np.float32))


def test_index_out_of_bounds_is_raised_by_the_direct_path_at_new_sizes():
    t = lc.placeholder("t", ("n", 8), lc.f32)
    ids = lc.placeholder("ids", (4,), lc.i64)
    prog = lc.compile((t * 2.0).index_select(ids, 0).sum(-1))
    _warm(prog, lambda n: {"t": np.ones((n, 8), np.float32), "ids": np.array([0, 1, 2, 1])}, (5, 6))
    for n in (7, 9, 20, 41):
        tv = np.ones((n, 8), np.float32)
        np.testing.assert_array_equal(prog.run(t=tv, ids=np.array([0, 1, 2, n - 1]))[0], np.full(4, 16.0))
        assert _direct_ran(prog, {"n": n})
        with pytest.raises(lc.IndexOutOfBounds):
            prog.run(t=tv, ids=np.array([0, n, 1, 2]))


def test_feeds_disagreeing_on_a_named_dim_raise_feed_error_naming_both_after_the_direct_path(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog = _decode_program(rows=1)
    _warm(prog, lambda L: _feeds(1, L), (5, 6))
    f = _feeds(1, 7)
    f["v"] = np.zeros((8, D), np.float32)
    with pytest.raises(lc.FeedError, match=r"'L' is 7 in input 'k' \(shape \(7, 64\)\) but 8 in input 'v'"):
        prog.run(**f)


def test_two_threads_running_one_program_at_different_sizes_get_their_own_answers(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog = _decode_program(rows=1)
    _warm(prog, lambda L: _feeds(1, L), (5, 6))
    lengths = [(7, 40), (9, 41)]
    want = {L: prog.run(**_feeds(1, L))[0] for pair in lengths for L in range(pair[0], pair[1])}

    def work(i):
        lo, hi = lengths[i]
        for _ in range(3):
            for L in range(lo, hi):
                assert np.array_equal(prog.run(**_feeds(1, L))[0], want[L]), L

    errors = run_in_threads(work, 2)
    assert not errors, errors


def test_clear_caches_drops_what_the_direct_path_keeps(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog = _decode_program(rows=1)
    _warm(prog, lambda L: _feeds(1, L), (5, 6, 7))
    assert lc.cache_info()["caches"]["program bindings"] >= 1
    lc.clear_caches()
    assert all(r.last is None for r in prog._traced.direct)
    assert lc.cache_info()["caches"]["program bindings"] == 0
    f = _feeds(1, 11)
    monkeypatch.setenv("LAZYCANDLE_EXEC", "python")
    slow = prog.run(**f)[0]
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    assert np.array_equal(prog.run(**f)[0], slow) and _direct_ran(prog, {"L": 11})


def test_a_matmul_backend_change_leaves_the_direct_path(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog = _decode_program(rows=1)
    _warm(prog, lambda L: _feeds(1, L), (5, 6))
    f = _feeds(1, 9)
    prog.run(**f)
    assert _direct_ran(prog, {"L": 9})
    from lazycandle import config
    old = config.get_matmul_backend()
    auto_runners = list(prog._traced.direct)
    try:
        config.set_matmul_backend("blas")
        for L in (9, 10):
            got = prog.run(**_feeds(1, L))[0]
            # a path derived for the auto setting does not run (the BLAS program may get its own)
            assert prog._last_direct not in auto_runners if prog._last_direct else True
            assert not any(r.bound_sizes() == {"L": L} for r in auto_runners)
            monkeypatch.setenv("LAZYCANDLE_EXEC", "python")
            np.testing.assert_allclose(got, prog.run(**_feeds(1, L))[0], rtol=1e-5, atol=1e-6)
            monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    finally:
        config.set_matmul_backend(old)


def test_a_new_size_on_the_direct_path_builds_no_binding_or_matmul_plan(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog = _decode_program(rows=1)
    _warm(prog, lambda L: _feeds(1, L), (5, 6))
    bound = len(prog._bound)
    for name in ("plan_for", "backend_for", "geometry"):
        monkeypatch.setattr(MM, name, None)
    monkeypatch.setattr(SK, "SkinnyPlan", None)
    from lazycandle.runtime import executor, native_exec
    monkeypatch.setattr(native_exec, "NativePlan", None)
    monkeypatch.setattr(executor, "Binding", None)
    for L in range(7, 40):
        f = _feeds(1, L)
        s = f["q"].astype(np.float64) @ f["k"].T.astype(np.float64) * 0.125
        p = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(prog.run(**f)[0], (p / p.sum(-1, keepdims=True)) @ f["v"], rtol=2e-4, atol=2e-5)
    assert len(prog._bound) == bound


# ---- the pieces --------------------------------------------------------------------------
def test_fold_evaluates_known_parts_and_keeps_what_depends_on_the_arguments():
    source = ("def f(sizes):\n    n = sizes['n']\n    k = 64\n    s = (1 * n, k * 2, max(k, 3))\n"
              "    if k < 2:\n        return None\n    if n < 2:\n        return None\n"
              "    if n < 2:\n        return None\n"
              "    u = 1 if k == 1 else s[1]\n    unused = n * 7\n    return [s[0] + 0, *s, u, e(s)]\n")
    fn = fold.fold(source, {"max": max, "e": lambda s: s[0] + s[1]}, {})
    text = ast.unparse(fn)
    assert "unused" not in text and "k < 2" not in text and text.count("n < 2") == 1 and "max" not in text
    scope = {"e": lambda s: s[0] + s[1]}
    exec(compile(ast.Module([fn], []), "<t>", "exec"), scope)
    plain = {"max": max, "e": scope["e"]}
    exec(source, plain)
    for n in (0, 1, 2, 5, 1000):
        assert scope["f"]({"n": n}) == plain["f"]({"n": n}), n


def test_fold_uses_the_lower_bounds_its_checks_prove_and_stays_equal_to_the_source():
    source = ("def f(sizes):\n    n = sizes['n']\n    if n < 2:\n        return None\n"
              "    a = max(n, 1)\n    b = 1 if n == 1 else 7\n    c = -(-n // 16)\n    d = max(1, c)\n"
              "    e = max(8, -(-(-(-n // 16)) // 8) * 8)\n    g = n * 4 + 63 & -64\n    h = n * 4 + 63 & -64\n"
              "    return (a, b, d, e, g + h, c if n else 0, n == 0, n - 0, max(n, 3))\n")
    fn = fold.fold(source, {"max": max}, {})
    text = ast.unparse(fn)
    assert "n == 1" not in text and "n == 0" not in text and "max(n, 1)" not in text and "max(8" not in text
    assert text.count("& -64") == 1 and "max(n, 3)" in text           # equal values computed once; 3 > 2 kept
    scope: dict = {}
    exec(compile(ast.Module([fn], []), "<t>", "exec"), scope)
    plain: dict = {"max": max}
    exec(source, plain)
    for n in range(-3, 300):
        assert scope["f"]({"n": n}) == plain["f"]({"n": n}), n


def test_fold_unpacks_a_tuple_display_of_constants_into_its_names():
    """`m, k = (1, 768)` is folded whole into one tuple constant first: its names must still be
    known (a matmul's fixed sizes, which would otherwise keep the binder in Python)."""
    source = ("def f(sizes):\n    n = sizes['n']\n    m, k = (1, 768)\n    r = max(k, 1) if m == 1 else 5\n"
              "    return (r * n, m)\n")
    fn = fold.fold(source, {"max": max}, {})
    text = ast.unparse(fn)
    assert "m, k" not in text and "max" not in text and "768 * n" in text.replace("(", "").replace(")", "")
    scope: dict = {}
    exec(compile(ast.Module([fn], []), "<t>", "exec"), scope)
    assert [scope["f"]({"n": n}) for n in (0, 3)] == [(0, 1), (2304, 1)]


def _skinny_plan(m, n, k, transposed=True):
    la = Layout((m, k), (k, 1))
    lb = Layout((k, n), (1, k)) if transposed else Layout((k, n), (n, 1))
    return SK.SkinnyPlan(MM.geometry(la, lb, lc.f32), 2), la, lb


@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("own_m", [1, 9])
def test_rebinder_source_gives_what_rebinder_sized_gives(transposed, own_m):
    rebind = SK.Rebinder(_skinny_plan(own_m, 40, 64, transposed)[0])
    toks = ["m", "k", "n", "ra", "ca", "rb", "cb"]
    lines = rebind.source(0, toks[:2], toks[3:5], [toks[1], toks[2]], toks[5:7])
    src = "def f(m, k, n, ra, ca, rb, cb):\n" + "\n".join(lines) + "\n    return s0, e0, c0\n"
    scope: dict = {}
    exec(src, scope)
    for m in (0, 1, 2, 5, 8, 9, 16, 17):
        for n, k in ((1, 1), (7, 64), (100, 64), (257, 3), (64, 7000), (0, 64), (5, 0)):
            _, la, lb = _skinny_plan(max(m, 1), n, k, transposed)
            la = Layout((m, k), la.strides)
            got = scope["f"](m, k, n, *la.strides, *lb.strides)
            want = rebind.sized(la.shape, la.strides, lb.shape, lb.strides)
            assert got == (want if want is None else (tuple(want[0]),) + want[1:]), (m, n, k)


def test_compiled_binder_writes_the_words_the_python_binder_writes():
    """The direct function compiled (codegen/binder_ir.py) against the Python one it was made
    from, word for word, across sizes in and out of the class (bail cases included)."""
    prog = _decode_program()
    _warm(prog, lambda L: _feeds(3, L), (5, 6))
    r = prog._traced.direct[0]
    assert r.fn is not r.python_fn, "the decode class's binder was not compiled"
    init = r.block.copy()
    agreed = 0
    for m in (1, 2, 3, 4, 15, 16, 17, 1 << 20):
        for L in (0, 1, 2, 3, 7, 16, 17, 63, 64, 65, 129, 1000, 5000, 1 << 30, (1 << 62) + 1):
            key = tuple({"m": m, "L": L}[n] for n in r.names)
            with r.program.lock:
                r.last = None
                r.block[:] = init
                try:
                    want = r.python_fn(key)
                except (ZeroDivisionError, OverflowError):
                    continue
                want_words = r.block.copy()
                r.block[:] = init
                got = r.fn(key)
                assert (got is None) == (want is None), (m, L)
                if want is not None:
                    if isinstance(want, tuple) and len(want) == 6:     # outputs that vary with the sizes
                        assert got[2] is want[2] and got[:2] + got[3:] == want[:2] + want[3:], (m, L)
                    else:
                        assert got is want, (m, L)
                    out_pos = (want[0] if isinstance(want, tuple) else r.outputs[0])
                    per_call = {pos for pos, *_ in r.feeds} | {pos for pos, *_ in out_pos}     # the run fills these
                    keep = [p for p in range(len(init)) if p not in per_call]
                    np.testing.assert_array_equal(r.block[keep], want_words[keep], err_msg=str((m, L)))
                    agreed += 1
    assert agreed >= 10
    f = _feeds(3, 40)
    np.testing.assert_array_equal(prog.run(**f)[0], _python_run(prog, f))


def _python_run(prog, feeds):
    import os
    old = os.environ.get("LAZYCANDLE_EXEC")
    os.environ["LAZYCANDLE_EXEC"] = "python"
    try:
        return prog.run(**feeds)[0]
    finally:
        if old is None:
            del os.environ["LAZYCANDLE_EXEC"]
        else:
            os.environ["LAZYCANDLE_EXEC"] = old


def _one_call_cases():
    """Named-dim programs whose outputs keep their shape at every size: a small output, and
    large ones (above the shared block) with a realized input read beside the feeds.  (The
    status words of index kernels are binder_ir's test: their classes keep the Python binder.)"""
    rng = np.random.default_rng(5)
    bias = rng.standard_normal((1, 16384)).astype(np.float32)       # 64 KiB outputs: not in the shared block
    q, k, v = lc.placeholder("q", (1, D)), lc.placeholder("k", ("L", D)), lc.placeholder("v", ("L", 16384))
    out = lc.nn.softmax_last_dim((q @ k.transpose(0, 1)) * 0.125) @ v + lc.tensor(bias)

    def large_numpy(f):
        s = (f["q"] @ f["k"].T) * 0.125
        e = np.exp(s - s.max(-1, keepdims=True))
        o = (e / e.sum(-1, keepdims=True)) @ f["v"] + bias
        return [o, np.exp(o)]

    large = (lc.compile([out, out.exp()]),
             lambda L: {"q": rng.standard_normal((1, D)).astype(np.float32),
                        "k": rng.standard_normal((L, D)).astype(np.float32),
                        "v": rng.standard_normal((L, 16384)).astype(np.float32)}, large_numpy)
    decode = (_decode_program(rows=1), lambda L: _feeds(1, L), None)
    return {"large output": large, "decode": decode}


@pytest.mark.parametrize("case", ["large output", "decode"])
def test_one_call_direct_run_matches_the_per_kernel_path_as_sizes_grow(monkeypatch, case):
    """The direct path as one native call (bind, pointers, status, segments: binder_ir.run_module)
    gives the per-kernel path's outputs bit for bit while the sizes grow (the arena grows under
    it), shrink and repeat."""
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog, feeds_of, numpy_of = _one_call_cases()[case]
    _warm(prog, feeds_of, (5, 6))
    assert all(hasattr(run, "module") for _, run in prog._traced.direct_runs), "not the one-call form"
    for n in (7, 8, 30, 200, 900, 8, 900, 65, 65) if case != "large output" else (7, 8, 90, 8, 90):
        f = feeds_of(n)
        fast = prog.run(**f)
        assert _direct_ran(prog, {prog._traced.names[0]: n})
        monkeypatch.setenv("LAZYCANDLE_EXEC", "python")
        slow = prog.run(**f)
        monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
        for a, b in zip(fast, slow):
            assert a.shape == b.shape and np.array_equal(a, b), n
        if numpy_of is not None:
            for a, want in zip(fast, numpy_of(f)):
                np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-4)


_FORK_PROBE = r"""
import os, sys, threading
sys.path.insert(0, sys.argv[1])         # the tests' folder: decode_cases
from decode_cases import decode_program, decode_feeds
prog = decode_program(rows=1)
for L in (5, 5, 6, 6):
    prog.run(**decode_feeds(1, L))
native = prog._traced.direct[0].program
held, release = threading.Event(), threading.Event()
def hold():                              # a run in progress on another thread when the process forks
    with native.lock:
        held.set()
        release.wait()
threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    f = decode_feeds(1, 9)
    out = prog.run(**f)[0]
    ok = any(r.bound_sizes() == {"L": 9} for r in prog._traced.direct) and out.shape == (1, 64)
    os._exit(0 if ok else 3)
release.set()
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_runs_the_direct_path_while_the_parent_held_the_program_lock():
    """The direct runners read the program's lock per run: a child forked while another thread
    was inside a run gets the renewed lock, not one held forever."""
    out = run_probe(_FORK_PROBE, os.path.dirname(os.path.abspath(__file__)), timeout=90)
    assert "child 0" in out, out
