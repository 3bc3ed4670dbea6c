"""Dispatch cost of the whole-program native path (issue 11) against the per-kernel path,
both in ONE process and one loop (LAZYCANDLE_EXEC is read at every run, so the two rotate;
it is set untimed before each call):

    python bench/dispatch.py [--repeats 31] [--blocks 1] [--split]

  * Program.run of a one-kernel program on 16 floats (target <= 10 us median);
  * eager realize of a 3-op chain on 16 floats, graph building included (target <= 40 us);
    `--split` adds where its time goes, part by part (perf_counter_ns around each part), and
    both targets in a tight native loop (no mode switch between calls);
  * eager `x.sum(-1).numpy()` on (7, 33) (all Python and dispatch) and on (1024, 1024);
  * the GPT-2-style block program (bench/gpt2_block.py) on (1, 8, 768) (target >= 2x faster)
    and (1, 128, 768) (no slower), at 1 and 2 threads.
Medians (min-max) in microseconds, and the machine's load."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if __package__ in (None, ""):          # run as a script: make `bench` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import lazycandle as lc
from bench import gpt2_block as G
from bench.timing import time_alternating

MODES = ("python", "native")


def _in_mode(mode, fn):
    def call():
        _select(mode)
        return fn()
    return call


def _select(mode):
    os.environ["LAZYCANDLE_EXEC"] = mode


SETUP = {m: (lambda m=m: _select(m)) for m in MODES}


def _report(title, stats, target=None):
    py, nat = stats["python"], stats["native"]
    print(f"{title}  (speed-up {py.median / nat.median:.2f}x{'; ' + target if target else ''})")
    for mode in MODES:
        s = stats[mode]
        print(f"  {mode:7s} median {s.median * 1e6:10.1f} us  (min {s.min * 1e6:.1f}, max {s.max * 1e6:.1f}, n={s.n})")


def tiny_cases(repeats):
    a = np.linspace(-1, 1, 16, dtype=np.float32)
    x = lc.placeholder("x", (16,), lc.f32)
    one = lc.compile([x * 2.0 + 1.0])
    t = lc.tensor(a)
    fns = {m: (lambda: one.run(x=a)) for m in MODES}
    _report("Program.run, one kernel on 16 floats",
            time_alternating(fns, repeats=repeats, warmup=3, setup=SETUP), "target <= 10 us")
    fns = {m: (lambda: lc.realize(((t * 2.0) + 1.0).exp())) for m in MODES}
    _report("eager realize of a 3-op chain on 16 floats",
            time_alternating(fns, repeats=repeats, warmup=3, setup=SETUP), "target <= 40 us")
    for shape, reps in (((7, 33), repeats), ((1024, 1024), max(repeats // 10, 9))):
        x = lc.tensor(np.random.default_rng(0).standard_normal(shape, np.float32))
        fns = {m: (lambda: x.sum(-1).numpy()) for m in MODES}
        _report(f"eager x.sum(-1).numpy() on {shape}", time_alternating(fns, repeats=reps, warmup=3, setup=SETUP))


def eager_split(reps):
    """Median ns of each part of the native eager realize of the 3-op chain, in the order the
    realize runs them: building the 7 nodes (their traces included), the trace key (inner
    check + read and scalar patterns), the plan lookup, the run (binding the leaves, offsets
    and scalars, the native call, the output) and setting the result (the graph behind freed
    when the last handle goes)."""
    from lazycandle import compiler
    _select("native")
    t = lc.tensor(np.linspace(-1, 1, 16, dtype=np.float32))
    lc.realize(((t * 2.0) + 1.0).exp())         # files the chain's plan under its trace key
    parts = {k: [] for k in ("build", "trace key", "plan lookup", "run", "set_buffer + free")}
    clock = time.perf_counter_ns
    for i in range(reps + 200):
        t0 = clock()
        y = ((t * 2.0) + 1.0).exp()
        t1 = clock()
        n = y._node
        key = compiler.trace_key(n)
        t2 = clock()
        plan, in_pick, slot_pick, scalar_pick = compiler._eager.get(key)
        t3 = clock()
        reads, scalars = n.trace[1], n.trace[2]
        out, = plan.run([reads[k][0].buffer for k in in_pick], [reads[k][1] for k in slot_pick],
                        [scalars[k] for k in scalar_pick])
        t4 = clock()
        n.set_buffer(out)
        del n, y
        t5 = clock()
        if i >= 200:
            for k, a, b in zip(parts, (t0, t1, t2, t3, t4), (t1, t2, t3, t4, t5)):
                parts[k].append(b - a)
    total = 0.0
    print(f"eager 3-op chain on 16 floats, split ({reps} reps, native):")
    for k, v in parts.items():
        m = statistics.median(v) / 1e3
        total += m
        print(f"  {k:18s} {m:6.1f} us")
    print(f"  {'sum of medians':18s} {total:6.1f} us")


def tight_loops(reps):
    """Median us of the two dispatch targets called back to back on the native path with no
    setting written between calls (LAZYCANDLE_EXEC unset): what a loop of them pays, the
    alternating figures above include the mode switch's cache churn."""
    os.environ.pop("LAZYCANDLE_EXEC", None)
    a = np.linspace(-1, 1, 16, dtype=np.float32)
    x = lc.placeholder("x", (16,), lc.f32)
    one = lc.compile([x * 2.0 + 1.0])
    t = lc.tensor(a)
    cases = {"Program.run, one kernel on 16 floats": lambda: one.run(x=a),
             "eager realize of a 3-op chain on 16 floats": lambda: lc.realize(((t * 2.0) + 1.0).exp())}
    clock = time.perf_counter_ns
    print(f"tight loops ({reps} calls each, native, nothing set between calls):")
    for title, fn in cases.items():
        for _ in range(200):
            fn()
        times = []
        for _ in range(reps):
            t0 = clock()
            fn()
            times.append(clock() - t0)
        print(f"  {title:44s} median {statistics.median(times) / 1e3:6.1f} us")


def gpt2_case(seq, n_blocks, threads, repeats):
    prog, feeds = G.block_program(seq, n_blocks)
    with lc.num_threads(threads):
        outs = {m: _in_mode(m, lambda: prog.run(**feeds)[0])() for m in MODES}
        # not bit for bit: the two modes may run different GEMM kernels (auto decides by measurement)
        np.testing.assert_allclose(outs["python"], outs["native"], rtol=1e-4, atol=1e-5)
        fns = {m: (lambda: prog.run(**feeds)) for m in MODES}
        stats = time_alternating(fns, repeats=repeats, warmup=2, setup=SETUP)
    target = ">= 2x faster" if seq <= 8 else "no slower"
    _report(f"GPT-2 block program (1, {seq}, 768) x {n_blocks} block(s), {threads} thread(s), "
            f"{len(prog._fixed.plan.kernels)} kernels", stats, target)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--blocks", type=int, default=1)
    ap.add_argument("--split", action="store_true", help="the eager chain's time part by part")
    a = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    tiny_cases(a.repeats * 10)
    if a.split:
        eager_split(a.repeats * 100)
        tight_loops(a.repeats * 100)
    for seq in (8, 128):
        for threads in (1, 2):
            gpt2_case(seq, a.blocks, threads, a.repeats)
    print(f"load average {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
