"""ctypes binding to the BLAS library (scipy_openblas32: symbols carry a `scipy_` prefix).

The row-major CBLAS sgemm/sgemv/dgemm/dgemv of the library, by address for the native BLAS
tasks (codegen/task_ir.py, which call them from the pool's threads), the library's thread count
kept equal to lazycandle's (`config.on_threads_change`) outside `single_threaded` blocks, and
the core type the library picked, for `lazycandle info` and the benchmarks.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading

from .. import caches, config

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
BLASINT_MAX = 2**31 - 1          # scipy_openblas32: 32-bit integers

_lock = threading.RLock()
caches.renew_lock_after_fork(sys.modules[__name__], "_lock", threading.RLock)
_state: dict = {}


def _find(lib, *names):
    for name in names:
        try:
            return getattr(lib, name)
        except AttributeError:
            continue
    return None


def _lib_path():
    """The library's file, found without loading it; None when scipy_openblas32 is missing."""
    try:
        import scipy_openblas32 as sob
    except ImportError:
        return None
    return os.path.join(sob.get_lib_dir(), f"lib{sob.get_library()}.so")


_build: list = []


def build_id():
    """The library build (path, size, modification time), for the keys of choices measured with
    it; None when it is not installed.  Read from the file, not the loaded library: loading
    OpenBLAS costs a new process ~20 ms CPU and ~40-50 ms wall, and a process whose remembered
    choices are all the tiled GEMM never calls it."""
    if not _build:
        path = _lib_path()
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        _build.append(None if st is None else [path, st.st_size, st.st_mtime_ns])
    return _build[0]


def _load() -> dict:
    """Load the library once; {} when no BLAS is installed."""
    if "loaded" in _state:
        return _state
    with _lock:
        if "loaded" in _state:
            return _state
        path, lib = _lib_path(), None
        try:
            lib = ctypes.CDLL(path) if path else None
        except OSError:
            lib = None
        st = {"lib": lib, "path": path}
        if lib is not None:
            i, p = ctypes.c_int, ctypes.c_void_p
            for dt, scalar in (("s", ctypes.c_float), ("d", ctypes.c_double)):
                fn = _find(lib, f"scipy_cblas_{dt}gemm", f"cblas_{dt}gemm")
                fn.argtypes = [i, i, i, i, i, i, scalar, p, i, p, i, scalar, p, i]
                fn.restype = None
                st[f"{dt}gemm"] = fn
                fv = _find(lib, f"scipy_cblas_{dt}gemv", f"cblas_{dt}gemv")
                fv.argtypes = [i, i, i, i, scalar, p, i, p, i, scalar, p, i]
                fv.restype = None
                st[f"{dt}gemv"] = fv
            st["set_threads"] = _find(lib, "scipy_openblas_set_num_threads", "openblas_set_num_threads")
            st["get_threads"] = _find(lib, "scipy_openblas_get_num_threads", "openblas_get_num_threads")
            core = _find(lib, "scipy_openblas_get_corename", "openblas_get_corename")
            cfg = _find(lib, "scipy_openblas_get_config", "openblas_get_config")
            for f in (core, cfg):
                if f is not None:
                    f.restype = ctypes.c_char_p
            st["corename"], st["config"] = core, cfg
            if st["set_threads"] is not None:
                st["set_threads"].argtypes = [ctypes.c_int]
                st["set_threads"](config.get_num_threads())
                st["current"] = config.get_num_threads()
                config.on_threads_change(set_num_threads)
        st["loaded"] = True
        _state.update(st)
        return _state


def available() -> bool:
    return _load().get("lib") is not None


def address(name: str) -> int:
    """Address of the library's CBLAS function `name` ("sgemm", "sgemv", "dgemm", "dgemv"):
    what codegen/task_ir.py's BLAS tasks call from the native pool."""
    return ctypes.cast(_load()[name], ctypes.c_void_p).value


def info() -> dict:
    """Library path, version/config string, core type and thread count."""
    st = _load()
    if st.get("lib") is None:
        return {"library": None}
    return {"library": st["path"],
            "config": st["config"]().decode() if st["config"] else "",
            "corename": st["corename"]().decode() if st["corename"] else "",
            "threads": st["get_threads"]() if st["get_threads"] else None}


def set_num_threads(n: int) -> None:
    """Set the library's own thread count (called on every lazycandle.set_num_threads)."""
    st = _load()
    if st.get("set_threads") is not None:
        with _lock:
            if _state.get("current") != int(n):
                st["set_threads"](int(n))
                _state["current"] = int(n)


class _SingleThreaded:
    """The context of `single_threaded`: a plain class, not a generator context manager (that
    costs ~4 us a call here, next to a ~250 us 256^2 sgemm), calling the library directly."""
    __slots__ = ("held",)

    def __enter__(self):
        st = _state
        if st.get("set_threads") is None or (config.get_num_threads() == 1 and st.get("current") == 1):
            self.held = False       # already single-threaded: no lock, no library calls (small GEMMs)
            return self
        _lock.acquire()
        self.held = True
        if st.get("current") != 1:
            st["set_threads"](1)
            st["current"] = 1
        return self

    def __exit__(self, *exc):
        if not self.held:
            return
        try:
            n = config.get_num_threads()
            if _state.get("current") != n:
                _state["set_threads"](n)
                _state["current"] = n
        finally:
            _lock.release()


def single_threaded() -> _SingleThreaded:
    """`with single_threaded():` BLAS calls of the block run single-threaded inside the library
    (lazycandle's pool runs them in parallel); the library's count goes back to lazycandle's
    setting afterwards."""
    _load()
    return _SingleThreaded()
