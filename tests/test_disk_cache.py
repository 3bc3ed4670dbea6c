"""The disk kernel cache (LAZYCANDLE_CACHE_DIR) verifies every entry: an object whose bytes,
header or compile key do not check out, or that does not link, is dropped and recompiled with
one warning, and the entry is rewritten — never loaded as is."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

import lazycandle as lc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(lc.__file__)))

PROBE = """
import json, warnings
import numpy as np, lazycandle as lc
from lazycandle.codegen import jit
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    x = np.linspace(-2, 2, 37, dtype=np.float32)
    a = (lc.tensor(x) * 3.25).tanh().numpy()
    b = (lc.tensor(x) + 0.5).sin().numpy()
print(json.dumps({"tanh": bool(np.allclose(a, np.tanh(x * 3.25), rtol=1e-5, atol=1e-6)),
                  "sin": bool(np.allclose(b, np.sin(x + 0.5), rtol=1e-5, atol=1e-6)),
                  "warnings": [str(m.message) for m in w if "kernel cache" in str(m.message)],
                  "stats": jit.stats}))
"""


def _run(cache):
    env = dict(os.environ, LAZYCANDLE_CACHE_DIR=str(cache), PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, f"probe died with {r.returncode}: {r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _entries(cache):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs)


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
