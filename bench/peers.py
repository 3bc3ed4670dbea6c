"""The implementations lazycandle is compared with: NumPy (always) and, where installed,
numexpr, torch and jax.  Also the one place that sets every library's thread count."""
from __future__ import annotations

import contextlib
import importlib
import os

PEER_NAMES = ("numexpr", "torch", "jax")


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
