"""The eager launcher (codegen/launch_ir.py): a CPython builtin per prepared native runner,
whose `self` is its launch descriptor, so that an eager call fills the program's pointers and
makes its native call in one builtin call instead of ctypes steps (native_exec.buffers_runner).

`launcher(...)` returns that builtin, or None where it cannot be built: a CPython or NumPy
whose object layout this process could not verify (an ndarray's data pointer, an object's type
pointer, a threading.Lock's held flag), or a C API that does not resolve.  The module is
linked once per process, on first use."""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from ..codegen import launch_ir as L
from .buffers import DATA_AT, address

METH_FASTCALL = 0x0080
_lock = threading.Lock()
_state: dict = {}           # "module", "def" (the PyMethodDef), "new" (PyCFunction_NewEx), or "failed"


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p),
                ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


def _type_offset() -> int:
    """Where an object keeps its type pointer (ob_type, the header's last word), checked on a
    few objects; 0 when it is not there."""
    at = object.__basicsize__ - ctypes.sizeof(ctypes.c_void_p)
    for obj in (np.zeros(1), [], 1.5, "s"):
        if ctypes.c_void_p.from_address(id(obj) + at).value != id(type(obj)):
            return 0
    return at


def _locked_offset() -> int:
    """Where a threading.Lock keeps the byte that is nonzero while it is held (3.11's
    lockobject.locked), found as the one byte of the object that follows the lock state on
    two locks over three acquire / release rounds; 0 when there is not exactly one."""
    locks = [threading.Lock(), threading.Lock()]
    size = type(locks[0]).__basicsize__
    candidates = set(range(object.__basicsize__, size))
    for _ in range(3):
        for lk in locks:
            free = ctypes.string_at(id(lk), size)
            with lk:
                held = ctypes.string_at(id(lk), size)
            candidates = {i for i in candidates if free[i] == 0 and held[i] != 0}
    return candidates.pop() if len(candidates) == 1 else 0


def _load() -> dict:
    if not _state:
        with _lock:
            if not _state:
                _state.update(_link())
    return _state


def _link() -> dict:
    type_at, locked_at = _type_offset(), _locked_offset()
    if not DATA_AT or not type_at or not locked_at:
        return {"failed": True}
    from ..codegen import jit
    api = ctypes.pythonapi
    try:
        imports = {name: ctypes.cast(getattr(api, name), ctypes.c_void_p).value for name in L.C_API}
    except AttributeError:
        return {"failed": True}
    cm = jit.link_ir(L.build(DATA_AT, type_at, locked_at), [L.EXPORT], imports=imports)
    mdef = _MethodDef(b"lc_launch", cm.address(L.EXPORT), METH_FASTCALL, None)
    new = api.PyCFunction_NewEx
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]
    return {"module": cm, "def": mdef, "new": new}


def launcher(fn: int, ptrs: int, sizes: int, status, feeds, outs, scalar_kinds):
    """The builtin `launch(nthreads, out, in_bufs, offsets, lock, scalars) -> status | DECLINED`
    of a native segment function at address `fn` reading pointers at `ptrs` and sizes at
    `sizes` (the caller keeps both alive while the builtin lives): it writes in_bufs[i]'s data
    address plus offsets[s] * itemsize at each pointer position of `feeds` ((position, i, s,
    itemsize) each) and `out`'s data address plus a byte offset at each of `outs` ((position,
    byte offset) each), packs `scalars` by their slots' dtype kinds (`scalar_kinds`: "f", "i"
    or "u" each) into slots of its own, zeroes the int64 array `status` (or None) and calls
    fn -- unless `lock` is held.  None when the launcher cannot be built here."""
    st = _load()
    codes = {"f": L.SCALAR_F64, "i": L.SCALAR_I64, "u": L.SCALAR_U64}
    if "failed" in st or any(k not in codes for k in scalar_kinds):
        return None
    head = [0] * L.DESC_WORDS
    head[L.DESC_FN], head[L.DESC_PTRS], head[L.DESC_SIZES] = fn, ptrs, sizes
    if status is not None:
        head[L.DESC_STATUS], head[L.DESC_STATUS_WORDS] = address(status), status.size
    head[L.DESC_NDARRAY], head[L.DESC_LIST], head[L.DESC_TUPLE] = id(np.ndarray), id(list), id(tuple)
    head[L.DESC_LOCK] = id(type(_lock))
    head[L.DESC_NFEED], head[L.DESC_NOUT], head[L.DESC_NSCALAR] = len(feeds), len(outs), len(scalar_kinds)
    words = head + [w for f in feeds for w in f] + [w for o in outs for w in o] + [codes[k] for k in scalar_kinds]
    desc = np.array(words + [0] * max(len(scalar_kinds), 1), np.int64)     # (+ the scalar slots)
    return st["new"](ctypes.addressof(st["def"]), desc, None)
