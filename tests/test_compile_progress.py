"""A long compile says what it is compiling on stderr, at most once a second (codegen/progress.py)."""
import json
import os
import subprocess
import sys

import lazycandle as lc
from lazycandle.codegen import progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(lc.__file__)))

SLOW = """
import json, sys, time, numpy as np, lazycandle as lc
from lazycandle.codegen import llvm_work
log = []

class Stderr:
    def write(self, s):
        log.append((time.monotonic(), s))
    def flush(self):
        pass

sys.stderr = Stderr()
real = llvm_work.object_code
llvm_work.object_code = lambda *a: (time.sleep(0.7), real(*a))[1]     # every kernel compiles for 0.7 s+
x = lc.tensor(np.linspace(0, 1, 50))
got = [(x * 2.0).exp().numpy(), (x + 1.0).sin().numpy(), (x - 3.0).tanh().numpy()]
ok = all(np.allclose(g, f(x.numpy())) for g, f in zip(got, (lambda v: np.exp(2 * v), lambda v: np.sin(v + 1),
                                                          lambda v: np.tanh(v - 3))))
time.sleep(0.7)            # past the end of the streak
print(json.dumps({"ok": ok, "lines": [(t, s) for t, s in log if s.strip()]}), file=sys.__stdout__)
"""


def _slow(**env):
    r = subprocess.run([sys.executable, "-c", SLOW], capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, PYTHONPATH=ROOT, LAZYCANDLE_CACHE_DIR="off", **env))
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"]
    return out["lines"]


def test_long_compile_says_what_is_compiling_once_a_second():
    lines = _slow()
    busy = [(t, s) for t, s in lines if s.startswith("lazycandle: compiling ")]
    assert 1 <= len(busy) <= 4, lines
    assert all("elementwise" in s and "s so far" in s for _, s in busy), busy
    assert all(b[0] - a[0] >= 0.95 for a, b in zip(busy, busy[1:])), busy     # at most once a second
    assert lines[-1][1].startswith("lazycandle: compiled 3 kernels in "), lines


def test_progress_off_switch():
    assert _slow(LAZYCANDLE_PROGRESS="0") == []


def test_no_line_before_a_second_and_then_one_per_second(monkeypatch):
    st = dict(progress._st)
    monkeypatch.setattr(progress, "_st", st)
    st.update(depth=1, what="row kernel", start=100.0, printed=100.0, count=4, lines=0)
    line, wait = progress._next_line(100.4)
    assert line is None and abs(wait - 0.6) < 1e-9
    line, _ = progress._next_line(101.0)
    assert line == "lazycandle: compiling row kernel (kernel 4, 1.0 s so far)"
    assert progress._next_line(101.5) == (None, 0.5)
    st.update(depth=0, last_end=101.7)
    assert progress._next_line(101.9)[0] is None                      # maybe another kernel comes
    assert progress._next_line(102.3)[0] == "lazycandle: compiled 4 kernels in 1.7 s"
    assert progress._next_line(105.0) == (None, None) and st["start"] is None


def test_a_short_streak_prints_nothing(monkeypatch):
    st = dict(progress._st)
    monkeypatch.setattr(progress, "_st", st)
    st.update(depth=0, what=None, start=100.0, printed=100.0, count=2, lines=0, last_end=100.3)
    assert progress._next_line(100.9) == (None, None) and st["start"] is None
