"""Test / bench helper: run one vmath function over a NumPy array through a JIT kernel

    void k(T* in, T* out, i64 n)

with an explicit vector body of vector_bits()/elem_bits lanes and a scalar tail, so both
paths of a builder get exercised (use sizes that are not multiples of the width)."""
from __future__ import annotations

import ctypes

import llvmlite.ir as ir
import numpy as np

from .. import caches
from . import jit, vmath
from .llvmutil import F32, F64, I64, VOID

_TYPES = {np.dtype(np.float32): F32, np.dtype(np.float64): F64}
_CTYPES = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}
_cache: dict = caches.register("vmath test kernels", {})


def width(dtype) -> int:
    """Vector lanes used for dtype on this host."""
    return jit.vector_bits() // (np.dtype(dtype).itemsize * 8)


def kernel_ir(name: str, dtype, params=(), lanes: int | None = None) -> str:
    """LLVM IR text of the test kernel for `name` on dtype (vector body of `lanes` lanes,
    default width(dtype); lanes=1 makes the body scalar too)."""
    dtype = np.dtype(dtype)
    t, size = _TYPES[dtype], dtype.itemsize
    w = lanes or width(dtype)
    vt = ir.VectorType(t, w) if w > 1 else t
    mod = ir.Module(name=f"vmath_{name}")
    mod.triple, mod.data_layout = jit.triple_and_layout()
    fn = ir.Function(mod, ir.FunctionType(VOID, [t.as_pointer(), t.as_pointer(), I64]), name="k")
    src, dst, n = fn.args
    src.add_attribute("noalias")
    dst.add_attribute("noalias")
    entry, vhead, vbody, shead, sbody, done = (fn.append_basic_block(s) for s in
                                              ("entry", "vhead", "vbody", "shead", "sbody", "done"))
    b = ir.IRBuilder(entry)
    nvec = b.and_(n, I64(-w))
    b.branch(vhead)

    b.position_at_end(vhead)
    i = b.phi(I64, "i")
    i.add_incoming(I64(0), entry)
    b.cbranch(b.icmp_signed("<", i, nvec), vbody, shead)
    b.position_at_end(vbody)
    x = b.load(b.bitcast(b.gep(src, [i], inbounds=True), vt.as_pointer()), align=size)
    y = vmath.emit(b, name, x, *params)
    b.store(y, b.bitcast(b.gep(dst, [i], inbounds=True), vt.as_pointer()), align=size)
    i.add_incoming(b.add(i, I64(w), flags=["nuw", "nsw"]), b.block)
    b.branch(vhead)

    b.position_at_end(shead)
    j = b.phi(I64, "j")
    j.add_incoming(i, vhead)
    b.cbranch(b.icmp_signed("<", j, n), sbody, done)
    b.position_at_end(sbody)
    xs = b.load(b.gep(src, [j], inbounds=True), align=size)
    b.store(vmath.emit(b, name, xs, *params), b.gep(dst, [j], inbounds=True), align=size)
    j.add_incoming(b.add(j, I64(1), flags=["nuw", "nsw"]), b.block)
    b.branch(shead)

    b.position_at_end(done)
    b.ret_void()
    return str(mod)


def get_kernel(name: str, dtype, params=(), lanes: int | None = None):
    """ctypes function for (name, dtype, params, lanes), compiled once per process."""
    dtype = np.dtype(dtype)
    params = tuple(float(p) for p in params)
    key = (name, dtype, params, lanes)
    fn = _cache.get(key)
    if fn is None:
        cm = jit.compile_ir(kernel_ir(name, dtype, params, lanes), export=["k"], name=f"vmath_{name}")
        ptr = ctypes.POINTER(_CTYPES[dtype])
        fn = ctypes.CFUNCTYPE(None, ptr, ptr, ctypes.c_int64)(cm.address("k"))
        fn._cm = cm                     # keep the code alive
        _cache[key] = fn
    return fn


def run(name: str, arr: np.ndarray, *params, out: np.ndarray | None = None,
        lanes: int | None = None) -> np.ndarray:
    """name(arr, *params) elementwise on a float32/float64 array (any shape), on the calling
    thread (a test and benchmark harness); `lanes` overrides the vector width."""
    a = np.ascontiguousarray(arr)
    if a.dtype not in _TYPES:
        raise TypeError(f"vmath_run: float32 or float64 array expected, got {a.dtype}")
    if out is None:
        out = np.empty_like(a)
    fn = get_kernel(name, a.dtype, params, lanes)
    n = a.size
    pa, po = a.ctypes.data, out.ctypes.data
    ptr = ctypes.POINTER(_CTYPES[a.dtype])
    fn(ctypes.cast(pa, ptr), ctypes.cast(po, ptr), n)
    return out
