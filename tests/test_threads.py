"""The one thread setting: API, env var, scope, and concurrent use from Python threads."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import lazycandle as lc


def test_set_get_and_scope():
    old = lc.get_num_threads()
    lc.set_num_threads(3)
    assert lc.get_num_threads() == 3
    with lc.num_threads(1):
        assert lc.get_num_threads() == 1
    assert lc.get_num_threads() == 3
    lc.set_num_threads(old)
    with pytest.raises(ValueError):
        lc.set_num_threads(0)


def test_env_and_default():
    code = "import lazycandle as lc, os; print(lc.get_num_threads(), len(os.sched_getaffinity(0)))"
    env = dict(os.environ, LAZYCANDLE_NUM_THREADS="5")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[0] == "5"
    env.pop("LAZYCANDLE_NUM_THREADS")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    a, b = out.stdout.split()
    assert a == b


def test_blas_threads_follow_setting():
    from lazycandle.runtime import blas
    if not blas.available():
        pytest.skip("no BLAS")
    with lc.num_threads(1):
        assert blas.info()["threads"] == 1
    with lc.num_threads(2):
        assert blas.info()["threads"] == 2


def test_concurrent_realize_from_python_threads():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((120, 90)).astype(np.float32) for _ in range(3)]
    errors = []

    def work(i):
        try:
            for k in range(8):
                x = xs[(i + k) % 3]
                t = lc.tensor(x) * float(k % 3 + 1)
                got = lc.nn.softmax_last_dim(t).numpy()
                y = x.astype(np.float64) * (k % 3 + 1)
                e = np.exp(y - y.max(-1, keepdims=True))
                np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
                m = (lc.tensor(x) @ lc.tensor(x).t()).numpy()
                np.testing.assert_allclose(m, x.astype(np.float64) @ x.T, rtol=1e-4, atol=1e-3)
        except Exception as ex:  # collected and asserted in the main thread
            errors.append(repr(ex))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("case", ["traced", "captured", "matmul", "blas matmul"])
def test_eager_realize_wakes_parked_workers_only_ahead_of_big_parallel_work(case, monkeypatch):
    """An eager realize that will run a parallel section wakes the pool's parked workers before
    its Python work (compiler._wake_pool), a BLAS GEMM too (its pieces are native pool tasks);
    a small one, or one at one thread, leaves them parked."""
    from lazycandle.runtime import native_pool
    backend = lc.get_matmul_backend()
    woken = []
    monkeypatch.setattr(native_pool, "wake", lambda: woken.append(1))
    rng = np.random.default_rng(7)

    def run(n):
        a = rng.standard_normal((n, n)).astype(np.float32)
        t = lc.tensor(a)
        if case == "traced":
            got, want = t.sum(-1), a.astype(np.float64).sum(-1)
        elif case == "captured":          # a computed node used twice: realized by the capture walk
            y = t + 1
            got, want = y * y, (a + 1) * (a + 1)
        else:
            got, want = t.matmul(t), a.astype(np.float64) @ a.astype(np.float64)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-3)

    lc.set_matmul_backend("blas" if case == "blas matmul" else "tiled")
    try:
        with lc.num_threads(2):
            run(8)
            assert not woken
            run(512)
            assert woken
        woken.clear()
        with lc.num_threads(1):
            run(512)
        assert not woken
    finally:
        lc.set_matmul_backend(backend)


def test_eager_realize_leaves_the_native_pool_parked_under_python_exec(monkeypatch):
    """LAZYCANDLE_EXEC=python (the reference path) runs a section per kernel: no worker is
    woken ahead of it."""
    from lazycandle.runtime import native_pool
    woken = []
    monkeypatch.setattr(native_pool, "wake", lambda: woken.append(1))
    monkeypatch.setenv("LAZYCANDLE_EXEC", "python")
    a = np.random.default_rng(3).standard_normal((512, 512)).astype(np.float32)
    with lc.num_threads(2):
        np.testing.assert_allclose(lc.tensor(a).sum(-1).numpy(), a.astype(np.float64).sum(-1), rtol=1e-5, atol=1e-4)
    assert not woken


def test_a_native_program_decides_its_matmuls_again_after_the_thread_count_changes(monkeypatch):
    """The tiled GEMM's words (its chunk split) are written for a thread count: a program run
    natively at 1 thread and then at 2 must not keep the 1-thread split (it ran the 2-thread
    GPT-2 block at the 1-thread speed)."""
    from lazycandle import config
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    old, old_backend = lc.get_num_threads(), lc.get_matmul_backend()
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    xv = rng.standard_normal((96, 256)).astype(np.float32)
    x = lc.placeholder("x", (96, 256))
    prog = lc.compile([(x @ lc.tensor(w)).relu()])
    try:
        lc.set_matmul_backend("tiled")
        lc.set_num_threads(1)
        for _ in range(3):
            out = prog.run(x=xv)[0]
        native = prog._fixed.plan.binding.native
        assert native and native.matmul_epoch == config.matmul_epoch
        lc.set_num_threads(2)
        for _ in range(3):
            out = prog.run(x=xv)[0]
        again = prog._fixed.plan.binding.native
        assert again is not native and again.matmul_epoch == config.matmul_epoch
        np.testing.assert_allclose(out, np.maximum(xv @ w, 0), rtol=1e-4, atol=1e-4)
    finally:
        lc.set_num_threads(old)
        lc.set_matmul_backend(old_backend)
