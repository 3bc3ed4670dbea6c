"""The IR dump tool (lc.dump, Program.dump, LAZYCANDLE_DUMP) and the command line."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import lazycandle as lc

ENV = dict(os.environ)


def f32_lanes():
    """f32 lanes of the host's widest vector register (8 on AVX2, 16 on AVX-512)."""
    from lazycandle.codegen import jit
    return jit.vector_bits() // 32


def _inputs():
    w = f32_lanes()
    return (np.arange(2 * w * w, dtype=np.float32).reshape(2 * w, w) / (w * w),
            np.arange(2 * w * w, dtype=np.float32).reshape(w, 2 * w) / (-w * w))


@pytest.fixture
def graph():
    """A (2W, W) graph with a transposed input: W = f32 lanes, so it takes the register transpose."""
    a, b = (lc.tensor(x) for x in _inputs())
    return ((a * 2 + b.t()).exp() - a).relu()


def test_dump_stages(graph):
    g = lc.dump(graph, stage="graph")
    assert "transpose" in g and "exp" in g and "relu" in g
    o = lc.dump(graph, stage="optimized")
    assert f"strides (1, {2 * f32_lanes()})" in o
    s = lc.dump(graph, stage="schedule")
    assert s.count("kernel ") == 1 and "fuses" in s and "vector width" in s and "register transpose" in s
    ll = lc.dump(graph, stage="llvm")
    assert "define void" in ll and "shufflevector" in ll
    asm = lc.dump(graph, stage="asm")
    assert "ret" in asm
    assert graph.is_lazy  # dumping compiles but does not run
    a, b = _inputs()
    np.testing.assert_allclose(graph.numpy(), np.maximum(np.exp(a * 2 + b.T) - a, 0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fmt,marker", [("dot", "digraph"), ("mermaid", "flowchart")])
def test_dump_formats(graph, fmt, marker):
    for stage in ("graph", "optimized", "schedule"):
        assert lc.dump(graph, stage=stage, fmt=fmt).startswith(marker)


def test_dump_bad_stage(graph):
    with pytest.raises(ValueError):
        lc.dump(graph, stage="nope")
    with pytest.raises(ValueError):
        lc.dump(graph, stage="graph", fmt="svg")


def test_program_dump():
    x = lc.placeholder("x", (4, 4))
    p = lc.compile([x.exp().sum(-1)])
    assert "reduce" in p.dump("schedule")


def test_env_dump_to_dir(tmp_path):
    code = ("import numpy as np, lazycandle as lc\n"
            "a = lc.tensor(np.arange(12.0, dtype=np.float32))\n"
            "print((a * 1.5 + 2.25).exp().numpy()[0])\n")
    env = dict(ENV, LAZYCANDLE_DUMP="graph,schedule,llvm", LAZYCANDLE_DUMP_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(tmp_path))
    assert any(n.endswith(".schedule.txt") for n in names) and any(n.endswith(".llvm.txt") for n in names)


def test_env_dump_to_stderr():
    code = "import numpy as np, lazycandle as lc\nlc.tensor(np.ones(3, np.float32)).exp().numpy()\n"
    env = dict(ENV, LAZYCANDLE_DUMP="schedule")
    env.pop("LAZYCANDLE_DUMP_DIR", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "kernel 0: elementwise" in r.stderr


def test_cli_info_and_dump(tmp_path):
    r = subprocess.run([sys.executable, "-m", "lazycandle", "info"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "threads" in r.stdout and "BLAS" in r.stdout
    script = tmp_path / "s.py"
    script.write_text("import numpy as np, lazycandle as lc\nlc.tensor(np.ones(5, np.float32)).sin().numpy()\n")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "lazycandle", "dump", str(script), "--stage", "schedule,asm",
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert any(n.endswith(".asm.txt") for n in os.listdir(out))


def test_disk_cache_skips_compilation(tmp_path):
    code = ("import numpy as np, lazycandle as lc\n"
            "from lazycandle.codegen import jit\n"
            "(lc.tensor(np.ones(7, np.float32)) * 3.25).tanh().numpy()\n"
            "print(jit.stats['disk_hits'])\n")
    env = dict(ENV, LAZYCANDLE_CACHE_DIR=str(tmp_path))
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.strip() == "0" and int(second.stdout.strip()) >= 1


@pytest.mark.parametrize("where", ["a_file", "below_a_file"])
def test_unwritable_dump_dir_warns_once_and_computes(tmp_path, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    out_dir = blocker if where == "a_file" else blocker / "dumps"
    code = ("import numpy as np, lazycandle as lc\n"
            "a = lc.tensor(np.arange(6.0, dtype=np.float32))\n"
            "print((a * 2).numpy().tolist(), (a + 1).exp().sum(0).numpy().round(3))\n")
    env = dict(ENV, LAZYCANDLE_DUMP="graph,schedule", LAZYCANDLE_DUMP_DIR=str(out_dir))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:6] == ["[0.0,", "2.0,", "4.0,", "6.0,", "8.0,", "10.0]"]
    assert float(r.stdout.split()[6]) == pytest.approx(np.exp(np.arange(1.0, 7.0)).sum(), rel=1e-5)
    assert r.stderr.count("cannot write dump") == 1, r.stderr


def _graph_ids(text):
    """{id: op} of the `graph` stage lines `%7 = exp(%6) : ...`."""
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^%(\d+) = (\w+)", text, re.M)}


def test_one_node_numbering_across_stages_and_notes():
    a = lc.tensor(np.arange(32, dtype=np.float32).reshape(4, 8) / 32)
    c = lc.tensor(np.ones((8, 4), np.float32))
    x1 = a * 2.0 + c.t()
    shared = x1.exp() + x1.exp()                       # CSE note
    y = shared.sum_keepdim(-1) + x1                    # reduction recomputes its producers
    deep = a
    for _ in range(8):
        deep = deep.tanh()                             # too costly to recompute:
    s = deep.sum(1)                                    # the reduction reads a buffer (scheduler note)
    outs = (y, deep, s)
    ids = _graph_ids(lc.dump(*outs, stage="graph"))
    opt = lc.dump(*outs, stage="optimized")
    sched = lc.dump(*outs, stage="schedule")
    for text in (opt, sched):
        named = {int(m) for m in re.findall(r"%(\d+)'*", text)}
        assert named and named <= set(ids), (named - set(ids), text)
    for m in re.finditer(r"^%(\d+)'* = (\w+)", opt, re.M):      # same op under the same id
        assert ids[int(m.group(1))] == m.group(2), m.group(0)
    for m in re.finditer(r"%(\d+)'* (\w+)", sched.split("note:")[0]):
        if m.group(2) in ids.values():
            assert ids[int(m.group(1))] == m.group(2), m.group(0)
    notes = [ln for ln in sched.splitlines() if ln.startswith("note:")]
    cse = next(n for n in notes if "common subexpression" in n)
    dup, same = map(int, re.match(r"note: %(\d+) \(exp\) .* the same as %(\d+)", cse).groups())
    assert dup != same and ids[dup] == ids[same] == "exp"
    rec = next(n for n in notes if "recomputes" in n)
    red = int(re.match(r"note: reduction %(\d+)", rec).group(1))
    assert ids[red] == "sum" and all(ids[int(i)] == op for i, op in re.findall(r"%(\d+) (\w+)", rec.split("(", 1)[1]))
    buf = next(n for n in notes if "from a buffer" in n)
    reader, producer = map(int, re.match(r"note: %(\d+) \(sum\) reads %(\d+)", buf).groups())
    assert (reader, producer) == (s._node.srcs[0].id, deep._node.id)
    assert lc.dump(*outs, stage="schedule") == sched     # a cached plan is named the same way


@pytest.mark.parametrize("where", ["missing", "directory"])
def test_dump_of_missing_script_is_one_line_and_exit_2(tmp_path, where):
    script = tmp_path / "missing.py" if where == "missing" else tmp_path
    r = subprocess.run([sys.executable, "-m", "lazycandle", "dump", str(script)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and str(script) in r.stderr and "Traceback" not in r.stderr


def test_info_prints_blas_in_words():
    from lazycandle.runtime import blas
    r = subprocess.run([sys.executable, "-m", "lazycandle", "info"], capture_output=True, text=True, timeout=120)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("BLAS library:"))
    assert "{" not in line and "'" not in line, line
    info = blas.info()
    if info.get("library"):
        assert re.search(r"\d+ threads?\b", line) and info["config"].split()[0] in line
        if info.get("corename"):
            assert f"core {info['corename']}" in line
