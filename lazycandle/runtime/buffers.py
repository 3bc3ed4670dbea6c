"""Buffer allocation with reuse.  Buffers are 1-D numpy arrays (numpy is the storage
container).

Large blocks are anonymous mappings of our own, 2 MiB aligned and advised for transparent huge
pages (one fault per 2 MiB instead of per 4 KiB, and far fewer TLB misses when kernels walk
transposed or strided views), and they are recycled: when the last array viewing a block dies,
the block goes back to a size-keyed free list instead of to the OS, so the next realize of the
same shapes writes into memory that is already mapped.  candle allocates per op; we do not.
Every block starts 64-byte aligned.  Blocks are private mappings (a forked child's writes stay
in the child).  Measured here (16 MiB, 2 vCPU VM): first touch of a fresh block costs ~6 ms with
huge pages against ~11-15 ms with 4 KiB pages, and a recycled block nothing, next to a 1.3 ms
add: reuse is what keeps an eager call at the memory limit."""
from __future__ import annotations

import atexit
import ctypes
import mmap
import sys
import threading
from sys import getrefcount

import numpy as np

from .. import caches

POOL_MIN_BYTES = 1 << 16          # smaller blocks come from malloc directly
POOL_MAX_BYTES = 1 << 30          # never keep more than this idle
HUGE = 1 << 21

_free: dict = {}                  # size -> [Block]
_idle = [0]
_lock = threading.Lock()
stats = {"reused": 0, "fresh": 0}

caches.renew_lock_after_fork(sys.modules[__name__], "_lock")


class Block:
    """One mapping: `addr` is its start (2 MiB-aligned from 2 MiB up, else page-aligned),
    `size` the usable bytes."""
    __slots__ = ("mm", "addr", "size")

    def __init__(self, size: int):
        # private, not mmap's default MAP_SHARED: shared anonymous memory is shmem, which
        # ignores MADV_HUGEPAGE (THP for shmem is off by default), so every 4 KiB page faulted.
        # A block under 2 MiB holds no huge page: mapped as it is, one mapping (not three)
        # and no 2 MiB of alignment slack each
        small = size < HUGE
        self.mm = mmap.mmap(-1, size if small else size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        off = 0 if small else (-base) % HUGE
        self.addr, self.size = base + off, size
        if not small and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self.mm.madvise(mmap.MADV_HUGEPAGE, off, size)
            except (OSError, ValueError):
                pass


def _round(nbytes: int) -> int:
    """Block size for a request: whole huge pages from 2 MiB up (the block's tail is a huge
    page too, and requests a little apart share one free list), else whole 4 KiB pages."""
    step = HUGE if nbytes >= HUGE else 4096
    return (nbytes + step - 1) & -step


def _release(block):
    with _lock:
        if _idle[0] + block.size > POOL_MAX_BYTES:
            return
        _free.setdefault(block.size, []).append(block)
        _idle[0] += block.size


def _data_pointer_offset() -> int:
    """Where an ndarray object keeps its data pointer (PyArrayObject_fields.data, the word after
    the object header), checked against `.ctypes.data` on arrays made in each way a buffer
    reaches the runtime; 0 when any of them disagrees (another layout: `address` then asks numpy)."""
    at = object.__basicsize__
    base = np.arange(64, dtype=np.float32)
    samples = (base, base[3:], base[::2], np.empty(0, np.int8), base[5:9].reshape(2, 2).T,
               np.frombuffer(memoryview(base.view(np.uint8)).toreadonly(), np.float32, 7, 12),
               np.frombuffer((ctypes.c_char * 256)(), np.float64, 4, 64), np.float32(1.0).reshape(()) + base[:1])
    for a in samples:
        if a.__class__ is not np.ndarray or ctypes.c_size_t.from_address(id(a) + at).value != a.ctypes.data:
            return 0
    return at


DATA_AT = _data_pointer_offset()
read_word = ctypes.c_size_t.from_address


def address(a: np.ndarray) -> int:
    """The data address of an array (its first element's): the data pointer read from the array
    object, one C call, as PyArray_DATA does (`a.ctypes.data` makes two Python objects, and
    each costs misses when a kernel has just streamed the caches out)."""
    if DATA_AT and isinstance(a, np.ndarray):
        return read_word(id(a) + DATA_AT).value
    return a.ctypes.data


def alloc(n: int, dtype) -> np.ndarray:
    """A 1-D, 64-byte aligned array of n elements of `dtype` (a lazycandle DType or a numpy
    dtype); contents undefined."""
    npdt = getattr(dtype, "numpy", None) or np.dtype(dtype)
    nbytes = n * npdt.itemsize
    if nbytes < POOL_MIN_BYTES:
        raw = np.empty(nbytes + 64, dtype=np.uint8)
        off = (-address(raw)) % 64
        return raw[off:off + nbytes].view(npdt)
    size = _round(nbytes)
    block = None
    with _lock:
        lst = _free.get(size)
        if lst:
            block = lst.pop()
            _idle[0] -= size
    if block is None:
        block = Block(size)
        stats["fresh"] += 1
    else:
        stats["reused"] += 1
    return np.frombuffer(_lease_type(size).from_address(block.addr).hold(block), dtype=npdt, count=n)


_lease_types: dict = {}     # block size -> ctypes array type of that length


def _lease_type(size: int):
    """The ctypes array type whose instances lease a block of `size` bytes.  An array's owner
    is a per-lease instance: numpy collapses view chains down to the first non-ndarray owner,
    so the lease dies exactly when the last view does, and its __del__ gives the block back
    (~1 us a lease, against ~2.5 us for a plain ctypes view with a weakref.finalize)."""
    tp = _lease_types.get(size)
    if tp is None:
        if len(_lease_types) >= 1024:   # the sizes seen are not bounded (a growing cache)
            _lease_types.clear()        # (a live lease keeps its own type)
        tp = _lease_types[size] = type("Lease", (ctypes.Array,), {
            "_type_": ctypes.c_char, "_length_": size, "hold": _hold, "__del__": _give_back})
    return tp


def _hold(lease, block):
    lease.block = block
    return lease


def _give_back(lease):
    if _release is not None:        # (None: a lease outliving the module at interpreter exit)
        _release(lease.block)


def trim() -> None:
    """Drop every idle block (returns memory to the OS)."""
    with _lock:
        _free.clear()
        _idle[0] = 0


# ---- results handed out again ----------------------------------------------------------------
# An eager call follows a kernel that streamed the caches out, where each fresh array costs
# misses: a pooled lease and its frombuffer ~10-15 us, a read-only view for .numpy() ~5-10.
# So the last result of each (count, dtype) is kept with the read-only views made of it, and
# given out again once nothing else holds any of them (read from reference counts, against
# counts measured at import on an entry nothing else holds).  A result is its caller's while
# anything holds it or a view of it: then the next one of that size is fresh (and kept instead).
KEEP_RESULTS = 64               # kept (count, dtype) entries before the table starts afresh
KEEP_RESULT_BYTES = 1 << 22     # larger results are not kept (their alloc is small next to the kernel)
KEEP_VIEWS = 4                  # read-only views kept per result (by shape)


class _Kept:
    __slots__ = ("buf", "views")

    def __init__(self, buf):
        self.buf = buf
        self.views = {}             # shape -> (read-only view, its strides when made); replaced whole


class _Results:
    """The kept results by (count, numpy dtype) and by id of their array."""

    def __init__(self):
        self.by_size, self.by_id = {}, {}

    def clear(self):
        self.by_size, self.by_id = {}, {}

    def __len__(self):
        return len(self.by_size)


_results = caches.register("kept results", _Results())
atexit.register(_results.clear)     # (their leases go back while the module still stands)


def _holders(kept) -> tuple:
    """(references to the kept array and to its owner -- the array or lease it views -- beyond
    one per view; the most references to one read-only view, to the 1-D array a reshaped view
    views, and to the read-only memoryview under it).  Each counted: a numpy view of the result
    refers to it or to its owner, depending on how numpy collapsed its base chain; a view made
    of a reshaped read-only view (a row, a slice, a transpose) refers to that 1-D array, not to
    the view; and `.base` hands out the memoryview itself."""
    most = most_arr = most_mv = 0
    for view, _ in kept.views.values():
        c = getrefcount(view)
        if c > most:
            most = c
        arr = view.base
        if arr.__class__ is np.ndarray:         # a reshaped view: arr is the 1-D array under it
            c = getrefcount(arr)
            if c > most_arr:
                most_arr = c
            mv = arr.base
        else:                                   # a 1-D view is that array: its base is the memoryview
            mv = arr
        del arr
        c = getrefcount(mv)
        if c > most_mv:
            most_mv = c
        del mv
    buf = kept.buf
    return getrefcount(buf) + getrefcount(buf.base) - len(kept.views) - 1, most, most_arr, most_mv


def result(n: int, dtype) -> np.ndarray:
    """`alloc(n, dtype)` for a result handed to a caller: the array given out last for
    (n, dtype) when nothing holds it or its read-only views any more, else a fresh one."""
    npdt = dtype if isinstance(dtype, np.dtype) else getattr(dtype, "numpy", None) or np.dtype(dtype)
    key = (n, npdt)
    table = _results
    kept = table.by_size.get(key)
    if kept is not None:
        buf = kept.buf      # held while checking (+1 below): two threads checking at once see each other
        refs, view_refs, arr_refs, mv_refs = _holders(kept)
        if refs == _IDLE[0] + 1 and view_refs <= _IDLE[1] and arr_refs <= _IDLE[2] and mv_refs <= _IDLE[3]:
            return buf
    buf = alloc(n, npdt)
    if n * npdt.itemsize <= KEEP_RESULT_BYTES:
        if len(table.by_size) >= KEEP_RESULTS:
            table.clear()
        by_id = table.by_id
        if kept is not None:
            by_id.pop(id(kept.buf), None)
        kept = table.by_size[key] = _Kept(buf)
        by_id[id(buf)] = kept
    return buf


def readonly(buf: np.ndarray, shape) -> np.ndarray:
    """`buf` (1-D, contiguous) as an array of `shape` whose base is a read-only memoryview:
    `flags.writeable` is False and cannot be set True again.  For a kept result, the view made
    before when nothing holds it any more and it still has that shape, strides and dtype."""
    kept = _results.by_id.get(id(buf))
    if kept is None or kept.buf is not buf:
        return _readonly(buf, shape)
    views = kept.views          # (replaced whole, never changed: other threads may be reading it)
    got = views.get(shape)
    if got is not None:
        view, strides = got     # (held while checking, as in `result`)
        if getrefcount(view) == _IDLE[1] and view.shape == shape and view.strides == strides \
                and view.dtype == buf.dtype:
            return view
    view = _readonly(buf, shape)
    views = dict(views) if len(views) < KEEP_VIEWS else {}
    views[shape] = (view, view.strides)
    kept.views = views
    return view


def forget(buf: np.ndarray) -> None:
    """Stop keeping `buf` (it is about to be written in place: only its holders may see it)."""
    table = _results
    kept = table.by_id.pop(id(buf), None)
    if kept is not None and kept.buf is buf:
        key = (buf.size, buf.dtype)
        if table.by_size.get(key) is kept:
            del table.by_size[key]
        kept.views = {}


def _readonly(buf, shape):
    dt = buf.dtype
    # (a dtype from outside numpy, such as bfloat16, has no buffer format: its bytes are shared)
    view = memoryview(buf if dt.isbuiltin == 1 else buf.view(np.uint8)).toreadonly()
    arr = np.frombuffer(view, dtype=dt)         # (its base is the read-only view)
    return arr if len(shape) == 1 else arr.reshape(shape)


def _idle_counts() -> tuple:
    """_holders of a kept result with one reshaped view and nothing else holding either (an
    owner is held by its result alone, whether a small result's array or a large one's lease)."""
    kept = _Kept(alloc(16, np.float32))
    view = _readonly(kept.buf, (4, 4))
    kept.views = {(4, 4): (view, view.strides)}
    del view
    return _holders(kept)


_IDLE = _idle_counts()
