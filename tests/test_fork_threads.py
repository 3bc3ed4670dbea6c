"""The one pool under stress: set_num_threads while other Python threads run kernels, and
os.fork() / multiprocessing's fork pool after a parallel kernel.  Each probe runs in its own
process group with a timeout, so a hang or crash fails the test instead of the suite."""
from conftest import run_probe


RACE = """
import sys, threading, time
import numpy as np, lazycandle as lc
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 1024)).astype(np.float32)
w = rng.standard_normal((1024, 64)).astype(np.float32)
ref_e, ref_s, ref_m = np.tanh(x * 1.5 + 0.25), x.astype(np.float64).sum(-1), x.astype(np.float64) @ w
stop, errors = threading.Event(), []

def work():
    try:
        for k in range(30):
            t = lc.tensor(x)
            np.testing.assert_allclose((t * 1.5 + 0.25).tanh().numpy(), ref_e, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(t.sum(-1).numpy(), ref_s, rtol=1e-4, atol=1e-3)
            if k % 4 == 0:
                np.testing.assert_allclose((t @ lc.tensor(w)).numpy(), ref_m, rtol=1e-4, atol=1e-3)
    except BaseException as e:
        errors.append(repr(e))

def churn():
    n = 2
    while not stop.is_set():
        lc.set_num_threads(n)          # every new maximum used to replace (shut down) the pool
        n = n + 1 if n < 40 else 2
        time.sleep(0.002)

workers = [threading.Thread(target=work) for _ in range(4)]
churner = threading.Thread(target=churn)
churner.start()
for t in workers: t.start()
for t in workers: t.join()
stop.set(); churner.join()
print("errors:", errors[:3])
sys.exit(1 if errors else 0)
"""

FORK = """
import os, sys
import numpy as np, lazycandle as lc
lc.set_num_threads(4)
x = np.linspace(-3, 3, 1 << 18, dtype=np.float32)
m = np.ones((300, 300), np.float32)

def run(k):
    got = (lc.tensor(x) * float(k)).exp().sum(0).numpy()
    return bool(np.isclose(got, np.exp(x.astype(np.float64) * k).sum(), rtol=1e-4))

assert run(1) and (lc.tensor(m) @ lc.tensor(m)).numpy()[0, 0] == 300     # the pool is running
if sys.argv[1] == "fork":
    pid = os.fork()
    if pid == 0:
        os._exit(0 if run(2) and (lc.tensor(m) @ lc.tensor(m)).numpy()[0, 0] == 300 else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
else:
    import multiprocessing as mp
    with mp.get_context("fork").Pool(2) as p:
        assert p.map(run, [0.5, 1.5, 2.5]) == [True] * 3
assert run(3)
print("ok")
"""


def _probe(code, *args, timeout=150):
    return run_probe(code, *args, timeout=timeout)


def test_set_num_threads_while_threads_run_kernels():
    assert "errors: []" in _probe(RACE)


def test_forked_child_runs_parallel_kernels():
    assert "ok" in _probe(FORK, "fork")


def test_multiprocessing_fork_pool_runs_parallel_kernels():
    assert "ok" in _probe(FORK, "mp")


HELD_LOCKS = """
import os, sys, threading, time
import numpy as np, lazycandle as lc
from lazycandle import caches, config
from lazycandle.codegen import jit
from lazycandle.runtime import blas, buffers, matmul
x = np.arange(1000, dtype=np.float32)
assert (lc.tensor(x) * 2.0).numpy()[3] == 6.0
locks = [config._lock, jit._lock, blas._lock, buffers._lock, matmul._plans_lock, caches._registry_lock]
held = threading.Event()

def hold():
    for lk in locks:
        lk.acquire()
    held.set()
    time.sleep(30)

threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    lc.set_num_threads(2)
    lc.clear_caches()
    ok = (lc.tensor(x) * 3.0 + 1).exp().sum(0).numpy() > 0 and (lc.tensor(np.ones((64, 64), np.float32))
                                                               @ lc.tensor(np.ones((64, 64), np.float32))).numpy()[0, 0] == 64
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
print("ok")
"""


def test_fork_while_another_thread_holds_the_engine_locks():
    """Every module lock is renewed in a forked child, so a lock held by a thread that does not
    exist there cannot hang the child's first realize, matmul, set_num_threads or clear_caches."""
    assert "ok" in _probe(HELD_LOCKS, timeout=90)
