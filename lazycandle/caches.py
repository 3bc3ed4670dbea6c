"""Every in-memory cache of the process in one registry, so `lc.clear_caches()` and
`lc.cache_info()` see them all, plus the bounded LRU mapping the plan cache uses.

Caches only hold references: a Plan (and a Program, through its plan) keeps the compiled
modules it calls alive itself, so clearing a cache never frees code that is still in use; the
next lookup of a cleared entry simply compiles (or loads from the disk cache) again."""
from __future__ import annotations

import os
import threading
from collections import OrderedDict



class LRU:
    """A thread-safe mapping bounded to `maxsize` entries; the least recently used entry is
    evicted first.  `maxsize` may be changed at any time (the excess is evicted on the next put)."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, default=None):
        """The value under `key` (now the most recent), without taking the lock: each
        OrderedDict call is one atomic step under the GIL (keys are plain tuples, whose hash
        and == run no Python code), so an eviction by another thread between the two steps
        only skips the touch."""
        data = self._data
        try:
            value = data[key]
        except KeyError:
            return default
        try:
            data.move_to_end(key)
        except KeyError:
            pass
        return value

    def put(self, key, value, replace: bool = False):
        """Store value under key unless another thread stored one first (or `replace`);
        returns the stored one."""
        with self._lock:
            if replace:
                self._data[key] = value
            value = self._data.setdefault(key, value)
            self._data.move_to_end(key)
            while len(self._data) > max(0, self.maxsize):
                self._data.popitem(last=False)
            return value

    def values(self) -> list:
        with self._lock:
            return list(self._data.values())

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self):
        return len(self._data)


_registry: dict = {}     # name -> (cache with clear() and __len__, nbytes() or None)
_registry_lock = threading.Lock()


def renew_lock_after_fork(owner, attr: str, factory=threading.Lock) -> None:
    """Give `owner.attr` (a module or object holding a lock) a fresh lock in a forked child:
    only the forking thread survives a fork, so a lock another thread held stays held forever."""
    os.register_at_fork(after_in_child=lambda: setattr(owner, attr, factory()))


def _renew_cache_locks():
    """In a forked child: fresh locks for the registry and every registered cache that has one."""
    global _registry_lock
    _registry_lock = threading.Lock()
    for cache, _ in _registry.values():
        if hasattr(cache, "_lock"):
            cache._lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_cache_locks)


def register(name: str, cache, nbytes=None):
    """Register a module-level cache (anything with `clear()` and `len()`) under `name`;
    `nbytes()` optionally reports the memory its entries hold.  Returns the cache."""
    with _registry_lock:
        _registry[name] = (cache, nbytes)
    return cache


def _loaded_registry() -> dict:
    with _registry_lock:
        return dict(_registry)


def clear_caches(disk: bool = False) -> None:
    """Drop every in-memory cache (compiled plans and kernels, kernel wrappers, matmul plans);
    with `disk=True` also delete the disk kernel cache's entries (lazycandle/diskcache.py).
    Programs and tensors built before keep working: they hold their own compiled code."""
    for cache, _ in _loaded_registry().values():
        cache.clear()
    if disk:
        from . import diskcache     # (not at import: it loads hashlib and json)
        diskcache.clear()


def cache_info() -> dict:
    """{"plans", "kernels": counts; "memory_bytes": bytes of compiled code and IR held in
    memory; "disk_entries", "disk_bytes": the disk kernel cache's objects (0 when it is off);
    "disk_dir" (None when off), "disk_max": its bound in bytes; "caches": entry count of every
    registered cache by name}."""
    reg = _loaded_registry()
    counts = {name: len(cache) for name, (cache, _) in reg.items()}
    memory = sum(nbytes() for _, nbytes in reg.values() if nbytes is not None)
    from . import diskcache
    disk = diskcache.info()
    return {"plans": counts.get("plans", 0), "kernels": counts.get("kernels", 0), "memory_bytes": memory,
            "disk_entries": disk["entries"], "disk_bytes": disk["bytes"], "disk_dir": disk["dir"],
            "disk_max": disk["max"], "caches": counts}
