"""The prepared one-call paths: Program.run's (NativePlan.program_runner) -- once a fixed-size
program runs natively, a run whose feeds are exact ndarrays skips every layer -- and an eager
realize's (NativePlan.buffers_runner, behind compiler.BoundPlan.run).  Whatever that path
does not take must still reach the checked path: feeds of another dtype, shape or strides
after a hit, settings changed between runs, other scalars packed by another user of the same
plan.  Outputs are fresh per run, bad ids still raise after the call, threads and a fork
child get right answers; an eager realize packs its own scalars and reads its own offsets."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from conftest import run_in_threads, run_probe


def _hot(prog, **feeds):
    """Run `prog` until its prepared path exists (the native form is built at the 2nd run)."""
    for _ in range(3):
        prog.run(**feeds)
    assert prog._fast is not None
    return prog


def _tiny():
    x = lc.placeholder("x", (4, 4), lc.f32)
    return lc.compile([x * 2.0 + 1.0])


A = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)


def test_wrong_dtype_or_shape_after_a_fast_hit_raises_feed_error():
    prog = _hot(_tiny(), x=A)
    with pytest.raises(lc.FeedError, match="dtype"):
        prog.run(x=A.astype(np.float64))
    with pytest.raises(lc.FeedError, match="shape"):
        prog.run(x=A.reshape(16))
    with pytest.raises(lc.FeedError, match="missing"):
        prog.run()
    with pytest.raises(lc.FeedError, match="unknown"):
        prog.run(x=A, y=A)
    np.testing.assert_array_equal(prog.run(x=A)[0], A * 2 + 1)


def test_strided_readonly_and_big_endian_feeds_after_a_fast_hit_give_right_answers():
    prog = _hot(_tiny(), x=A)
    wide = np.zeros((4, 8), np.float32)
    wide[:, ::2] = A
    np.testing.assert_array_equal(prog.run(x=wide[:, ::2])[0], A * 2 + 1)      # not contiguous
    np.testing.assert_array_equal(prog.run(x=A.T.copy().T)[0], A * 2 + 1)      # Fortran order
    ro = A.copy()
    ro.flags.writeable = False
    np.testing.assert_array_equal(prog.run(x=ro)[0], A * 2 + 1)
    np.testing.assert_array_equal(prog.run(x=A.astype(">f4"))[0], A * 2 + 1)  # big-endian


def test_outputs_are_fresh_arrays_each_run():
    prog = _hot(_tiny(), x=A)
    first = prog.run(x=A)[0]
    second = prog.run(x=A + 1)[0]
    assert not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, A * 2 + 1)
    np.testing.assert_array_equal(second, (A + 1) * 2 + 1)
    first[:] = 0                                # the caller owns it: writable, read by nobody else
    np.testing.assert_array_equal(prog.run(x=A)[0], A * 2 + 1)


def test_several_outputs_views_and_a_captured_tensor_on_the_fast_path():
    x = lc.placeholder("x", (4, 4), lc.f32)
    w = lc.tensor(np.arange(16, dtype=np.float32).reshape(4, 4))
    y = x * w + 0.5
    prog = _hot(lc.compile([y, y.reshape(16)[4:], (x * 3.0).sum(1), y]), x=A)
    want = A * np.arange(16, dtype=np.float32).reshape(4, 4) + 0.5
    got = prog.run(x=A)
    np.testing.assert_allclose(got[0], want, rtol=1e-6, atol=1e-7)     # (a fused multiply-add)
    np.testing.assert_array_equal(got[1], got[0].reshape(16)[4:])
    np.testing.assert_allclose(got[2], (A * 3).sum(1), rtol=1e-6)
    np.testing.assert_array_equal(got[3], got[0])
    assert [g.shape for g in got] == [(4, 4), (12,), (4,), (4, 4)]


def test_program_and_eager_realize_sharing_a_plan_keep_their_own_scalars():
    prog = _hot(_tiny(), x=A)
    t = lc.tensor(A)
    for k in range(3):
        np.testing.assert_array_equal(((t * 3.0) + 5.0 + k).numpy(), A * 3 + 5 + k)
        np.testing.assert_array_equal(prog.run(x=A)[0], A * 2 + 1)


def test_bad_ids_on_the_fast_path_raise_index_out_of_bounds_and_stay_usable():
    t = lc.placeholder("t", (5, 8), lc.f32)
    ids = lc.placeholder("ids", (3,), lc.i64)
    prog = lc.compile([(t * 2.0).index_select(ids, 0).exp()])
    tv = np.arange(40, dtype=np.float32).reshape(5, 8) / 40
    good = np.array([4, 0, 2], np.int64)
    _hot(prog, t=tv, ids=good)
    for bad in ([1, 5, 0], [-1, 0, 0]):
        with pytest.raises(lc.IndexOutOfBounds, match="index_select"):
            prog.run(t=tv, ids=np.array(bad, np.int64))
    np.testing.assert_allclose(prog.run(t=tv, ids=good)[0], np.exp(tv[good] * 2), rtol=1e-6)


def test_matmul_backend_change_rebuilds_the_fast_path():
    x = lc.placeholder("x", (2, 32), lc.f32)
    w = np.random.default_rng(1).uniform(-1, 1, (32, 8)).astype(np.float32)
    prog = lc.compile([(x @ lc.tensor(w)) + 1.0])
    xv = np.random.default_rng(2).uniform(-1, 1, (2, 32)).astype(np.float32)
    want = xv.astype(np.float64) @ w + 1
    old = lc.get_matmul_backend()
    try:
        for backend in ("blas", "tiled", old):
            lc.set_matmul_backend(backend)
            for _ in range(3):
                np.testing.assert_allclose(prog.run(x=xv)[0], want, rtol=1e-4, atol=1e-5)
            native = prog._fixed.plan.native
            assert native.matmul_epoch == lc.config.matmul_epoch
    finally:
        lc.set_matmul_backend(old)


def test_exec_python_and_profile_between_fast_runs(monkeypatch):
    from lazycandle.runtime import profile
    prog = _hot(_tiny(), x=A)
    seen = []
    monkeypatch.setattr(profile, "record", lambda plan, seconds: seen.append(len(seconds)))
    monkeypatch.setenv("LAZYCANDLE_PROFILE", "1")
    np.testing.assert_array_equal(prog.run(x=A)[0], A * 2 + 1)
    assert seen == [1]
    monkeypatch.setenv("LAZYCANDLE_PROFILE", "0")
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    np.testing.assert_array_equal(prog.run(x=A)[0], A * 2 + 1)
    assert seen == [1]


def test_fast_path_from_many_threads_gives_each_its_answer():
    prog = _hot(_tiny(), x=A)

    def work(i):
        a = A + i
        for _ in range(200):
            got = prog.run(x=a)[0]
            if not np.array_equal(got, a * 2 + 1):
                raise AssertionError(f"thread {i}: wrong answer")
    assert run_in_threads(work, 6) == []


FORKED = """
import os
import numpy as np, lazycandle as lc
x = lc.placeholder("x", (16,), lc.f32)
prog = lc.compile([x * 2.0 + 1.0])
a = np.arange(16, dtype=np.float32)
for _ in range(3):
    prog.run(x=a)
assert prog._fast is not None
pid = os.fork()
if pid == 0:
    ok = all(np.array_equal(prog.run(x=a + k)[0], (a + k) * 2 + 1) for k in range(3))
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
print("ok")
"""


def test_forked_child_runs_the_fast_path():
    assert "ok" in run_probe(FORKED, timeout=90)


# ---- eager realize: a BoundPlan's prepared run (NativePlan.buffers_runner) ------------------

def _eager_hot(make):
    """Realize `make()` until its bound plan runs through the prepared path."""
    from lazycandle import compiler
    for _ in range(3):
        got = make().numpy()
    assert any(e[0]._fast and e[0]._fast[1] for e in compiler._eager.values())
    return got


def test_eager_prepared_path_packs_each_realizes_scalars_and_gives_fresh_outputs():
    t = lc.tensor(A)
    _eager_hot(lambda: ((t * 2.0) + 1.0).exp())
    outs = []
    for k in range(4):
        y = ((t * (2.0 + k)) + (1.0 - k)).exp()
        outs.append(y.numpy())
        np.testing.assert_allclose(outs[-1], np.exp(A * (2 + k) + (1 - k)), rtol=1e-6)
    assert not np.shares_memory(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], np.exp(A * 2 + 1), rtol=1e-6)      # not written by later runs


def test_eager_prepared_path_reads_offset_views_of_its_input():
    big = np.arange(40, dtype=np.float32)
    t = lc.tensor(big)
    _eager_hot(lambda: t[4:20] * 3.0)
    for lo in (0, 7, 24):
        np.testing.assert_array_equal((t[lo:lo + 16] * 3.0).numpy(), big[lo:lo + 16] * 3)


def test_eager_bad_ids_on_the_prepared_path_raise_index_out_of_bounds():
    t = lc.tensor(np.arange(40, dtype=np.float32).reshape(5, 8))
    good = lc.tensor(np.array([4, 0, 2], np.int64))
    _eager_hot(lambda: (t * 2.0).index_select(good, 0).exp())
    with pytest.raises(lc.IndexOutOfBounds, match="index_select"):
        (t * 2.0).index_select(lc.tensor(np.array([1, 5, 0], np.int64)), 0).exp().numpy()
    np.testing.assert_allclose((t * 2.0).index_select(good, 0).exp().numpy(),
                               np.exp(np.arange(40, dtype=np.float32).reshape(5, 8)[[4, 0, 2]] * 2), rtol=1e-6)


def test_eager_prepared_path_from_many_threads():
    t = lc.tensor(A)
    _eager_hot(lambda: (t * 2.0) + 1.0)

    def work(i):
        for _ in range(100):
            got = ((t * float(i)) + 1.0).numpy()
            if not np.allclose(got, A * i + 1, rtol=1e-6, atol=1e-7):      # (a fused multiply-add)
                raise AssertionError(f"thread {i}: wrong answer")
    assert run_in_threads(work, 6) == []
