"""Kernels compiling on several threads at once (issue 41 item 2): codegen/llvm_work.py runs
LLVM outside llvmlite's global lock, codegen/jit._once compiles each key once whatever the
threads asking, codegen/compile_pool.py compiles a new plan's kernels ahead of use.  The code
must be the same as one thread compiling on first use: the same object bytes, the same results."""
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import lazycandle as lc
from lazycandle import config
from lazycandle.codegen import compile_pool, jit, llvm_work, progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(lc.__file__)))


@pytest.fixture(autouse=True)
def _own_cache_dir(monkeypatch, tmp_path):
    """In-process compiles write to a temporary disk cache, never the user's."""
    monkeypatch.setenv("LAZYCANDLE_CACHE_DIR", str(tmp_path / "kernels"))

GRAPH = """
import json, sys, numpy as np, lazycandle as lc
from lazycandle import nn
from lazycandle.codegen import compile_pool, jit
rng = np.random.default_rng(3)
a = rng.standard_normal((37, 53)).astype(np.float32)
b = rng.standard_normal((53,)).astype(np.float32)
x, y = lc.tensor(a), lc.tensor(b)
lc.config.set_matmul_backend("tiled")       # (auto would measure: the two processes may choose apart)
q = x[:36, :32].reshape(2, 18, 2, 16).transpose(1, 2)
outs = lc.realize((x @ x.t() * 0.5 + y[:37]).relu(), lc.nn.scaled_dot_product_attention(q, q, q, is_causal=True),
                  nn.softmax(x, -1), (x * 2.0 + y).exp(), x.t().contiguous() * 3.0, x.sum(0), x.max(1),
                  (x - x.mean_keepdim(1)).sqr().mean_keepdim(1), x.to_dtype(lc.f64).sin(), (x.abs() + 1.0).log(),
                  nn.gelu(x + y, "tanh"), x.narrow(1, 5, 17).tanh())
got = [o.numpy() for o in outs]
e = np.exp(a - a.max(1, keepdims=True))
qn = a[:36, :32].reshape(2, 18, 2, 16).transpose(0, 2, 1, 3)
sc = qn @ qn.transpose(0, 1, 3, 2) / 4.0 + np.triu(np.full((18, 18), -np.inf), 1)
pr = np.exp(sc - sc.max(-1, keepdims=True))
want = [np.maximum(a @ a.T * 0.5 + b[:37], 0), (pr / pr.sum(-1, keepdims=True)) @ qn, e / e.sum(1, keepdims=True),
        np.exp(a * 2 + b), a.T * 3, a.sum(0), a.max(1),
        ((a - a.mean(1, keepdims=True)) ** 2).mean(1, keepdims=True), np.sin(a.astype(np.float64)),
        np.log(np.abs(a) + 1)]
ok = all(np.allclose(g, w, rtol=1e-4, atol=1e-4) for g, w in zip(got, want))
print(json.dumps({"ok": ok, "bytes": [g.tobytes().hex() for g in got], "stats": jit.stats,
                  "background": compile_pool.stats["background"]}))
"""


def _graph(threads: str, cache="off"):
    env = dict(os.environ, PYTHONPATH=ROOT, LAZYCANDLE_CACHE_DIR=str(cache), LAZYCANDLE_COMPILE_THREADS=threads,
               LAZYCANDLE_PROGRESS="0")
    r = subprocess.run([sys.executable, "-c", GRAPH], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_prefetched_kernels_give_the_bits_of_kernels_compiled_on_first_use():
    serial, ahead = _graph("0"), _graph("2")
    assert serial["ok"] and ahead["ok"]
    assert serial["background"] == 0 and ahead["background"] > 0, ahead
    assert ahead["bytes"] == serial["bytes"]
    assert ahead["stats"]["compiled"] == serial["stats"]["compiled"]       # nothing compiled twice


def test_two_processes_compiling_ahead_into_one_cache_dir(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, LAZYCANDLE_CACHE_DIR=str(tmp_path), LAZYCANDLE_COMPILE_THREADS="2",
               LAZYCANDLE_PROGRESS="0")
    procs = [subprocess.Popen([sys.executable, "-c", GRAPH], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert all(o["ok"] and o["stats"]["disk_dropped"] == 0 for o in outs)
    assert outs[0]["bytes"] == outs[1]["bytes"]
    from lazycandle import diskcache
    entries = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".o")]
    assert entries and not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".tmp")]
    for p in entries:
        assert isinstance(diskcache.decode(open(p, "rb").read(), {}), tuple), p
    warm = _graph("2", tmp_path)
    assert warm["ok"] and warm["bytes"] == outs[0]["bytes"]
    assert warm["stats"]["disk_writes"] == 0 and warm["stats"]["disk_hits"] == outs[0]["stats"]["compiled"]


def _ir_texts() -> list:
    """IR of a few real kernels (elementwise, reduction, row, transposed copy)."""
    x = lc.tensor(np.linspace(-1, 1, 6 * 70, dtype=np.float32).reshape(6, 70))
    with_ir = []
    before = {id(m) for m in jit._kernels.modules()}
    lc.realize((x * 1.5).tanh(), x.sum(1), lc.nn.softmax(x, -1), x.t().contiguous() + 1.0)
    for m in jit._kernels.modules():
        if id(m) not in before or len(with_ir) < 4:
            with_ir.append(m.ir_text)
    return with_ir[:8]


def test_unlocked_llvm_calls_on_two_threads_give_llvmlites_objects():
    texts = _ir_texts()
    h = jit._host()
    with jit._lock:
        want = [h["tm"].emit_object(jit._optimize(t)) for t in texts]   # llvmlite's own (locked) calls
    got = {}

    def work(k):
        got[k] = [llvm_work.object_code(h, t) for t in texts * 2]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert llvm_work._entry_points(h["llvm"]), "llvmlite's entry points were not found: compiles are serial"
    for k in range(2):
        assert got[k] == want * 2


def test_once_compiles_a_key_once_for_many_threads_and_passes_errors_on():
    calls, gate = [], threading.Event()

    def make():
        calls.append(1)
        gate.wait(10)
        return "module"

    out = []
    threads = [threading.Thread(target=lambda: out.append(jit._once(("test", "k"), make))) for _ in range(6)]
    for t in threads:
        t.start()
    while ("test", "k") not in jit._inflight:
        pass
    gate.set()
    for t in threads:
        t.join()
    assert calls == [1] and out == ["module"] * 6 and ("test", "k") not in jit._inflight

    def bad():
        raise ValueError("broken kernel")

    with pytest.raises(ValueError, match="broken kernel"):
        jit._once(("test", "bad"), bad)
    assert jit._once(("test", "bad"), lambda: "fixed") == "fixed"        # an error is not remembered


def test_many_threads_asking_for_one_new_kernel_compile_it_once(monkeypatch):
    monkeypatch.setattr(config, "cache_dir", lambda: None)
    before = jit.stats["compiled"]
    x = lc.tensor(np.arange(40, dtype=np.float32))
    results = []

    def run():
        results.append((x * 7.25 - 0.125).cos().numpy())

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert jit.stats["compiled"] - before == 1
    want = np.cos(np.arange(40, dtype=np.float32) * 7.25 - 0.125)
    assert all(np.allclose(r, want, rtol=1e-6, atol=1e-6) for r in results) and len(results) == 4


def test_compile_threads_setting(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_COMPILE_THREADS", "0")
    assert config.compile_threads() == 0
    x = lc.tensor(np.arange(12, dtype=np.float32))
    assert compile_pool.prefetch([]) == 0
    monkeypatch.setenv("LAZYCANDLE_COMPILE_THREADS", "3")
    assert config.compile_threads() == 3
    monkeypatch.delenv("LAZYCANDLE_COMPILE_THREADS")
    with config.num_threads(1):
        assert config.compile_threads() == 0
    with config.num_threads(2):
        assert config.compile_threads() == 2
    assert np.array_equal((x + 1.0).numpy(), np.arange(12, dtype=np.float32) + 1)


def test_quiet_holds_background_compiles_back(monkeypatch):
    from lazycandle.codegen import fused
    from lazycandle.ir.kernels import EwSpec
    monkeypatch.setattr(config, "cache_dir", lambda: None)
    monkeypatch.setenv("LAZYCANDLE_COMPILE_THREADS", "2")
    x = lc.tensor(np.arange(30, dtype=np.float32))
    plan_specs = []
    real = compile_pool.prefetch
    monkeypatch.setattr(compile_pool, "prefetch", lambda specs: plan_specs.extend(specs) or 0)
    lc.realize((x * 3.5 + 0.25).tanh(), (x - 1.0).exp())
    monkeypatch.setattr(compile_pool, "prefetch", real)
    specs = [s for s in plan_specs if isinstance(s, EwSpec)]
    assert specs
    fused.ew_kernels.clear()                 # forget them: the threads have them to compile again
    jit._kernels.clear()
    with compile_pool.quiet():
        assert compile_pool.prefetch(specs + specs[::-1]) == len(set(specs))   # each kernel queued once
        assert compile_pool.pending() == len(specs)               # queued, none started
        assert not any(fused.ew_kernels.ready(s) for s in specs)
    compile_pool.wait_idle()
    assert all(fused.ew_kernels.ready(s) for s in specs)


def test_busy_seconds_and_kernel_count_over_two_threads(monkeypatch):
    st = dict(progress._st, depth=0, start=None, busy=0.0, busy_from=None, count=0, thread=None)
    monkeypatch.setattr(progress, "_st", st)
    monkeypatch.setattr(progress, "enabled", lambda: False)
    inside, release = threading.Barrier(3), threading.Event()

    def compile_one(what):
        with progress.compiling(what):
            with progress.compiling(what + " part"):          # nesting on a thread: one kernel
                inside.wait(10)
                release.wait(10)

    threads = [threading.Thread(target=compile_one, args=(f"k{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    inside.wait(10)
    assert st["depth"] == 2 and st["count"] == 2
    mid = progress.busy_seconds()
    release.set()
    for t in threads:
        t.join()
    assert st["depth"] == 0 and st["busy_from"] is None
    assert mid <= progress.busy_seconds() == st["busy"]


def test_two_specs_building_one_ir_run_llvm_once(monkeypatch, tmp_path):
    text = _ir_texts()[0]
    name = text.split("define void @\"", 1)[1].split('"', 1)[0]
    calls = []
    real = llvm_work.object_code
    monkeypatch.setattr(llvm_work, "object_code", lambda *a: calls.append(1) or real(*a))
    one, n1 = jit.compile_spec("tests.same_ir", ("first", id(calls)), lambda: (text, name))
    two, n2 = jit.compile_spec("tests.same_ir", ("second", id(calls)), lambda: (text, name))
    assert one is not two and n1 == n2 == name and len(calls) <= 1
    assert one._obj == two._obj and one.address(name) and two.address(name)


def test_the_shared_b_packer_is_exported_by_its_drivers_module(monkeypatch):
    """The "pack_b" role is a second export of the tiled GEMM's module (one LLVM compile for
    both), and a GEMM whose threads share one packed B gives the bits of one thread packing
    its own panels."""
    from dataclasses import replace
    from lazycandle.codegen import gemm
    from lazycandle.runtime import matmul as MM
    monkeypatch.setattr(config, "cache_dir", lambda: None)
    spec = gemm.tiled_spec(lc.f32)
    driver, packer = gemm.get_kernel(spec), gemm.get_kernel(replace(spec, role="pack_b"))
    assert packer._module is driver._module
    assert packer._module.address(f"lc_gemm_{spec.key}_pack_b") != packer._module.address(f"lc_gemm_{spec.key}")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((611, 300)).astype(np.float32)
    b = rng.standard_normal((300, 301)).astype(np.float32)
    outs = []
    for threads in (2, 1):
        monkeypatch.setattr(MM, "_plans", {})
        with config.num_threads(threads):
            plan = MM.plan_for(lc.tensor(a)._node.layout, lc.tensor(b)._node.layout, lc.f32, "tiled", threads)
            assert bool(plan.shared_rows) == (threads == 2)
            out = np.zeros((611, 301), np.float32)
            MM.run_plan(plan, a.ravel(), 0, b.ravel(), 0, out.ravel())
            outs.append(out)
    assert outs[0].tobytes() == outs[1].tobytes()
    assert np.allclose(outs[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_node_steps_list_the_kernels_their_setup_compiles(monkeypatch):
    """A plan lists its matmul's tiled GEMM and epilogue, its attention and index kernels, and
    a small-m GEMM before the steps are set up (steps.NodeStep.ahead), and those are the
    kernels the steps then use: the compile threads can take them beside the fused kernels."""
    from lazycandle.codegen import attention, gemm, gemm_epilogue, gemm_skinny
    from lazycandle.runtime import matmul_auto
    monkeypatch.setattr(config, "cache_dir", lambda: None)
    monkeypatch.setenv("LAZYCANDLE_COMPILE_THREADS", "2")
    monkeypatch.setattr(matmul_auto, "_choices", {})
    listed = []
    monkeypatch.setattr(compile_pool, "prefetch", lambda items: listed.extend(items) or 0)
    rng = np.random.default_rng(8)
    x = lc.tensor(rng.standard_normal((2, 40, 64)).astype(np.float32))
    w = lc.tensor(rng.standard_normal((64, 96)).astype(np.float32))
    b = lc.tensor(rng.standard_normal((96,)).astype(np.float32))
    before = config.get_matmul_backend()
    config.set_matmul_backend("tiled")
    try:
        h = ((x @ w) + b).relu()
        q, k, v = (h[..., i * 32:(i + 1) * 32].reshape(2, 40, 2, 16).transpose(1, 2) for i in range(3))
        out = lc.nn.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
    finally:
        config.set_matmul_backend(before)
    pairs = [i for i in listed if isinstance(i, tuple)]
    kinds = {id(cache): spec for cache, spec in pairs}
    assert gemm.tiled_spec(lc.f32) == kinds.get(id(gemm.get_kernel))
    assert id(gemm_epilogue.get_kernel) in kinds and id(attention._kernels) in kinds
    for cache, spec in pairs:
        assert cache.ready(spec), f"listed {spec} but the step compiled another kernel"
    listed.clear()
    table = x.reshape(80, 64)
    rows = (table.index_select(lc.tensor(np.array([3, 0, 79, 3], np.int64)), 0) + 1.0).numpy()
    assert np.array_equal(rows, x.numpy().reshape(80, 64)[[3, 0, 79, 3]] + 1)
    index = [i for i in listed if type(i).__name__.startswith("Index")]
    assert len(index) == 1 and type(index[0]).codegen[type(index[0])].compiled.ready(index[0])
    listed.clear()
    config.set_matmul_backend("auto")
    try:
        small = ((x[0, :3] @ w) * 2.0).numpy()      # auto: 3 rows run on the small-m kernel by rule
    finally:
        config.set_matmul_backend(before)
    assert np.allclose(small, x.numpy()[0, :3] @ w.numpy() * 2, rtol=1e-4, atol=1e-4)
    skinny = [i for i in listed if isinstance(i, gemm_skinny.SkinnySpec)]
    assert len(skinny) == 1 and gemm_skinny.get_kernel.ready(skinny[0])
    hh = np.maximum(x.numpy() @ w.numpy() + b.numpy(), 0)
    qn, kn, vn = (hh[..., i * 32:(i + 1) * 32].reshape(2, 40, 2, 16).transpose(0, 2, 1, 3) for i in range(3))
    s = qn @ kn.transpose(0, 1, 3, 2) / 4.0 + np.triu(np.full((40, 40), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    assert np.allclose(out, (p / p.sum(-1, keepdims=True)) @ vn, rtol=1e-4, atol=1e-4)
