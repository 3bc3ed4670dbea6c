"""The read-only stream peak of this machine: how fast one or two threads can read a large f32
array, the ceiling of any reduction (sum, max, mean read their input once and write almost
nothing).  Measured with a small generated kernel (no lazycandle graph in the way): each unit of
BLOCK floats is read with 8 independent vector accumulators (integer OR, which costs nothing
next to the load), and one word per unit is stored so the loads cannot be dropped.

    python -m bench.bandwidth [--mb 16,256] [--threads 1,2] [--reps 9] [--reductions]

Also reports `a + b` (two streams in, one out) the way machine.Peaks does, for comparison.
`--reductions` times sum / mean / max / min over the last and the first dim of the same bytes
as (rows, 1024) f32, each as a compiled program (`Program.run`, the kernel plus its call) and
as the eager `x.sum(-1).numpy()`, in the same rotation as the stream, as GB/s and % of it.
`--python` times what a call costs besides its kernel: a reduction of a (8, 1024) f32 array
(eager `x.sum(-1).numpy()`, `Program.run`, NumPy, and torch when importable) once with the
caches warm and once right after a lazycandle kernel that read a 16 MiB array, which leaves the
caller's L2 holding that array instead of the interpreter's data (the state every call of
`lazycandle bench` starts in: the previous implementation read the same 16 MiB).
Each size is a separate ceiling: this host's last-level cache (`lscpu`: 300 MiB here) holds the
16 MiB (4096, 1024) f32 inputs of the reduction and row-kernel cases between calls, so they are
read from the LLC, well above the DRAM stream rate of a 256 MiB array; compare a case with the
peak of its own size.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time

import llvmlite.ir as ir
import numpy as np

BLOCK = 4096          # floats per parallel unit (16 KiB)
ACCS = 8


def _stream_ir(lanes: int) -> str:
    from lazycandle.codegen.llvmutil import I32, I64
    from lazycandle.codegen.loops import arg_pointer, counted_loop, kernel_function, new_module, unit_range
    m = new_module("stream")
    fn, b = kernel_function(m, "stream")
    src = arg_pointer(b, fn.args[0], 0, I32, "src")
    dst = arg_pointer(b, fn.args[0], 1, I32, "dst")
    vt = ir.VectorType(I32, lanes)
    lo, hi = unit_range(fn)
    with counted_loop(b, lo, hi, 1, "u") as u:
        accs = [ir.Constant(vt, [I32(0)] * lanes)] * ACCS
        base = b.mul(u, I64(BLOCK))
        head = b.block
        loop = fn.append_basic_block("i.body")
        done = fn.append_basic_block("i.done")
        b.branch(loop)
        b.position_at_end(loop)
        i = b.phi(I64)
        i.add_incoming(I64(0), head)
        phis = []
        for a in accs:
            p = b.phi(vt)
            p.add_incoming(a, head)
            phis.append(p)
        new = []
        for k, p in enumerate(phis):
            off = b.add(base, b.add(i, I64(k * lanes)))
            ptr = b.bitcast(b.gep(src, [off], inbounds=True), vt.as_pointer())
            new.append(b.or_(p, b.load(ptr, align=4)))
        nxt = b.add(i, I64(ACCS * lanes))
        for p, v in zip(phis, new):
            p.add_incoming(v, loop)
        i.add_incoming(nxt, loop)
        b.cbranch(b.icmp_signed("<", nxt, I64(BLOCK)), loop, done)
        b.position_at_end(done)
        acc = new[0]
        for v in new[1:]:
            acc = b.or_(acc, v)
        word = b.extract_element(acc, I32(0))
        for lane in range(1, lanes):
            word = b.or_(word, b.extract_element(acc, I32(lane)))
        b.store(word, b.gep(dst, [u], inbounds=True))
    b.ret_void()
    return str(m)


class Stream:
    """The compiled read-only stream kernel over an array of n_units * BLOCK f32."""

    def __init__(self):
        from lazycandle.codegen import jit
        lanes = max(4, jit.vector_bits() // 32)
        assert BLOCK % (ACCS * lanes) == 0
        self._cm = jit.compile_ir(_stream_ir(lanes), ["stream"], name="stream")

    def run(self, x: np.ndarray, out: np.ndarray, threads: int) -> None:
        """Through the native pool (runtime/native_pool.py), the one the engine's kernels run
        on, so the peak includes the same wake-up and split as theirs."""
        from lazycandle.runtime import native_pool
        bufs = (ctypes.c_void_p * 2)(x.ctypes.data, out.ctypes.data)
        native_pool.parallel(self._cm.address("stream"), ctypes.addressof(bufs), 0, 0, 0, out.size, 1, threads)


def measure(mb: int = 256, threads=(1, 2), reps: int = 9) -> dict:
    """{threads: {"read": GB/s, "add": GB/s}}: median of `reps` after a warm-up."""
    import lazycandle as lc
    n_units = mb * 2 ** 20 // 4 // BLOCK
    x = np.random.default_rng(0).random(n_units * BLOCK, dtype=np.float32)
    y = x[::-1].copy()
    out = np.empty(n_units, np.int32)
    stream = Stream()
    pa, pb = lc.placeholder("a", x.shape, lc.f32), lc.placeholder("b", x.shape, lc.f32)
    add = lc.compile([pa + pb])
    res = {}
    for t in threads:
        with lc.num_threads(t):
            fns = {"read": (lambda: stream.run(x, out, t), x.nbytes),
                   "add": (lambda: add.run(a=x, b=y), 3 * x.nbytes)}
            for f, _ in fns.values():
                f()
            times = {k: [] for k in fns}
            for _ in range(reps):
                for k, (f, _) in fns.items():
                    t0 = time.perf_counter()
                    f()
                    times[k].append(time.perf_counter() - t0)
            res[t] = {k: fns[k][1] / statistics.median(v) / 1e9 for k, v in times.items()}
    return res


REDUCTIONS = ("sum", "mean", "max", "min")


def measure_reductions(mb: int = 16, threads=(1, 2), reps: int = 9, cols: int = 1024) -> dict:
    """{threads: {name: GB/s}} for the read stream and each reduction of a (rows, cols) f32
    array of `mb` MiB (medians of `reps`, all rotating in one loop)."""
    import lazycandle as lc
    x = np.random.default_rng(0).standard_normal((mb * 2 ** 20 // 4 // cols, cols), dtype=np.float32)
    flat = x.reshape(-1)
    out = np.empty(x.size // BLOCK, np.int32)
    stream = Stream()
    xt = lc.tensor(x).realize()
    p = lc.placeholder("x", x.shape, lc.f32)
    progs = {(k, d): lc.compile([getattr(p, k)(d)]) for k in REDUCTIONS for d in (-1, 0)}
    res = {}
    for t in threads:
        with lc.num_threads(t):
            fns = {"read stream": lambda: stream.run(flat, out, t)}
            for (k, d), prog in progs.items():
                fns[f"{k}({d}) kernel"] = lambda prog=prog: prog.run(x=x)
                fns[f"{k}({d}) eager"] = lambda k=k, d=d: getattr(xt, k)(d).numpy()
            for f in fns.values():
                f()
            times = {k: [] for k in fns}
            for _ in range(reps):
                for k, f in fns.items():
                    t0 = time.perf_counter()
                    f()
                    times[k].append(time.perf_counter() - t0)
            res[t] = {k: x.nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
    return res


def measure_python(reps: int = 101, mb: int = 16) -> dict:
    """{state: {name: median microseconds}} of a tiny reduction per implementation, `state`
    "warm" (calls back to back) or "after 16 MiB" (each call right after a kernel reading
    `mb` MiB, untimed): the part of a call that is not its kernel, and how much of it is cache
    misses the big kernel left behind."""
    import lazycandle as lc
    big = np.random.default_rng(0).standard_normal((mb * 2 ** 20 // 4 // 1024, 1024), dtype=np.float32)
    flush_prog = lc.compile([lc.placeholder("x", big.shape, lc.f32).sum(-1)])
    small = np.random.default_rng(1).standard_normal((8, 1024), dtype=np.float32)
    prog = lc.compile([lc.placeholder("x", small.shape, lc.f32).sum(-1)])
    t = lc.tensor(small).realize()
    fns = {"eager": lambda: t.sum(-1).numpy(), "Program.run": lambda: prog.run(x=small),
           "numpy": lambda: small.sum(-1)}
    try:
        import torch
        ts = torch.from_numpy(small)
        fns["torch"] = lambda: ts.sum(-1)
    except ImportError:
        pass
    res = {}
    for state, flush in (("warm", None), (f"after {mb} MiB", lambda: flush_prog.run(x=big))):
        times = {k: [] for k in fns}
        for f in fns.values():
            f()
        for _ in range(reps):
            for k, f in fns.items():
                if flush is not None:
                    flush()
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
        res[state] = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bandwidth", description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", default="16,256", help="array sizes in MiB (default 16,256)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--reps", type=int, default=None, help="timed calls per case (default 9; --python: 101)")
    p.add_argument("--reductions", action="store_true", help="time the reductions against the stream")
    p.add_argument("--python", action="store_true",
                   help="time a tiny reduction's call (no kernel to speak of), warm and after a 16 MiB kernel")
    a = p.parse_args(argv)
    threads = [int(t) for t in a.threads.split(",")]
    if a.python:
        import lazycandle as lc
        reps = a.reps or 101
        print(f"sum(-1) of (8, 1024) f32, median microseconds of {reps} "
              f"(load average {os.getloadavg()[0]:.1f})")
        for t in threads:
            with lc.num_threads(t):
                r = measure_python(reps)
            names = list(next(iter(r.values())))
            print(f"| threads {t} | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
            for state, v in r.items():
                print(f"| {state} | " + " | ".join(f"{v[k]:.1f}" for k in names) + " |")
        return 0
    a.reps = a.reps or 9
    if a.reductions:
        print(f"reductions of (rows, 1024) f32 vs the read stream, medians of {a.reps} "
              f"(load average {os.getloadavg()[0]:.1f})")
        print("| MiB | threads | case | GB/s | % of stream |\n|---|---|---|---|---|")
        for mb in (int(m) for m in a.mb.split(",")):
            for t, r in measure_reductions(mb, threads, a.reps).items():
                peak = r["read stream"]
                for k, v in r.items():
                    print(f"| {mb} | {t} | {k} | {v:.1f} | {100 * v / peak:.0f}% |")
        return 0
    print(f"read-only stream peak, f32 (load average {os.getloadavg()[0]:.1f})")
    print("| MiB | threads | read GB/s | a + b GB/s (3 streams) |\n|---|---|---|---|")
    for mb in (int(m) for m in a.mb.split(",")):
        for t, r in measure(mb, threads, a.reps).items():
            print(f"| {mb} | {t} | {r['read']:.1f} | {r['add']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
