"""The whole-program native path (runtime/native_exec.py, codegen/program.py) on the native
worker pool (runtime/native_pool.py), against the per-kernel path (LAZYCANDLE_EXEC=python)
and NumPy: identical results on the mixed fuzz graphs, concurrent Program.run, fork after the
pool ran, bad ids still raising IndexOutOfBounds, the thread setting, idle workers parked,
the dumps and the profiler."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings

import lazycandle as lc
from conftest import ROOT, run_in_threads, run_probe
from lazycandle.runtime import arena

from test_fuzz_mixed_graphs import FUZZ_SETTINGS, example_data, graphs, placeholder_program



def _run_both(prog, feeds, monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "python")
    slow = prog.run(**feeds)
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    fast = [prog.run(**feeds) for _ in range(2)]
    return slow, fast


@settings(max_examples=60, derandomize=True, **FUZZ_SETTINGS)
@given(graphs())
def test_native_program_matches_per_kernel_path_on_fuzz_graphs(case):
    shape, leaves, ops, outputs, seed = case
    prog, feeds = placeholder_program(case, example_data(shape, leaves, seed))
    with pytest.MonkeyPatch.context() as mp:
        slow, fast = _run_both(prog, feeds, mp)
    for run in fast:
        for a, b in zip(slow, run):
            np.testing.assert_array_equal(a, b)


def _chain_program():
    x = lc.placeholder("x", (64, 300), lc.f32)
    y = ((x * 1.5 + 0.25).tanh() * x).exp()
    z = (y - y.max_keepdim(1).broadcast_as(y.shape)).exp()
    return lc.compile([z.sum(1), (x.abs() + 1.0).log()]), x


def _chain_ref(x):
    x64 = x.astype(np.float64)
    y = np.exp(np.tanh(x64 * 1.5 + 0.25) * x64)
    z = np.exp(y - y.max(1, keepdims=True))
    return z.sum(1), np.log(np.abs(x64) + 1)


def test_native_program_reuses_one_arena_and_matches_numpy(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog, _ = _chain_program()
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.uniform(-1, 1, (64, 300)).astype(np.float32)
        for got, ref in zip(prog.run(x=x), _chain_ref(x)):
            np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=2e-5, atol=1e-5)
    native = prog._fixed.plan.native
    assert native and native.module is not None and native.arena is not None
    sizes = [np.prod(prog._fixed.plan.node_meta[j][0]) * 4 for j in native.offsets]
    assert native.arena_bytes <= sum(sizes) + 64 * len(sizes)


def test_concurrent_program_runs_from_python_threads_are_right(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog, _ = _chain_program()

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(15):
            x = rng.uniform(-1, 1, (64, 300)).astype(np.float32)
            for got, ref in zip(prog.run(x=x), _chain_ref(x)):
                np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=2e-5, atol=1e-5)
    with lc.num_threads(2):
        errors = run_in_threads(work, 4)
    assert errors == []


def test_bad_id_in_a_native_program_raises_index_out_of_bounds_and_process_stays_usable(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    t = lc.placeholder("t", (5, 8), lc.f32)
    ids = lc.placeholder("ids", (3,), lc.i64)
    out = (t * 2.0).index_select(ids, 0).exp()
    prog = lc.compile([out])
    tv = np.arange(40, dtype=np.float32).reshape(5, 8) / 40
    good = np.array([4, 0, 2], np.int64)
    np.testing.assert_allclose(prog.run(t=tv, ids=good)[0], np.exp(tv[good] * 2), rtol=1e-6)
    native = prog._fixed.plan.native
    assert native and any(c.status_at is not None for cs in native.call_steps for c in cs)
    for bad in ([1, 5, 0], [-1, 0, 0]):
        with pytest.raises(lc.IndexOutOfBounds, match="index_select"):
            prog.run(t=tv, ids=np.array(bad, np.int64))
    np.testing.assert_allclose(prog.run(t=tv, ids=good)[0], np.exp(tv[good] * 2), rtol=1e-6)


def test_program_with_matmul_runs_in_segments_and_dumps_phases(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    x = lc.placeholder("x", (160, 48), lc.f32)        # rows above matmul_skinny.MEASURED_M: a Python step
    w = lc.tensor(np.random.default_rng(2).uniform(-1, 1, (48, 16)).astype(np.float32))
    prog = lc.compile([((x * 0.5).tanh() @ w).relu() + 1.0, (x * 3.0).sin()])
    xv = np.random.default_rng(3).uniform(-1, 1, (160, 48)).astype(np.float32)
    a, b = prog.run(x=xv)
    np.testing.assert_allclose(a, np.maximum(np.tanh(xv * 0.5) @ w.numpy(), 0) + 1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b, np.sin(xv * 3.0), rtol=1e-6, atol=1e-6)
    sched = prog.dump("schedule")
    assert "native program" in sched and "phase 0" in sched
    assert "between segments: #1 matmul (" in sched or "python step: MatmulStep" in sched     # matmul_words.py
    llvm = prog.dump("llvm")
    assert "whole-program module" in llvm and "@\"run_segment0\"" in llvm and "lc_pool_run" in llvm


def test_independent_kernels_share_a_phase_and_dependent_ones_get_a_barrier(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    x = lc.placeholder("x", (512, 512), lc.f32)
    s = x.sum_keepdim(0).broadcast_as(x.shape)          # reduce (not a row: dim 0), then an elementwise reading it
    prog = lc.compile([(x * s).exp(), (x * 2.0).cos(), x.max_keepdim(0)])
    xv = np.random.default_rng(4).uniform(-0.01, 0.01, (512, 512)).astype(np.float32)
    with lc.num_threads(2):
        e, c, m = prog.run(x=xv)
    np.testing.assert_allclose(e, np.exp(xv * xv.sum(0, keepdims=True)), rtol=1e-5)
    np.testing.assert_allclose(c, np.cos(xv * 2.0), rtol=1e-6)
    np.testing.assert_array_equal(m, xv.max(0, keepdims=True))
    phases = prog._fixed.plan.native.segments[0]
    assert len(phases) >= 2 and max(len(p) for p in phases) >= 2


def test_profile_reports_every_kernel():
    prog, _ = _chain_program()
    table = prog.profile(x=np.ones((64, 300), np.float32), runs=2)
    lines = table.splitlines()
    n = len(prog._fixed.plan.kernels)
    assert len(lines) == n + 3 and "time us" in lines[0] and "total" in lines[-1]
    assert "tanh" in table and "(64, 300)" in table


def _probe(code, timeout=150):
    return run_probe(code, timeout=timeout, LAZYCANDLE_EXEC="native")


BIG_KERNEL = """
import os, sys, time
import numpy as np, lazycandle as lc
from lazycandle.runtime import native_pool
x = np.linspace(-3, 3, 1 << 18, dtype=np.float32)
p = lc.compile([(lc.placeholder("x", x.shape, lc.f32) * 1.5).exp()])

def run():
    return bool(np.allclose(p.run(x=x)[0], np.exp(x * 1.5), rtol=1e-6))

def wait_ready(n):
    for _ in range(500):
        if native_pool.ready() >= n:
            return True
        time.sleep(0.01)
    return False
"""

FORK = BIG_KERNEL + """
import threading
lc.set_num_threads(3)
assert run() and run() and wait_ready(2)
held = threading.Event()

def hold():                     # a run in another thread holds these while the process forks
    p._fixed.plan.native.lock.acquire()
    native_pool._lock.acquire()
    held.set()
    time.sleep(30)

threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    ok = run() and run() and wait_ready(2) and run()
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
print("ok")
"""

THREADS = BIG_KERNEL + """
lc.set_num_threads(1)
assert run() and run()
time.sleep(0.2)
assert native_pool.ready() == 0, native_pool.ready()      # one thread: no worker started
lc.set_num_threads(3)
assert run() and wait_ready(2) and run()
lc.set_num_threads(2)                                      # fewer: the third stays parked
assert run()
print("ready", native_pool.ready())
"""

IDLE = BIG_KERNEL + """
def cpu_seconds():
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

lc.set_num_threads(3)
for _ in range(20):
    assert run()
assert wait_ready(2)
before = cpu_seconds()
time.sleep(2.0)
print("idle cpu seconds", cpu_seconds() - before)
"""


def test_fork_after_the_native_pool_ran_does_not_hang_the_child():
    assert "ok" in _probe(FORK)


def test_native_pool_obeys_the_thread_setting():
    assert "ready 2" in _probe(THREADS)


def test_idle_native_workers_use_no_cpu():
    out = _probe(IDLE)
    used = float(out.split("idle cpu seconds")[1])
    assert used < 0.2, f"parked workers used {used:.3f} s of CPU in 2 s"      # spinning: ~4 s


def test_arena_never_shares_bytes_between_live_buffers():
    prog, _ = _chain_program()
    plan = prog._fixed.plan
    where, top = arena.layout(plan, plan.binding.numels)
    spans = {}
    for i, k in enumerate(plan.kernels):
        for j in k.outputs:
            spans.setdefault(j, [i, i])
        for bind in k.inputs:
            if bind[0] == "node" and bind[1] in spans:
                spans[bind[1]][1] = i
    items = [(where[j], where[j] + plan.binding.numels[j] * 4, *spans[j]) for j in where]
    for a in items:
        assert a[1] <= top
        for b in items:
            if a is not b and not (a[3] < b[2] or b[3] < a[2]):
                assert a[1] <= b[0] or b[1] <= a[0], (a, b)


def test_the_per_kernel_path_lays_its_buffers_out_in_the_same_arena(monkeypatch):
    """One memory planner: the reference path (LAZYCANDLE_EXEC=python) puts every
    intermediate buffer at its arena.layout offset in one block per run."""
    monkeypatch.setenv("LAZYCANDLE_EXEC", "python")
    from lazycandle.runtime import arena as arena_mod
    prog, _ = _chain_program()
    xv = np.random.default_rng(3).standard_normal((64, 300)).astype(np.float32)
    plan = prog._fixed.plan
    where, top = arena_mod.layout(plan, plan.binding.numels)
    seen = []
    orig = arena_mod.views
    monkeypatch.setattr(arena_mod, "views", lambda *a: seen.append((a[0].size, a[1])) or orig(*a))
    for _ in range(2):
        got = prog.run(x=xv)
        for g, want in zip(got, _chain_ref(xv)):
            np.testing.assert_allclose(g, want, rtol=2e-5, atol=1e-6)
    assert seen == [(top, where)] * 2


def test_native_pool_parallel_splits_a_kernel_range_over_the_workers():
    import ctypes
    from lazycandle.runtime import native_pool
    from lazycandle.runtime.executor import pack_scalars
    from lazycandle import compiler
    from lazycandle.ir.graph import capture
    a = np.linspace(-2, 2, 100003, dtype=np.float32)
    y = (lc.tensor(a) * 3.0).exp()
    cap = capture([y._node])
    plan = compiler.get_plan(cap, [y._node])
    step = plan.steps[0]
    sizes, extent, _ = plan.binding.steps[0]
    sizes = np.array(sizes, np.int64)
    packed = pack_scalars(cap.scalars)
    for n in (1, 2, 3):
        out = np.full_like(a, np.nan)
        ptrs = np.array([cap.inputs[0].buffer.ctypes.data, out.ctypes.data], np.int64)
        native_pool.parallel(ctypes.cast(step.fn, ctypes.c_void_p).value, ptrs.ctypes.data, sizes.ctypes.data,
                             packed.ctypes.data, 0, extent, step.align, nthreads=n)
        np.testing.assert_array_equal(out, y.numpy())


def test_lazycandle_profile_env_prints_a_table_at_exit():
    code = ("import numpy as np, lazycandle as lc\n"
            "x = lc.tensor(np.ones(100, np.float32))\n"
            "for _ in range(3): (x * 2.0 + 1.0).numpy()\n")
    env = dict(os.environ, PYTHONPATH=ROOT, LAZYCANDLE_PROFILE="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "lazycandle profile" in r.stderr and "3 run(s)" in r.stderr and "mul+add" in r.stderr


def test_two_outputs_of_one_node_and_a_graph_without_inputs_run_natively(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    x = lc.placeholder("x", (3, 4), lc.f32)
    a, b = x.abs().relu(), x.abs().relu()           # CSE makes them one node: one buffer, two outputs
    prog = lc.compile([a, b])
    xv = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    for got in prog.run(x=xv):
        np.testing.assert_array_equal(got, np.abs(xv))
    for _ in range(2):
        np.testing.assert_array_equal(lc.ones((2, 3), lc.f32).numpy(), np.ones((2, 3), np.float32))


def test_a_backend_change_after_a_native_run_reaches_the_compiled_program():
    """set_matmul_backend("blas") after a program ran natively with the small-m kernel: its
    next run calls BLAS (SPEC: "blas" calls sgemm), with the same values."""
    from lazycandle.runtime import blas
    x, w = lc.placeholder("x", (4, 64)), lc.placeholder("w", (64, 32))
    prog = lc.compile(x @ w)
    r = np.random.default_rng(0)
    xv, wv = r.standard_normal((4, 64)).astype(np.float32), r.standard_normal((64, 32)).astype(np.float32)
    old = lc.get_matmul_backend()
    try:
        lc.set_matmul_backend("auto")
        for _ in range(3):
            prog.run(x=xv, w=wv)
        used = []
        single = blas.single_threaded

        def spy():          # every BLAS call runs in it (a BLAS plan, or its words: matmul_words.py)
            used.append("blas")
            return single()
        blas.single_threaded = spy
        try:
            lc.set_matmul_backend("blas")
            got = prog.run(x=xv, w=wv)[0]
        finally:
            blas.single_threaded = single
        assert used == ["blas"]
        np.testing.assert_allclose(got, xv @ wv, rtol=1e-5, atol=1e-5)
    finally:
        lc.set_matmul_backend(old)


def test_eager_prepared_run_raises_a_bad_id_and_stays_usable(monkeypatch):
    """An eager expression's prepared run (NativePlan.buffers_runner, made at the plan's second
    native run) raises IndexOutOfBounds for a bad id and gives NumPy's values before and after
    (the status words are cleared for the next run)."""
    from lazycandle import compiler
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    tv = np.arange(40, dtype=np.float32).reshape(5, 8) / 40
    t = lc.tensor(tv)

    def step(ids):
        y = (t * 2.0).index_select(lc.tensor(np.array(ids, np.int64)), 0).exp()
        return compiler.trace_key(y._node), y.numpy()
    for _ in range(3):          # the plan's prepared run is made at its second native run
        key, got = step([4, 0, 2])
        np.testing.assert_allclose(got, np.exp(tv[[4, 0, 2]] * 2), rtol=1e-6)
    bound = compiler._eager.get(key)[0]
    assert bound._fast and bound._fast[1] is not None, "no prepared run"
    for bad in ([1, 5, 0], [-1, 0, 0], [0, 0, 99]):
        with pytest.raises(lc.IndexOutOfBounds, match="index_select"):
            step(bad)
    _, got = step([3, 3, 1])
    np.testing.assert_allclose(got, np.exp(tv[[3, 3, 1]] * 2), rtol=1e-6)
