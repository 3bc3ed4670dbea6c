"""The eager launcher (codegen/launch_ir.py, runtime/launch.py): the builtin an eager call's
prepared run makes its one native call through.  It must decline -- calling nothing, leaving
no exception set -- whatever it is handed that the ctypes path would treat otherwise, give
that path's bits on every layout, scalar kind and output size, raise a kernel's bad index as
before, and stay right when Python threads share its program."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.codegen import launch_ir
from lazycandle.runtime import launch, native_exec

from conftest import run_in_threads

pytestmark = pytest.mark.skipif(launch.launcher(0, 0, 0, None, [], [], []) is None,
                                reason="this CPython / NumPy object layout was not verified")


@pytest.fixture
def counted(monkeypatch):
    """Every launcher made from now on counts the calls it finishes (not declines) in `calls`
    (the plans are made again, so that their launchers are made under the count)."""
    lc.clear_caches()
    calls = []
    real = launch.launcher

    def make(*args):
        go = real(*args)
        if go is None:
            return None

        def counting(*a):
            rc = go(*a)
            if rc != launch_ir.DECLINED:
                calls.append(rc)
            return rc
        return counting
    monkeypatch.setattr(launch, "launcher", make)
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    return calls


# ---- declines ------------------------------------------------------------------------------
def _armed(kinds=()):
    """A launcher whose program is address 0: if any check let a call through, the process would
    crash.  Pointers go to a scratch array; one feed (in_bufs[0] at offsets[0], 4-byte items),
    one output pointer."""
    ptrs = np.zeros(4, np.int64)
    go = launch.launcher(0, ptrs.ctypes.data, ptrs.ctypes.data, None, [(0, 0, 0, 4)], [(1, 0)], list(kinds))
    return go, ptrs


class _Sub(np.ndarray):
    pass


def _bad_calls():
    lock, a, out = threading.Lock(), np.zeros(3, np.float32), np.zeros(3, np.float32)
    held = threading.Lock()
    held.acquire()
    yield "too few args", (2, out, [a], [0], lock)
    yield "too many args", (2, out, [a], [0], lock, [], 1)
    yield "lock not a Lock", (2, out, [a], [0], threading.RLock(), [])
    yield "lock None", (2, out, [a], [0], None, [])
    yield "lock held", (2, out, [a], [0], held, [])
    yield "out a list", (2, [0.0], [a], [0], lock, [])
    yield "out a subclass", (2, out.view(_Sub), [a], [0], lock, [])
    yield "in_bufs a tuple", (2, out, (a,), [0], lock, [])
    yield "offsets a tuple", (2, out, [a], (0,), lock, [])
    yield "no input", (2, out, [], [0], lock, [])
    yield "no offset", (2, out, [a], [], lock, [])
    yield "input a list", (2, out, [[0.0]], [0], lock, [])
    yield "input a subclass", (2, out, [a.view(_Sub)], [0], lock, [])
    yield "offset a float", (2, out, [a], [1.5], lock, [])
    yield "offset too large", (2, out, [a], [2 ** 70], lock, [])
    yield "threads 0", (0, out, [a], [0], lock, [])
    yield "threads -1", (-1, out, [a], [0], lock, [])
    yield "threads a str", ("2", out, [a], [0], lock, [])


@pytest.mark.parametrize("name, args", list(_bad_calls()), ids=[n for n, _ in _bad_calls()])
def test_launcher_declines_what_it_does_not_expect(name, args):
    go, _ = _armed()
    assert go(*args) == launch_ir.DECLINED


def _bad_scalars():
    lock, a, out = threading.Lock(), np.zeros(3, np.float32), np.zeros(3, np.float32)
    for kinds, scalars, why in [
            ("f", (1.0, lc.f32), "not a list"), ("f", [1.0], "an item not a pair"),
            ("f", [()], "an empty pair"), ("f", [], "too few"), ("f", [("x", lc.f32)], "f: a str"),
            ("f", [(2 ** 1100, lc.f32)], "f: an int too large for a double"),
            ("i", [(1.5, lc.i64)], "i: a float"), ("i", [(2 ** 63, lc.i64)], "i: above i64"),
            ("u", [(-1, lc.u32)], "u: negative"), ("u", [(2 ** 64, lc.u32)], "u: above u64"),
            ("u", [(np.uint32(3), lc.u32)], "u: not a Python int")]:
        yield why, kinds, (2, out, [a], [0], lock, scalars)


@pytest.mark.parametrize("name, kinds, args", list(_bad_scalars()), ids=[n for n, _, _ in _bad_scalars()])
def test_launcher_declines_scalars_the_struct_path_would_treat_otherwise(name, kinds, args):
    go, _ = _armed(kinds)
    assert go(*args) == launch_ir.DECLINED


def test_a_declined_call_leaves_no_error_set():
    """An error the launcher cleared must not surface at the next C API check."""
    go, _ = _armed()
    assert go(2, np.zeros(3, np.float32), [np.zeros(3, np.float32)], ["x"], threading.Lock(), []) \
        == launch_ir.DECLINED
    assert [i for i in range(3)] == [0, 1, 2]       # the interpreter runs on without a stray error


def test_unverified_scalar_kind_gets_no_launcher():
    assert launch.launcher(0, 0, 0, None, [], [], ["b"]) is None


# ---- the same bits as the ctypes path ---------------------------------------------------------
RNG = np.random.default_rng(7)
X = RNG.standard_normal((37, 300)).astype(np.float32)
BIG = RNG.standard_normal((192, 160)).astype(np.float32)    # outputs of 120 KiB: "large" outputs
I = (RNG.integers(-50, 50, (9, 33))).astype(np.int64)
U = (RNG.integers(0, 2 ** 32, (9, 33))).astype(np.uint32)


def _cases():
    """name -> (eager builder over fresh leaves at call i, NumPy expected at call i)."""
    def s(i):
        return 0.25 + i
    return {
        "sum(0)": (lambda i: lc.tensor(X).sum(0), lambda i: X.sum(0, dtype=np.float64)),
        "sum(-1) narrowed": (lambda i: lc.tensor(X)[3:30, 7:250].sum(-1),
                             lambda i: X[3:30, 7:250].sum(-1, dtype=np.float64)),
        "max(0) transposed": (lambda i: lc.tensor(X).t().max(0), lambda i: X.T.max(0)),
        "exp scaled, f scalar": (lambda i: (lc.tensor(X) * s(i) + 1.0).exp(),
                                 lambda i: np.exp(X * np.float32(s(i)) + np.float32(1))),
        "broadcast add": (lambda i: lc.tensor(X) + lc.tensor(X[:1]), lambda i: X + X[:1]),
        "large output, narrowed": (lambda i: (lc.tensor(BIG)[5:, 3:] * s(i)).tanh(),
                                   lambda i: np.tanh(BIG[5:, 3:] * np.float32(s(i)))),
        "large softmax": (lambda i: lc.tensor(BIG).softmax(-1),
                          lambda i: np.exp(BIG - BIG.max(-1, keepdims=True))
                          / np.exp(BIG - BIG.max(-1, keepdims=True)).sum(-1, keepdims=True)),
        "i64 scalar": (lambda i: lc.tensor(I) * (-2 ** 62 + i), lambda i: I * np.int64(-2 ** 62 + i)),
        "u32 scalar": (lambda i: lc.tensor(U) + (2 ** 32 - 1 - i), lambda i: U + np.uint32(2 ** 32 - 1 - i)),
        "rank 0": (lambda i: lc.tensor(np.float32(1.5)) * s(i), lambda i: np.float32(1.5) * np.float32(s(i))),
        "zero-size": (lambda i: lc.tensor(X[:0]).exp(), lambda i: np.exp(X[:0])),
    }


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", list(_cases()))
def test_launched_runs_give_the_ctypes_paths_bits(name, threads, counted, monkeypatch):
    build, expect = _cases()[name]
    old = lc.get_num_threads()
    lc.set_num_threads(threads)
    try:
        got = {}
        for on in (False, True):
            monkeypatch.setattr(native_exec, "LAUNCH", on)
            got[on] = [np.array(build(i).numpy()) for i in range(5)]
        for i in range(5):
            np.testing.assert_array_equal(got[True][i], got[False][i])
            np.testing.assert_allclose(got[True][i], expect(i), rtol=2e-5, atol=1e-5)
    finally:
        lc.set_num_threads(old)
    if name != "zero-size":
        assert counted, "the launcher never ran"


def test_launcher_raises_a_bad_index_and_clears_it(counted):
    tv = np.arange(40, dtype=np.float32).reshape(5, 8) / 40
    t = lc.tensor(tv)

    def step(ids, scale=None):
        y = t.index_select(lc.tensor(np.array(ids, np.int64)), 0)
        return (y if scale is None else y * scale).exp().numpy()
    for scale in (None, 2.0):
        for _ in range(4):
            np.testing.assert_allclose(step([4, 0, 2], scale), np.exp(tv[[4, 0, 2]] * (scale or 1)), rtol=1e-6)
        before = len(counted)
        for bad in ([1, 5, 0], [-1, 0, 0], [0, 0, 99]):
            with pytest.raises(lc.IndexOutOfBounds, match="index_select"):
                step(bad, scale)
        assert len(counted) == before + 3 and all(rc > 0 for rc in counted[before:])
        np.testing.assert_allclose(step([3, 3, 1], scale), np.exp(tv[[3, 3, 1]] * (scale or 1)), rtol=1e-6)
        assert counted[-1] == 0


def test_threads_sharing_launched_programs_get_their_own_answers(counted):
    xs = [np.full((64, 48), k, np.float32) for k in range(4)]

    def work(k):
        t = lc.tensor(xs[k])
        for j in range(150):
            s = float(j % 7) + k
            np.testing.assert_array_equal((t * s + 1.0).numpy(), xs[k] * np.float32(s) + 1)
            np.testing.assert_array_equal(t.sum(0).numpy(), np.full(48, 64.0 * k, np.float32))
    assert run_in_threads(work, 4) == []
    assert len(counted) > 100


def test_a_held_program_lock_sends_the_call_the_ctypes_way(counted):
    """While another thread holds the program's lock (as a Python-path run does while its
    kernel runs without the GIL) the launcher declines and the call waits for the lock."""
    from lazycandle import compiler
    t = lc.tensor(X)
    for _ in range(4):
        t.sum(-1).numpy()
    bound = compiler._eager.get(compiler.trace_key(t.sum(-1)._node.base))[0]
    lock = bound._fast[0].lock
    lock.acquire()
    released = threading.Timer(0.2, lock.release)
    released.start()
    before = len(counted)
    np.testing.assert_allclose(t.sum(-1).numpy(), X.sum(-1, dtype=np.float64), rtol=1e-5, atol=1e-5)
    released.join()
    assert len(counted) == before      # declined: the ctypes path ran once the lock was free
    t.sum(-1).numpy()
    assert len(counted) == before + 1
