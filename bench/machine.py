"""What machine the suite runs on (the report header) and what it can do at best: memory
bandwidth and FMA throughput, both measured with small lazycandle kernels at the start of a run."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time

import numpy as np

BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
            "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OPENBLAS_THREAD_TIMEOUT")

METHOD = """\
- **Timing**: like the seed: one warm-up call, then the median of {repeats} calls with min–max; every
  implementation of a case is called once per round, in the same loop, so the noise of this
  shared machine hits all of them alike; the order changes each round so that every
  implementation runs right after every other one equally often (what ran just before --
  a peer's threads still spinning, or a single-threaded call that left the other CPU idle --
  changes the next call's time). A lazycandle call builds the graph afresh
  from input tensors and realizes it with `.numpy()` (graph capture, cached plan lookup,
  kernels and the output buffer are all inside the timing; compilation happens in the warm-up,
  shown as "1st call"). NumPy and the peers get their inputs ready-made (jax's function
  `jax.jit`-compiled in the warm-up). The inputs are 64-byte aligned NumPy arrays;
  lazycandle's are `lc.from_dlpack` views of them, torch's `torch.from_numpy` views and jax's
  `jax.dlpack.from_dlpack` views (a device copy only for a dtype DLPack does not carry):
  every implementation reads the same memory, so none gets an input that the previous call
  left in the last-level cache while another reads a cold copy, and none evicts the others'
  input with a private copy.
- **Fairness**: the suite runs with OMP_WAIT_POLICY=PASSIVE, KMP_BLOCKTIME=0 and
  OPENBLAS_THREAD_TIMEOUT=4 (set before any library loads; the command restarts itself to set them),
  so the peers' idle OpenMP / OpenBLAS threads sleep instead of spinning on a core the next timed
  call needs. "load" is the 1-minute load average when the case was timed; a case where some
  implementation's samples spread over {max_spread:g}× (max/min) is timed again (up to {retries}
  times) and the round with the smallest spread is kept.
- **Check**: before timing, every result is compared with the same NumPy code run in float64
  (`exact`): an element passes if |x − exact| ≤ rtol·|exact| + atol·rms(exact) + 2·|NumPy − exact|
  (i.e. within twice NumPy's own error plus a small margin). A failing lazycandle result is
  reported as WRONG and not timed; a failing peer is left out of the comparison with a note.
- **Ratios**: "× NumPy" = NumPy median / lazycandle median (> 1: lazycandle is faster);
  "× best peer" the same against the fastest of NumPy, numexpr, torch and jax.
- **Bandwidth peak**: a lazycandle `a + b` kernel (compiled once with `lc.compile`, fed through
  `Program.run`) on {bw_n:,} f32 per array ({bw_mb:.0f} MB each, far beyond the caches); GB/s =
  3 arrays × bytes / best-of-{peak_reps} time (write-allocate traffic not counted). Memory-bound
  cases report their compulsory traffic (inputs read once, output written once) as GB/s and
  "% peak" against this.
- **FMA peak**: a lazycandle kernel on an L1-resident {fma_w}-float vector (8 KB, broadcast to
  {fma_r}×{fma_w}): {fma_p} independent chains of {fma_k} dependent `y = y*y + c` steps (each one
  vector FMA; there is no re-association, so nothing folds) summed; GFLOP/s counts 2 per FMA, best of
  {peak_reps}. Compute-bound cases (matmul) report GFLOP/s and "% peak" against this. The nominal
  figure (clock × 2 FMA pipes × f32 lanes of an FMA unit × 2 × threads) is shown for comparison.
- Peaks are measured at each thread count of the run, at its start and again at its end (the
  better figure is kept); "% peak" compares with the peak at the same thread count. Each case
  runs at all thread counts back to back, so its thread-scaling figures share machine conditions.
"""


def _lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.strip().lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown"


def _cpu_mhz() -> float:
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(l.split(":")[1]) for l in f if l.lower().startswith("cpu mhz")]
        return max(mhz) if mhz else float("nan")
    except OSError:
        return float("nan")


def _git_rev() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + ("+uncommitted changes" if dirty else "") if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def describe(argv=None) -> dict:
    """The report header: date, command, CPU, ISA, library versions, BLAS libraries, env."""
    import lazycandle as lc
    from lazycandle.codegen import jit
    from .peers import numpy_blas_info
    host = jit.host_info()
    try:
        from lazycandle.runtime import blas
        bi = blas.info()
        lc_blas_path = bi.get("library")
        lc_blas = f"{os.path.basename(lc_blas_path or 'none')} ({bi.get('corename', '')})"
    except Exception as e:  # BLAS binding missing or broken
        lc_blas, lc_blas_path = f"unavailable ({e})", None
    args = sys.argv[1:] if argv is None else list(argv)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "lazycandle bench " + " ".join(args),
        "cpu": _lscpu_model(),
        "llvm_cpu": host["cpu"],
        "vector_bits": jit.vector_bits(),
        "fma": "+fma" in host["features"].split(","),
        "cpus": len(os.sched_getaffinity(0)),
        "mhz": _cpu_mhz(),
        "loadavg_start": os.getloadavg()[0],
        "python": platform.python_version(),
        "lazycandle": f"{lc.__version__} (git {_git_rev()})",
        "matmul_backend": lc.get_matmul_backend(),
        "lc_blas": lc_blas,
        "numpy_blas": numpy_blas_info(exclude=lc_blas_path)[0],
        "env": {k: os.environ.get(k) for k in BLAS_ENV + ("LAZYCANDLE_NUM_THREADS", "LAZYCANDLE_MATMUL")
                if os.environ.get(k) is not None},
    }


# ---- peaks -----------------------------------------------------------------------------------
# mode -> (bandwidth elements, FMA rows, FMA chains, FMA chain length).  The FMA graph must stay
# ONE kernel (chains * (1 + 2 * length) + chains - 1 ops <= the scheduler's MAX_FUSED_NODES):
# 12 x 12 was split into 4 kernels whose 8 MiB intermediates made the "peak" a third of the
# machine's.  10 chains cover the FMA latency x 2 pipes.
PEAK_SIZES = {
    "full": (16 * 2 ** 20, 512, 10, 11),
    "quick": (8 * 2 ** 20, 512, 10, 11),
    "tiny": (2 ** 16, 4, 2, 2),
}
FMA_W = 2048
PEAK_REPS = 9


def _best_time(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _fma_graph(lc, x, rows, chains, steps):
    from lazycandle.ir.schedule import MAX_FUSED_NODES
    assert chains * (1 + 2 * steps) + chains - 1 <= MAX_FUSED_NODES, "the FMA peak graph must be one kernel"
    xb = x.broadcast_as((rows, x.shape[0]))
    total = None
    for j in range(chains):
        y = xb * (0.5 + 0.01 * j)
        for k in range(steps):
            y = y * y + (-0.25 - 0.001 * k)
        total = y if total is None else total + y
    return total


class Peaks:
    """Bandwidth (GB/s) and FMA throughput (GFLOP/s) per thread count."""

    def __init__(self, mode: str = "full", reps: int = PEAK_REPS):
        self.mode, self.reps = mode, reps
        self.bw_n, self.fma_r, self.fma_p, self.fma_k = PEAK_SIZES[mode]
        self.bw: dict = {}
        self.fma: dict = {}
        self.errors: list = []
        self._progs = None

    def _programs(self):
        import lazycandle as lc
        if self._progs is None:
            a = lc.placeholder("a", (self.bw_n,), lc.f32)
            b = lc.placeholder("b", (self.bw_n,), lc.f32)
            x = lc.placeholder("x", (FMA_W,), lc.f32)
            self._progs = (lc.compile([a + b]),
                           lc.compile([_fma_graph(lc, x, self.fma_r, self.fma_p, self.fma_k)]))
        return self._progs

    def measure(self, threads: int) -> None:
        """Measure both peaks with `threads` threads (lc.num_threads is set by the caller); a
        second call keeps the better figure (the suite measures before and after the cases)."""
        rng = np.random.default_rng(1)
        try:
            add, fma = self._programs()
            a = rng.standard_normal(self.bw_n, dtype=np.float32)
            b = rng.standard_normal(self.bw_n, dtype=np.float32)
            t = _best_time(lambda: add.run(a=a, b=b), self.reps)
            self.bw[threads] = max(self.bw.get(threads, 0.0), 3 * 4 * self.bw_n / t / 1e9)
            x = rng.random(FMA_W, dtype=np.float32)
            t = _best_time(lambda: fma.run(x=x), self.reps)
            self.fma[threads] = max(self.fma.get(threads, 0.0), self.fma_flops() / t / 1e9)
        except Exception as e:  # a broken kernel must not stop the suite
            self.errors.append(f"peak measurement failed at {threads} threads: {type(e).__name__}: {e}")

    def fma_flops(self) -> int:
        per_elem = self.fma_p * (1 + 2 * self.fma_k) + (self.fma_p - 1)
        return self.fma_r * FMA_W * per_elem

    def peak(self, metric: str, threads: int) -> float:
        """GB/s for metric "bytes", GFLOP/s for "flops" (nan when not measured)."""
        return (self.bw if metric == "bytes" else self.fma).get(threads, float("nan"))

    def method(self, repeats: int) -> str:
        from .runner import MAX_SPREAD, RETRIES
        return METHOD.format(repeats=repeats, max_spread=MAX_SPREAD, retries=RETRIES, bw_n=self.bw_n, bw_mb=self.bw_n * 4 / 2 ** 20, peak_reps=self.reps,
                             fma_w=FMA_W, fma_r=self.fma_r, fma_p=self.fma_p, fma_k=self.fma_k)


HALF_WIDTH_FMA = ("znver4",)     # LLVM CPU names whose FMA units are 256 bits wide under AVX-512


def nominal_gflops(header: dict, threads: int) -> float:
    """Clock × 2 FMA pipes × f32 lanes × 2 flops × threads (cores assumed not shared); Zen 4
    runs a 512-bit FMA as two halves on 256-bit units, so its lanes per pipe are 8."""
    bits = header["vector_bits"]
    if header.get("llvm_cpu", "").startswith(HALF_WIDTH_FMA):
        bits = min(bits, 256)
    lanes = bits // 32
    return header["mhz"] * 1e-3 * 2 * lanes * 2 * min(threads, header["cpus"])
