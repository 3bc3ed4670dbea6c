"""The implementations lazycandle is compared with: NumPy (always) and, where installed,
numexpr, torch and jax.  Also the one place that sets every library's thread count."""
from __future__ import annotations

import contextlib
import importlib
import os

PEER_NAMES = ("numexpr", "torch", "jax")

# Idle worker threads of the peers must sleep, not spin: a spinning OpenMP team (torch) or OpenBLAS
# pool keeps a core busy after its call returns and steals it from whatever is timed next.  These
# are read when each library loads, so `fair_env_reexec` sets them before anything is imported.
FAIR_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",       # libgomp (torch's OpenMP): idle threads block at once
    "KMP_BLOCKTIME": "0",               # the same for Intel's OpenMP runtime, if a peer brings it
    "OPENBLAS_THREAD_TIMEOUT": "4",     # OpenBLAS threads sleep after 2^4 cycles of idling
}
_FAIR_MARK = "LAZYCANDLE_BENCH_FAIR_ENV"


def fair_env_missing(environ=os.environ) -> dict:
    """The FAIR_ENV settings the environment lacks (a setting the user made is kept)."""
    return {k: v for k, v in FAIR_ENV.items() if k not in environ}


def fair_env_reexec(argv: list) -> None:
    """Restart `python -m lazycandle bench argv` with FAIR_ENV in the environment when some of
    it is missing (NumPy's OpenBLAS has read its settings by the time bench/ is imported).
    Returns only when the environment is already fair (or after one restart failed)."""
    import sys
    missing = fair_env_missing()
    if not missing or os.environ.get(_FAIR_MARK):
        return
    import lazycandle
    env = dict(os.environ, **missing, **{_FAIR_MARK: "1"})
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(lazycandle.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, "-m", "lazycandle", "bench", *argv], env)
    except OSError as e:
        print(f"lazycandle bench: could not restart with {missing} ({e}); peers' idle threads may spin",
              file=sys.stderr)


def load_peers(wanted=PEER_NAMES) -> tuple[dict, list]:
    """Import the wanted peers that are installed.  Returns ({name: module}, notes); for jax the
    module is `jax` itself (jax.numpy is reached through it)."""
    mods, notes = {}, []
    for name in wanted:
        if name not in PEER_NAMES:
            notes.append(f"unknown peer {name!r} ignored (known: {', '.join(PEER_NAMES)})")
            continue
        try:
            mod = importlib.import_module(name)
            if name == "jax":
                importlib.import_module("jax.numpy")
                importlib.import_module("jax.nn")
            mods[name] = mod
        except Exception as e:  # ImportError, or a broken install
            notes.append(f"{name}: not installed, skipped ({type(e).__name__}: {e})"
                         if isinstance(e, ImportError) else f"{name}: import failed, skipped ({e})")
    return mods, notes


def versions(mods: dict) -> dict:
    """Versions of NumPy and of the loaded peers."""
    import numpy as np
    out = {"numpy": np.__version__}
    for k, m in mods.items():
        out[k] = getattr(m, "__version__", "?")
    return out


def numpy_blas_info(exclude=None) -> tuple[str, bool]:
    """(description of NumPy's BLAS, whether threadpoolctl can set its threads).  `exclude`:
    the path of lazycandle's own BLAS library, which threadpoolctl also sees."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return ("unknown (threadpoolctl not installed: NumPy's BLAS keeps its default thread count)", False)
    ex = os.path.realpath(exclude) if exclude else None
    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"
            and (ex is None or os.path.realpath(i.get("filepath", "")) != ex)]
    desc = "; ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture', '?')}, "
                     f"{os.path.basename(i.get('filepath', ''))}, {i.get('num_threads')} threads)" for i in libs)
    return (desc or "no BLAS found by threadpoolctl"), True


@contextlib.contextmanager
def threads(n: int, mods: dict):
    """Set lazycandle's pool, every BLAS library in the process (threadpoolctl, when installed),
    numexpr and torch to `n` threads for the block.  NumPy's elementwise ufuncs are
    single-threaded whatever this says; jax's XLA pool is fixed when jax starts."""
    import lazycandle as lc
    with contextlib.ExitStack() as stack:
        try:
            from threadpoolctl import threadpool_limits
            stack.enter_context(threadpool_limits(limits=n, user_api="blas"))
        except ImportError:
            pass
        # after threadpoolctl: lazycandle's own BLAS binding follows lc's setting
        stack.enter_context(lc.num_threads(n))
        if "numexpr" in mods:
            old = mods["numexpr"].set_num_threads(n)
            stack.callback(mods["numexpr"].set_num_threads, old)
        if "torch" in mods:
            old = mods["torch"].get_num_threads()
            mods["torch"].set_num_threads(n)
            stack.callback(mods["torch"].set_num_threads, old)
        yield


def thread_notes(mods: dict, blas_controllable: bool) -> list:
    """What `threads()` can and cannot control, for the report header."""
    notes = ["NumPy's elementwise ops and reductions are single-threaded; only its BLAS (matmul) follows --threads"
             + ("" if blas_controllable else " — and here it cannot, since threadpoolctl is not installed")]
    if "jax" in mods:
        notes.append("jax: XLA's CPU thread pool is sized once at start-up (all CPUs) and ignores --threads")
    return notes
