"""lc.clear_caches / lc.cache_info and the bounded (LRU) plan cache."""
import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import lazycandle as lc
from lazycandle import caches
from lazycandle import compiler
from conftest import run_in_threads, run_probe


def _data(n):
    return np.linspace(-1, 1, n, dtype=np.float32)


def _chain(n, k=1):
    """exp(a * 2 + k) on n elements: its structure depends on n (and on k while scalars are
    compiled into kernels)."""
    return (lc.tensor(_data(n)) * 2.0 + float(k)).exp()


def _expected(n, k=1):
    return np.exp(_data(n) * 2 + k)


def test_cache_info_reports_counts_and_bytes():
    info = lc.cache_info()
    for key in ("plans", "kernels", "memory_bytes", "disk_bytes", "disk_entries"):
        assert isinstance(info[key], int) and info[key] >= 0, key
    _chain(37, 1).numpy()
    info = lc.cache_info()
    assert info["plans"] >= 1 and info["kernels"] >= 1 and info["memory_bytes"] > 0


def test_clear_caches_empties_plans_and_kernels():
    _chain(41, 1).numpy()
    m = lc.tensor(np.ones((4, 4), np.float32))
    (m @ m).numpy()
    lc.clear_caches()
    info = lc.cache_info()
    assert info["plans"] == 0 and info["kernels"] == 0 and info["memory_bytes"] == 0
    assert all(n == 0 for n in info["caches"].values()), info["caches"]


def _deep(k, n=16):
    """k exps of a: one structure (one plan) per k."""
    t = lc.tensor(_data(n))
    for _ in range(k):
        t = t.exp()
    return t


def test_plan_cache_is_bounded_to_its_size(monkeypatch):
    monkeypatch.setattr(compiler._plans, "maxsize", 3)
    lc.clear_caches()
    for k in range(1, 11):
        _deep(k).numpy()
    assert lc.cache_info()["plans"] == 3


def test_one_plan_serves_every_size_of_a_size_class():
    """Sizes 2.. of one structure are one size class: one plan, bound to each size."""
    lc.clear_caches()
    for n in (2, 5, 16, 17, 100, 1000):
        np.testing.assert_allclose(_chain(n, 3).numpy(), _expected(n, 3), rtol=1e-6)
    assert lc.cache_info()["plans"] == 1


def test_plan_cache_evicts_least_recently_used():
    lru = caches.LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1          # "a" is now the most recent
    lru.put("c", 3)
    assert lru.get("b") is None and lru.get("a") == 1 and lru.get("c") == 3
    assert lru.put("c", 99) == 3      # a racing second compile keeps the first entry


def test_plan_cache_size_comes_from_env():
    code = ("import lazycandle as lc, numpy as np\n"
            "from lazycandle import compiler\n"
            "a = lc.tensor(np.ones(8, np.float32))\n"
            "for k in range(1, 11): sum([a] * k).numpy()\n"
            "print(compiler._plans.maxsize, lc.cache_info()['plans'])\n")
    env = dict(os.environ, LAZYCANDLE_PLAN_CACHE="3", LAZYCANDLE_CACHE_DIR="off")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "3"]


def test_plan_cache_size_parsing(monkeypatch):
    from lazycandle import config
    for env, want in (("", 512), ("3", 3), ("0", 0), ("-4", 0), ("many", 512)):
        monkeypatch.setenv("LAZYCANDLE_PLAN_CACHE", env)
        assert config.plan_cache_size() == want, env


def test_programs_and_tensors_still_run_after_clear():
    x = lc.placeholder("x", (50,), lc.f32)
    prog = lc.compile([(x * 3.0 - 1.0).tanh()])
    w = lc.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    prog_mm = lc.compile([lc.placeholder("m", (2, 3), lc.f32) @ w])
    lc.clear_caches()
    gc.collect()          # code only the caches referenced would be unlinked now
    xs = np.linspace(-2, 2, 50, dtype=np.float32)
    np.testing.assert_allclose(prog(x=xs)[0], np.tanh(xs * 3 - 1), rtol=1e-6, atol=1e-6)
    m = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(prog_mm(m=m)[0], m @ w.numpy(), rtol=1e-6)
    # the same structure realized again after the clear compiles afresh and is right
    np.testing.assert_allclose(_chain(50, 1).numpy(), _expected(50), rtol=1e-6)
    assert lc.cache_info()["plans"] >= 1


_EPILOGUE_AFTER_CLEAR = """
import gc, os
import numpy as np
import lazycandle as lc
lc.set_matmul_backend("tiled")
rng = np.random.default_rng(0)
w = lc.tensor(rng.standard_normal((32, 48)).astype(np.float32))
bias = lc.tensor(rng.standard_normal((48,)).astype(np.float32))
prog = lc.compile([(lc.placeholder("x", (64, 32), lc.f32) @ w + bias).relu()])
xs = rng.standard_normal((64, 32)).astype(np.float32)
want = np.maximum(xs @ w.numpy() + bias.numpy(), 0)
for _ in range(2):          # the second run builds the native program
    np.testing.assert_allclose(prog(x=xs)[0], want, rtol=1e-5, atol=1e-5)
lc.clear_caches()
gc.collect()                # the epilogue's module is unlinked here unless the plan holds it
for mode in ("", "python"):     # the native program, then the per-kernel path
    os.environ["LAZYCANDLE_EXEC"] = mode
    np.testing.assert_allclose(prog(x=xs)[0], want, rtol=1e-5, atol=1e-5)
print("ok")
"""


def test_a_tiled_matmul_epilogue_outlives_clear_caches():
    """A tiled GEMM plan stores its epilogue's address in the driver's parameter block: the plan
    must keep that compiled function alive (once the crash of a compiled GPT-2 training step
    run again after clear_caches)."""
    assert run_probe(_EPILOGUE_AFTER_CLEAR).strip().endswith("ok")


def test_clear_caches_disk_deletes_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_CACHE_DIR", str(tmp_path))
    lc.clear_caches()
    _chain(23, 5).numpy()
    info = lc.cache_info()
    assert info["disk_entries"] >= 1 and info["disk_bytes"] > 0
    lc.clear_caches()
    assert lc.cache_info()["disk_entries"] == info["disk_entries"]    # memory only by default
    lc.clear_caches(disk=True)
    assert lc.cache_info()["disk_entries"] == 0 and lc.cache_info()["disk_bytes"] == 0


def test_plan_cache_under_concurrent_realize_and_clear(monkeypatch):
    monkeypatch.setattr(compiler._plans, "maxsize", 2)

    def work(seed):
        for i in range(12):
            n = 8 + (seed * 12 + i) % 5
            got = _chain(n, 1).numpy()
            np.testing.assert_allclose(got, _expected(n), rtol=1e-6)
            if i % 4 == 3:
                lc.clear_caches()

    errors = run_in_threads(work, 3)
    assert not errors, errors
    assert lc.cache_info()["plans"] <= 2


@pytest.fixture(autouse=True)
def _fresh_caches():
    yield
    lc.clear_caches()


def test_import_lazycandle_does_not_load_networkx_llvm_binding_or_blas():
    code = ("import sys, lazycandle\n"
            "print(sorted(m for m in ('networkx', 'llvmlite.binding', 'scipy_openblas32') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_realizing_an_elementwise_chain_does_not_load_networkx():
    code = ("import sys, numpy as np, lazycandle as lc\n"
            "a = lc.tensor(np.ones(1000, np.float32))\n"
            "(a * a + a).exp().numpy()\n"
            "print('networkx' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_warm_new_process_loads_kernels_by_spec_without_building_ir(tmp_path):
    env = dict(os.environ, LAZYCANDLE_CACHE_DIR=str(tmp_path))
    code = ("import sys, numpy as np, lazycandle as lc\n"
            "from lazycandle.codegen import elementwise as ew, reduce as red, jit\n"
            "if sys.argv[1] == 'cold-build-forbidden':\n"
            "    def boom(*a): raise AssertionError('IR built on a disk hit')\n"
            "    real_ew, ew.build, red.build = ew.build, boom, boom\n"
            "x = lc.tensor(np.linspace(0, 1, 100, dtype=np.float32))\n"
            "y, s = lc.realize((x * x + x).exp(), (x * 2.0).sum(0))\n"
            "np.testing.assert_allclose(y.numpy(), np.exp(x.numpy() ** 2 + x.numpy()), rtol=1e-6)\n"
            "np.testing.assert_allclose(s.item(), (x.numpy() * 2).sum(), rtol=1e-5)\n"
            "if sys.argv[1] == 'cold-build-forbidden':\n"
            "    ew.build = real_ew\n"
            "    assert 'define' in lc.dump((x * x + x).exp(), stage='llvm')\n"
            "print(jit.stats['disk_hits'])\n")
    first = subprocess.run([sys.executable, "-c", code, "warm"], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([sys.executable, "-c", code, "cold-build-forbidden"], env=env, capture_output=True,
                            text=True)
    assert second.returncode == 0, second.stderr
    assert int(second.stdout.split()[-1]) >= 2


def test_warm_new_process_links_fused_kernels_without_importing_their_generators(tmp_path):
    """codegen/fused.py: on a disk hit the elementwise, reduce and row generators (and the
    codecs and vector math behind them) stay unimported; a miss imports the one it needs."""
    env = dict(os.environ, LAZYCANDLE_CACHE_DIR=str(tmp_path))
    code = ("import sys, numpy as np, lazycandle as lc\n"
            "x = lc.tensor(np.linspace(0, 1, 100, dtype=np.float32))\n"
            "y, s = lc.realize((x * x + x).exp(), (x * 2.0).sum(0))\n"
            "np.testing.assert_allclose(y.numpy(), np.exp(x.numpy() ** 2 + x.numpy()), rtol=1e-6)\n"
            "gens = ('elementwise', 'reduce', 'row', 'codecs', 'vmath')\n"
            "print(sorted(g for g in gens if 'lazycandle.codegen.' + g in sys.modules))\n")
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "'elementwise'" in first.stdout and "'reduce'" in first.stdout     # built: imported
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split("\n")[-2] == "[]", second.stdout


def test_spec_keyed_disk_entries_are_not_loaded_after_the_code_generator_changes(tmp_path):
    env = dict(os.environ, LAZYCANDLE_CACHE_DIR=str(tmp_path))
    code = ("import sys, numpy as np, lazycandle as lc\n"
            "from lazycandle.codegen import jit\n"
            "if sys.argv[1] == 'edited':\n"
            "    jit._stamp[:] = ['source of an edited code generator']\n"
            "x = lc.tensor(np.linspace(0, 1, 64, dtype=np.float32))\n"
            "np.testing.assert_allclose(((x * 3.0).tanh()).numpy(), np.tanh(x.numpy() * 3), rtol=1e-6)\n"
            "print(jit.stats['disk_hits'])\n")

    def run(mode):
        r = subprocess.run([sys.executable, "-c", code, mode], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return int(r.stdout.split()[-1])
    assert run("same") == 0 and run("same") == 1
    assert run("edited") == 0          # compiled afresh under the new stamp
