"""The per-call fast paths of Program.run and eager realize (issue 11's dispatch targets):
LAZYCANDLE_EXEC / LAZYCANDLE_PROFILE still honoured between runs, the exact-feed path giving
the same answers and the same FeedErrors as the checked path, scalar slots packed per run
(signed zeros, wrapped ints), read-only / offset / empty feeds, and tiny programs run from
several Python threads."""
from __future__ import annotations

import os

import numpy as np
import pytest

import lazycandle as lc
from lazycandle import config
from lazycandle.runtime import executor
from conftest import run_in_threads


def _tiny_program():
    x = lc.placeholder("x", (16,), lc.f32)
    return lc.compile([x * 2.0 + 1.0])


def test_exec_switch_set_between_runs_picks_the_path_of_each_run(monkeypatch):
    prog = _tiny_program()
    a = np.linspace(-1, 1, 16, dtype=np.float32)
    monkeypatch.setenv("LAZYCANDLE_EXEC", "python")
    for _ in range(3):
        np.testing.assert_array_equal(prog.run(x=a)[0], a * 2 + 1)
    assert prog._fixed.plan.native is None          # the per-kernel path never builds the native form
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    np.testing.assert_array_equal(prog.run(x=a)[0], a * 2 + 1)
    assert prog._fixed.plan.native
    np.testing.assert_array_equal(prog.run(x=a)[0], a * 2 + 1)      # the prepared one-call path
    monkeypatch.setenv("LAZYCANDLE_EXEC", "python")
    per_kernel = []
    run_python = executor.Plan.run_python
    monkeypatch.setattr(executor.Plan, "run_python",
                        lambda self, *args: per_kernel.append(1) or run_python(self, *args))
    np.testing.assert_array_equal(prog.run(x=a)[0], a * 2 + 1)
    assert per_kernel == [1]
    monkeypatch.delenv("LAZYCANDLE_EXEC")
    for _ in range(2):
        np.testing.assert_array_equal(prog.run(x=a)[0], a * 2 + 1)
    assert per_kernel == [1]                        # native again, fast path included


def test_exec_flags_follow_os_environ_writes_and_deletes(monkeypatch):
    monkeypatch.delenv("LAZYCANDLE_EXEC", raising=False)
    monkeypatch.delenv("LAZYCANDLE_PROFILE", raising=False)
    assert config.exec_flags() == ("", False)
    os.environ["LAZYCANDLE_EXEC"] = "python"
    os.environ["LAZYCANDLE_PROFILE"] = "1"
    assert config.exec_flags() == ("python", True)
    os.environ["LAZYCANDLE_PROFILE"] = "0"
    assert config.exec_flags() == ("python", False)
    del os.environ["LAZYCANDLE_EXEC"]
    del os.environ["LAZYCANDLE_PROFILE"]
    assert config.exec_flags() == ("", False)


def test_profile_env_set_between_runs_profiles_that_run(monkeypatch):
    from lazycandle.runtime import profile
    prog = _tiny_program()
    a = np.ones(16, np.float32)
    prog.run(x=a)
    seen = []
    monkeypatch.setattr(profile, "record", lambda plan, seconds: seen.append(len(seconds)))
    monkeypatch.setenv("LAZYCANDLE_PROFILE", "1")
    prog.run(x=a)
    monkeypatch.setenv("LAZYCANDLE_PROFILE", "0")
    prog.run(x=a)
    assert seen == [1]


@pytest.mark.parametrize("mode", ["python", "native"])
def test_exact_and_converted_feeds_give_the_same_answers(monkeypatch, mode):
    monkeypatch.setenv("LAZYCANDLE_EXEC", mode)
    x = lc.placeholder("x", (3, 4), lc.f32)
    prog = lc.compile([(x * 3.0).exp(), x.sum(1)])
    base = np.linspace(-1, 1, 40, dtype=np.float32)
    exact = base[:12].reshape(3, 4)
    readonly = exact.copy()
    readonly.flags.writeable = False
    feeds = [exact, base[5:17].reshape(3, 4),            # an offset view into a bigger buffer
             np.asfortranarray(exact), exact.astype(">f4"), lc.tensor(exact), readonly,
             base[:24].reshape(3, 8)[:, ::2]]            # strided: copied
    for _ in range(2):
        for f in feeds:
            v = np.asarray(f.numpy() if isinstance(f, lc.Tensor) else f, np.float32)
            got = prog.run(x=f)
            assert [g.shape for g in got] == [(3, 4), (3,)]
            np.testing.assert_allclose(got[0], np.exp(v * np.float32(3.0)), rtol=1e-6)
            np.testing.assert_allclose(got[1], v.sum(1), rtol=1e-6)


def test_exact_rank_2_feed_next_to_a_converted_feed_keeps_its_shape():
    ids = lc.placeholder("ids", (1, 1), lc.i64)
    k = lc.placeholder("k", (2, 3), lc.f32)
    prog = lc.compile([ids * 2, k + 1.0])
    kv = np.arange(6, dtype=np.float32).reshape(2, 3)
    for kfeed in (lc.tensor(kv), np.asfortranarray(kv), kv):     # the first two leave the exact-feed path
        a, b = prog.run(ids=np.array([[21]], np.int64), k=kfeed)
        np.testing.assert_array_equal(a, [[42]])
        np.testing.assert_array_equal(b, kv + 1)


def test_feed_at_an_offset_into_its_buffer_is_read_from_there(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog = _tiny_program()
    big = np.arange(40, dtype=np.float32)
    for start in (0, 3, 7, 24):
        np.testing.assert_array_equal(prog.run(x=big[start:start + 16])[0], big[start:start + 16] * 2 + 1)


def test_empty_feed_runs_natively(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    x = lc.placeholder("x", (0, 3), lc.f32)
    prog = lc.compile([x + 1.0])
    for _ in range(3):
        assert prog.run(x=np.zeros((0, 3), np.float32))[0].shape == (0, 3)


def test_feed_errors_are_unchanged_by_the_exact_feed_path():
    prog = _tiny_program()
    a = np.ones(16, np.float32)
    cases = [({"x": a.astype(np.float64)}, "expects dtype f32"),
             ({"x": np.ones(15, np.float32)}, r"expects shape \(16,\)"),
             ({"x": np.ones((16, 1), np.float32)}, r"expects shape \(16,\)"),
             ({}, "missing input"),
             ({"x": a, "y": a}, "unknown input"),
             ({"y": a}, "unknown input")]
    for _ in range(2):          # before and after the program ran once
        for feeds, msg in cases:
            with pytest.raises(lc.FeedError, match=msg):
                prog.run(**feeds)
        prog.run(x=a)


@pytest.mark.parametrize("mode", ["python", "native"])
def test_eager_scalar_slots_keep_signed_zero_and_wrapped_ints_per_run(monkeypatch, mode):
    monkeypatch.setenv("LAZYCANDLE_EXEC", mode)
    a = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    t = lc.tensor(a)
    for v in (0.0, -0.0, 0.0, -0.0, 2.5, -0.0):
        got = lc.realize((t * v).recip())[0].numpy()
        with np.errstate(divide="ignore"):
            np.testing.assert_array_equal(got, np.float32(1) / (a * np.float32(v)))
    u = lc.tensor(np.array([0, 1, 2**31, 2**32 - 1], np.uint32))
    i = lc.tensor(np.array([0, -1, 2**62, -2**63], np.int64))
    for k in (2**32 - 1, 2**31, 5, 2**32 - 1):
        np.testing.assert_array_equal((u + k).numpy(), u.numpy() + np.uint32(k))
    for k in (-2**63, 2**63 - 1, -5, -2**63):
        np.testing.assert_array_equal((i * k).numpy(), i.numpy() * np.int64(k))


def test_tiny_program_from_several_python_threads_is_right(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    x = lc.placeholder("x", (16,), lc.f32)
    y = lc.placeholder("y", (16,), lc.f32)
    prog = lc.compile([x * 2.0 + y, (x - y).abs()])
    t = lc.tensor(np.full(16, 0.5, np.float32))

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(300):
            xv, yv = rng.standard_normal((2, 16)).astype(np.float32)
            a, b = prog.run(x=xv, y=yv)
            np.testing.assert_array_equal(a, xv * 2 + yv)
            np.testing.assert_array_equal(b, np.abs(xv - yv))
            s = float(rng.integers(1, 9))
            np.testing.assert_allclose(((t * s) + 1.0).exp().numpy(), np.exp(np.float32(0.5 * s + 1)), rtol=1e-6)
    errors = run_in_threads(work, 4)
    assert errors == []
