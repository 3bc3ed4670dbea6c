"""The disk kernel cache (lazycandle/diskcache.py, SPEC "Caches"): on by default under
$XDG_CACHE_HOME/lazycandle, off with LAZYCANDLE_CACHE_DIR=off, bounded (LRU) by
LAZYCANDLE_CACHE_MAX, shared safely between processes.  Every entry is verified: an object
whose bytes, header or compile key (host ISA, LLVM, code generator) do not check out, or that
does not link, is dropped and recompiled with one warning and the entry rewritten -- never
loaded as is.  A read-only, full or vanishing directory: the kernels compile and run, one
warning."""
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import lazycandle as lc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(lc.__file__)))

PROBE = """
import json, warnings
import numpy as np, lazycandle as lc
from lazycandle.codegen import jit
jit._stamp[:] = ["pinned"]    # (a code generator edited meanwhile in this checkout changes nothing)
#BEFORE
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    x = np.linspace(-2, 2, 37, dtype=np.float32)
    a = (lc.tensor(x) * 3.25).tanh().numpy()
    #BETWEEN
    b = (lc.tensor(x) + 0.5).sin().numpy()
print(json.dumps({"tanh": bool(np.allclose(a, np.tanh(x * 3.25), rtol=1e-5, atol=1e-6)),
                  "sin": bool(np.allclose(b, np.sin(x + 0.5), rtol=1e-5, atol=1e-6)),
                  "warnings": [str(m.message) for m in w if "kernel cache" in str(m.message)],
                  "stats": jit.stats, "dir": lc.cache_info()["disk_dir"]}))
"""


def _env(cache, **extra):
    """os.environ for a probe: the cache directory `cache` (None: unset, the default location)."""
    env = dict(os.environ, PYTHONPATH=ROOT, **extra)
    env.pop("LAZYCANDLE_CACHE_DIR", None)
    if cache is not None:
        env["LAZYCANDLE_CACHE_DIR"] = str(cache)
    return env


def _run(cache, before="", between="", **extra):
    code = PROBE.replace("#BEFORE", before).replace("#BETWEEN", between)
    r = subprocess.run([sys.executable, "-c", code], env=_env(cache, **extra), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, f"probe died with {r.returncode}: {r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _entries(cache):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if f.endswith(".o"))


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("warm")
    out = _run(cache)
    assert out["tanh"] and out["sin"] and out["stats"]["disk_hits"] == 0
    assert len(_entries(cache)) == 2, _entries(cache)
    return cache


def _split(data):
    nl = data.index(b"\n", data.index(b"\n") + 1)
    return data[:nl + 1], data[nl + 1:]


def _flip_object_byte(path, other):
    head, obj = _split(open(path, "rb").read())
    obj = bytearray(obj)
    obj[len(obj) // 2] ^= 0x04
    open(path, "wb").write(head + bytes(obj))


def _flip_header_byte(path, other):
    data = bytearray(open(path, "rb").read())
    data[data.index(b'"triple"') + 12] ^= 0x01
    open(path, "wb").write(bytes(data))


def _truncate(path, other):
    head, obj = _split(open(path, "rb").read())
    open(path, "wb").write(head + obj[:len(obj) // 2])


def _truncate_header(path, other):
    open(path, "wb").write(open(path, "rb").read()[:40])


def _garbage(path, other):
    n = os.path.getsize(path)
    open(path, "wb").write(bytes((i * 7919 + 13) % 251 for i in range(n)))


def _other_kernel(path, other):
    shutil.copyfile(other, path)


def _verified_but_unlinkable(path, other):
    """A header that checks out (right key, right sha256) around bytes that are no object file."""
    head, _ = _split(open(path, "rb").read())
    magic, meta = head.split(b"\n")[0] + b"\n", json.loads(head.split(b"\n")[1])
    obj = b"\x7fELF" + bytes(range(256)) * 8
    meta.update(obj_sha256=hashlib.sha256(obj).hexdigest(), obj_len=len(obj))
    open(path, "wb").write(magic + json.dumps(meta).encode() + b"\n" + obj)


@pytest.mark.parametrize("corrupt", [_flip_object_byte, _flip_header_byte, _truncate, _truncate_header,
                                     _garbage, _other_kernel, _verified_but_unlinkable],
                         ids=lambda f: f.__name__.strip("_"))
def test_bad_disk_entry_is_dropped_recompiled_and_rewritten(warm_cache, tmp_path, corrupt):
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    victim, other = _entries(cache)
    corrupt(victim, other)
    bad = open(victim, "rb").read()
    out = _run(cache)
    assert out["tanh"] and out["sin"], out
    assert len(out["warnings"]) == 1 and victim in out["warnings"][0], out["warnings"]
    assert out["stats"]["disk_dropped"] == 1 and out["stats"]["disk_hits"] == 1, out["stats"]
    assert os.path.exists(victim) and open(victim, "rb").read() != bad      # rewritten
    again = _run(cache)                                                      # and now good
    assert again["tanh"] and again["sin"] and again["warnings"] == []
    assert again["stats"]["disk_hits"] == 2 and again["stats"]["disk_dropped"] == 0


def test_many_bad_entries_warn_once(warm_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    for p in _entries(cache):
        _truncate(p, None)
    out = _run(cache)
    assert out["tanh"] and out["sin"] and len(out["warnings"]) == 1
    assert out["stats"]["disk_dropped"] == 2


def test_unreadable_entry_is_recompiled_with_a_warning(warm_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    victim, _ = _entries(cache)
    os.remove(victim)
    os.mkdir(victim)                       # open() fails: the entry cannot be read at all
    out = _run(cache)
    assert out["tanh"] and out["sin"] and len(out["warnings"]) == 1 and "unreadable" in out["warnings"][0]


# ---- where it lives, and the off switch ------------------------------------------------------
def test_on_by_default_under_xdg_cache_home_then_home(tmp_path):
    xdg = tmp_path / "xdg"
    out = _run(None, XDG_CACHE_HOME=str(xdg))
    assert out["tanh"] and out["sin"] and out["dir"] == str(xdg / "lazycandle")
    assert len(_entries(xdg / "lazycandle")) == 2 and out["stats"]["disk_writes"] == 2
    again = _run(None, XDG_CACHE_HOME=str(xdg))
    assert again["stats"]["disk_hits"] == 2 and again["stats"]["disk_writes"] == 0
    assert os.path.exists(xdg / "lazycandle" / "CACHEDIR.TAG")
    home = tmp_path / "home"                       # no XDG_CACHE_HOME (or a relative one): ~/.cache
    env = {"HOME": str(home), "XDG_CACHE_HOME": "relative/ignored"}
    out = _run(None, **env)
    assert out["dir"] == str(home / ".cache" / "lazycandle") and len(_entries(out["dir"])) == 2


@pytest.mark.parametrize("off", ["off", "OFF"])
def test_off_switch_writes_nothing(tmp_path, off):
    xdg = tmp_path / "xdg"
    out = _run(off, XDG_CACHE_HOME=str(xdg))
    assert out["tanh"] and out["sin"] and out["dir"] is None and out["warnings"] == []
    assert out["stats"]["disk_writes"] == 0 and not os.path.exists(xdg) and not os.path.exists(off)


def test_cache_info_and_clear_cli(warm_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)

    def cli(*args):
        r = subprocess.run([sys.executable, "-m", "lazycandle", *args], env=_env(cache), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout
    info = cli("cache", "info")
    assert str(cache) in info and "2 objects" in info
    assert "removed 2 objects" in cli("cache", "clear")
    assert _entries(cache) == [] and "0 objects" in cli("cache", "info")


def test_cache_max_parsing(monkeypatch):
    from lazycandle import config
    for env, want in (("", 1 << 30), ("4096", 4096), ("64M", 64 << 20), ("2GiB", 2 << 30), ("1.5k", 1536),
                      ("0", 0), ("lots", 1 << 30), ("inf", 1 << 30)):
        monkeypatch.setenv("LAZYCANDLE_CACHE_MAX", env)
        assert config.cache_max() == want, env


# ---- the LRU bound ----------------------------------------------------------------------------
def _key(i):
    return hashlib.sha256(f"entry {i}".encode()).hexdigest()


def _scans(monkeypatch):
    from lazycandle import diskcache
    scans, real_scan = [], diskcache._scan
    monkeypatch.setattr(diskcache, "_scan", lambda root: scans.append(root) or real_scan(root))
    return scans


OBJ = bytes(range(256)) * 4              # entries of ~1.1 KB


def test_lru_bound_evicts_least_recently_used(tmp_path, monkeypatch):
    from lazycandle import diskcache
    monkeypatch.setenv("LAZYCANDLE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LAZYCANDLE_CACHE_MAX", "10000")
    for i in range(6):
        diskcache.write(_key(i), {"n": i}, OBJ)
        os.utime(diskcache.path(_key(i)), (1000 + i, 1000 + i))   # written in order, 1 s apart
    assert diskcache.read(_key(0), {"n": 0})[0] == OBJ       # a hit: entry 0 is now the most recent
    for i in range(6, 12):
        diskcache.write(_key(i), {"n": i}, OBJ)
    kept = {i for i in range(12) if os.path.exists(diskcache.path(_key(i)))}
    total = sum(os.path.getsize(diskcache.path(_key(i))) for i in kept)
    lru_order = [1, 2, 3, 4, 5, 0, 6, 7, 8, 9, 10, 11]       # entry 0 used after 1-5 were written
    assert total <= 10000 and kept == set(lru_order[-len(kept):]) and 0 in kept and 1 not in kept, kept
    assert int(open(tmp_path / "usage").read()) == total
    assert diskcache.read(_key(3), {"n": 3}) is None        # evicted: a plain miss, no warning


def test_bound_is_kept_without_a_directory_scan_per_write(tmp_path, monkeypatch):
    from lazycandle import diskcache
    monkeypatch.setenv("LAZYCANDLE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LAZYCANDLE_CACHE_MAX", "50000")
    scans = _scans(monkeypatch)
    for i in range(40):                                     # ~45 KB: under the bound
        diskcache.write(_key(i), {"n": i}, OBJ)
    assert len(scans) == 1                                   # the first write counts the directory once
    for i in range(40, 160):
        diskcache.write(_key(i), {"n": i}, OBJ)
    entries = _entries(tmp_path)
    total = sum(os.path.getsize(p) for p in entries)
    assert total <= 50000 and len(entries) >= 35 and int(open(tmp_path / "usage").read()) == total
    assert len(scans) <= 1 + 120 // 4, f"{len(scans)} directory scans for 160 writes"


def test_small_bound_end_to_end(tmp_path):
    out = _run(tmp_path, LAZYCANDLE_CACHE_MAX="1")           # smaller than any entry: all evicted
    assert out["tanh"] and out["sin"] and out["warnings"] == [] and _entries(tmp_path) == []


def test_usage_total_is_rebuilt_when_missing_or_garbled(warm_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    (cache / "usage").write_text("garbage")
    out = _run(cache, between="lc.tensor(x).cos().numpy()")   # one new entry: recount
    assert out["stats"]["disk_writes"] == 1
    assert int((cache / "usage").read_text()) == sum(os.path.getsize(p) for p in _entries(cache))


# ---- another CPU, LLVM or code generator -----------------------------------------------------
FOREIGN_HOST = "jit._host(); jit._state['cpu'] = 'imaginary-cpu'; jit._state['features'] += ',+imaginary'"


def test_entries_of_another_cpu_are_never_loaded(tmp_path):
    foreign = _run(tmp_path, before=FOREIGN_HOST)
    theirs = _entries(tmp_path)
    assert foreign["tanh"] and foreign["sin"] and len(theirs) == 2
    ours = _run(tmp_path)
    assert ours["tanh"] and ours["sin"] and ours["stats"]["disk_hits"] == 0 and ours["warnings"] == []
    assert set(theirs) < set(_entries(tmp_path)) and len(_entries(tmp_path)) == 4   # theirs left alone
    assert _run(tmp_path, before=FOREIGN_HOST)["stats"]["disk_hits"] == 2


@pytest.mark.parametrize("field", ["cpu", "features", "llvm", "codegen"])
def test_entry_whose_key_names_another_host_or_generator_is_dropped(warm_cache, tmp_path, field):
    """An entry under our file name whose header names another host (a copied cache, a hash
    collision) fails the key check: dropped, recompiled, never linked."""
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    victim, _ = _entries(cache)
    head, obj = _split(open(victim, "rb").read())
    meta = json.loads(head.split(b"\n")[1])
    assert field in meta
    meta[field] = "something else"
    open(victim, "wb").write(head.split(b"\n")[0] + b"\n" + json.dumps(meta).encode() + b"\n" + obj)
    out = _run(cache)
    assert out["tanh"] and out["sin"] and out["stats"]["disk_hits"] == 1 and out["stats"]["disk_dropped"] == 1
    assert len(out["warnings"]) == 1 and f"compile key differs ({field})" in out["warnings"][0]


# ---- unusable directories --------------------------------------------------------------------
def test_cache_dir_that_cannot_be_created_warns_once(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = _run(blocker / "cache", between="lc.tensor(x).cos().numpy()")
    assert out["tanh"] and out["sin"] and out["stats"]["disk_writes"] == 0
    assert len(out["warnings"]) == 1 and "cannot write" in out["warnings"][0], out["warnings"]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes to read-only dirs")
def test_read_only_warm_cache_is_used_and_warns_once(warm_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    for d, _, _ in os.walk(cache):
        os.chmod(d, 0o555)
    try:
        out = _run(cache, between="lc.tensor(x).cos().numpy()")     # two hits, one new kernel
    finally:
        for d, _, _ in os.walk(cache):
            os.chmod(d, 0o755)
    assert out["tanh"] and out["sin"] and out["stats"]["disk_hits"] == 2
    assert len(out["warnings"]) == 1 and "cannot write" in out["warnings"][0]


def test_full_disk_warns_once_and_leaves_no_temp_files(tmp_path, monkeypatch):
    import errno
    import warnings
    from lazycandle import diskcache
    monkeypatch.setenv("LAZYCANDLE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(diskcache, "_warned", set())
    real_open = open

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def write(self, data):
            self.f.write(data[:100])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(diskcache, "open", lambda p, mode="r", *a: Full(real_open(p, mode, *a))
                        if "w" in mode else real_open(p, mode, *a), raising=False)
    lc.clear_caches()
    x = np.linspace(-1, 1, 29, dtype=np.float64)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = [(lc.tensor(x) * 1.5).erf().numpy(), (lc.tensor(x) - 0.25).cos().numpy()]
    np.testing.assert_allclose(got[0], [math.erf(v * 1.5) for v in x], rtol=1e-13)
    np.testing.assert_allclose(got[1], np.cos(x - 0.25), rtol=1e-13)
    msgs = [str(m.message) for m in w if "kernel cache" in str(m.message)]
    assert len(msgs) == 1 and "No space left" in msgs[0], msgs
    assert [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith((".o", ".tmp"))] == []


def test_cache_dir_vanishing_mid_run(warm_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    out = _run(cache, between=f"import shutil; shutil.rmtree({str(cache)!r}); lc.clear_caches()")
    assert out["tanh"] and out["sin"] and out["warnings"] == []
    assert len(_entries(cache)) == 1                     # recreated with the kernel compiled after


# ---- two processes at once ---------------------------------------------------------------------
BLOCK = """
import json, numpy as np, lazycandle as lc
from lazycandle.codegen import jit
jit._stamp[:] = ["pinned"]
rng = np.random.default_rng(0)
x, g, b = rng.standard_normal((16, 64)), rng.standard_normal(64), rng.standard_normal(64)
h = lc.nn.layer_norm(lc.tensor(x), lc.tensor(g), lc.tensor(b))
z = (lc.nn.softmax(h * 3.0, -1) + lc.tensor(x)).sum(0)
m = x - x.mean(-1, keepdims=True)
e = np.exp(3 * (m / np.sqrt((m * m).mean(-1, keepdims=True) + 1e-5) * g + b))
ok = bool(np.allclose(z.numpy(), (e / e.sum(-1, keepdims=True) + x).sum(0), rtol=1e-12, atol=1e-12))
print(json.dumps({"ok": ok, "stats": jit.stats}))
"""


def test_two_processes_compiling_the_same_program_into_one_dir(tmp_path):
    env = _env(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", BLOCK], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        got = json.loads(out.strip().splitlines()[-1])
        assert got["ok"] and got["stats"]["disk_dropped"] == 0, got
    from lazycandle import diskcache
    entries = _entries(tmp_path)
    assert entries and not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".tmp")]
    for p in entries:                                        # every entry whole and self-consistent
        assert isinstance(diskcache.decode(open(p, "rb").read(), {}), tuple), p
    actual = sum(os.path.getsize(p) for p in entries)
    assert actual <= int((tmp_path / "usage").read_text()) <= 2 * actual
    third = subprocess.run([sys.executable, "-c", BLOCK], env=env, capture_output=True, text=True, timeout=300)
    got = json.loads(third.stdout.strip().splitlines()[-1])
    assert got["ok"] and got["stats"]["disk_writes"] == 0 and got["stats"]["disk_hits"] == len(entries)
