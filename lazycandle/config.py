"""Process-wide settings: thread count (one setting for kernels AND the BLAS library), matmul
backend, dump and cache environment variables."""
from __future__ import annotations

import contextlib
import functools
import os
import threading

from .layout import as_index

_lock = threading.Lock()


def _renew_lock_after_fork():
    """A forked child has only the forking thread: a lock another thread held stays held."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_lock_after_fork)
_listeners = []          # called with the new thread count (the BLAS binding registers one)


def _default_threads() -> int:
    env = os.environ.get("LAZYCANDLE_NUM_THREADS")
    if env:
        try:
            n = int(env)
            if n >= 1:
                return n
        except ValueError:
            pass
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


_num_threads = _default_threads()
_matmul_backend = os.environ.get("LAZYCANDLE_MATMUL", "auto")
matmul_epoch = 0        # bumped by each change of the backend or the thread count: a native program
                        # built before re-decides its matmuls (their splits are written for a thread count)
if _matmul_backend not in ("auto", "blas", "tiled"):
    _matmul_backend = "auto"


def get_num_threads() -> int:
    return _num_threads


def set_num_threads(n: int) -> None:
    """Set the number of threads used by fused kernels, reductions, the tiled matmul and BLAS."""
    global _num_threads, matmul_epoch
    n = as_index(n, "set_num_threads", "the thread count")
    if n < 1:
        raise ValueError(f"set_num_threads: need n >= 1, got {n}")
    with _lock:
        if n != _num_threads:
            matmul_epoch += 1
        _num_threads = n
        for fn in list(_listeners):
            fn(n)


@contextlib.contextmanager
def num_threads(n: int):
    """`with lc.num_threads(2): ...` sets the thread count for the block."""
    old = get_num_threads()
    set_num_threads(n)
    try:
        yield
    finally:
        set_num_threads(old)


def on_threads_change(fn) -> None:
    _listeners.append(fn)


def set_matmul_backend(name: str) -> None:
    """"auto" | "blas" | "tiled" (also env LAZYCANDLE_MATMUL)."""
    global _matmul_backend
    global matmul_epoch
    if name not in ("auto", "blas", "tiled"):
        raise ValueError(f"set_matmul_backend: expected 'auto', 'blas' or 'tiled', got {name!r}")
    if name != _matmul_backend:
        _matmul_backend = name
        matmul_epoch += 1


def get_matmul_backend() -> str:
    return _matmul_backend


AMX_MODES = {"": "auto", "auto": "auto", "1": "on", "on": "on", "0": "off", "off": "off"}


def amx_mode() -> str:
    """LAZYCANDLE_AMX: "auto" (default: the bf16 tiled GEMM runs on AMX tiles where the host
    has amx-tile and amx-bf16 and Linux grants them), "off" (never: the AVX-512 forms), "on"
    (as auto, but a host that cannot is an error instead of a fallback).  The one place the
    override is read (codegen/gemm_amx.py asks when it builds a bf16 GEMM spec)."""
    raw = os.environ.get("LAZYCANDLE_AMX", "").strip().lower()
    if raw not in AMX_MODES:
        raise ValueError(f"LAZYCANDLE_AMX={raw!r}: expected one of auto, on, off, 1, 0")
    return AMX_MODES[raw]


def _env_reader(name: str):
    """A function returning env var `name`'s current raw value (None when unset), for flags
    read at every run: one lookup in the dict behind os.environ (what os.environ.get reads,
    without encoding the key and decoding the value: ~0.1 us instead of ~1), so a value set
    through os.environ (or monkeypatch.setenv) between runs is seen at the next one."""
    data, encode = getattr(os.environ, "_data", None), getattr(os.environ, "encodekey", None)
    if isinstance(data, dict) and encode is not None:
        return functools.partial(data.get, encode(name)), os.environ.decodevalue
    return functools.partial(os.environ.get, name), str


_exec_env, _profile_env = _env_reader("LAZYCANDLE_EXEC"), _env_reader("LAZYCANDLE_PROFILE")
_exec_memo = (None, None, ("", False))     # (raw EXEC, raw PROFILE, exec_flags() of them)


def exec_flags() -> tuple:
    """(LAZYCANDLE_EXEC's value, whether LAZYCANDLE_PROFILE is on), as the environment is now;
    decoded again only when a raw value changed."""
    global _exec_memo
    (get_exec, decode), (get_profile, _) = _exec_env, _profile_env
    e, p = get_exec(), get_profile()
    memo = _exec_memo
    if e is memo[0] and p is memo[1]:
        return memo[2]
    flags = (decode(e) if e is not None else "", decode(p) not in ("", "0") if p is not None else False)
    _exec_memo = (e, p, flags)
    return flags


def dump_stages() -> list:
    env = os.environ.get("LAZYCANDLE_DUMP", "")
    return [s.strip() for s in env.split(",") if s.strip()]


def dump_dir():
    return os.environ.get("LAZYCANDLE_DUMP_DIR") or None


def cache_dir():
    """The disk kernel cache's directory: LAZYCANDLE_CACHE_DIR, else $XDG_CACHE_HOME/lazycandle
    (~/.cache/lazycandle); None (no disk cache) for LAZYCANDLE_CACHE_DIR=off."""
    env = os.environ.get("LAZYCANDLE_CACHE_DIR", "").strip()
    if env:
        return None if env.lower() == "off" else os.path.expanduser(env)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "lazycandle")
    home = os.path.expanduser("~")
    return os.path.join(home, ".cache", "lazycandle") if os.path.isabs(home) else None


_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def cache_max() -> int:
    """The disk cache's bound in bytes, env LAZYCANDLE_CACHE_MAX (an integer, optionally with a
    K/M/G/T suffix of powers of 1024); default 1 GiB."""
    text = os.environ.get("LAZYCANDLE_CACHE_MAX", "").strip().upper().removesuffix("IB").removesuffix("B")
    try:
        return max(0, int(float(text[:-1] if text[-1:] in _SUFFIX else text) * _SUFFIX.get(text[-1:], 1)))
    except (ValueError, OverflowError):
        return 1 << 30


def compile_threads() -> int:
    """Background threads compiling a new plan's kernels ahead of their first use
    (codegen/compile_pool.py), env LAZYCANDLE_COMPILE_THREADS (0: none, each kernel compiles on
    first use); default the thread count when it is at least 2, else 0.  Read at each plan."""
    env = os.environ.get("LAZYCANDLE_COMPILE_THREADS", "").strip()
    try:
        return max(0, int(env)) if env else (_num_threads if _num_threads >= 2 else 0)
    except ValueError:
        return _num_threads if _num_threads >= 2 else 0


def plan_cache_size() -> int:
    """Compiled plans kept in memory (LRU), env LAZYCANDLE_PLAN_CACHE; default 512."""
    env = os.environ.get("LAZYCANDLE_PLAN_CACHE", "")
    try:
        return max(0, int(env)) if env.strip() else 512
    except ValueError:
        return 512
