"""A kernel that shows which thread ran which chunk, and back-to-back pool sections of it
checked against NumPy (tests/test_native_pool.py; its fork probe imports this file too)."""
from __future__ import annotations

import numpy as np
import llvmlite.ir as ir

from lazycandle.codegen import jit
from lazycandle.codegen.llvmutil import I64
from lazycandle.codegen.loops import arg_pointer, counted_loop, kernel_function, new_module, unit_range
from lazycandle.runtime import native_pool

CHUNK = 4096            # units per thread and section


def stamp_kernel():
    """stamp(bufs=[out, who], scalars=[s], lo, hi): out[i] = s + i on [lo, hi), and
    who[lo] = the pthread id of the thread that ran the chunk.  Returns (module, address)."""
    m = new_module("pool_stamp")
    fn, b = kernel_function(m, "stamp")
    self_fn = ir.Function(m, ir.FunctionType(I64, []), "pthread_self")
    out, who = (arg_pointer(b, fn.args[0], k, I64) for k in (0, 1))
    s = b.load(fn.args[2])
    lo, hi = unit_range(fn)
    with counted_loop(b, lo, hi) as i:
        b.store(b.add(s, i), b.gep(out, [i]))
    b.store(b.call(self_fn, []), b.gep(who, [lo]))
    b.ret_void()
    cm = jit.link_ir(str(m), ["stamp"], process=True)
    return cm, cm.address("stamp")


def run_sections(addr: int, nthreads: int, sections: int, first: int = 0) -> set:
    """`sections` back-to-back pool sections of the stamp kernel over nthreads home ranges of
    CHUNK units, each checked in full right after it returns (a chunk still running, or run
    twice with another section's scalar, shows as a wrong value); returns the pthread ids of
    the threads that ran a home range's first chunk in any of them (a worker that was late
    may have found its range taken by the others)."""
    extent = CHUNK * nthreads
    out, who = np.full(extent, -1, np.int64), np.zeros(extent, np.int64)
    ptrs = np.array([out.ctypes.data, who.ctypes.data], np.int64)
    scalars = np.zeros(1, np.int64)
    base = np.arange(extent, dtype=np.int64)
    ids = set()
    native_pool.ensure(nthreads)
    for s in range(first, first + sections):
        scalars[0] = s * extent
        native_pool.parallel(addr, ptrs.ctypes.data, 0, scalars.ctypes.data, 0, extent, nthreads=nthreads)
        if not np.array_equal(out, base + s * extent):
            bad = np.flatnonzero(out != base + s * extent)
            raise AssertionError(f"section {s}: {bad.size} wrong values, first at {bad[0]}")
        ids.update(who[::CHUNK].tolist())
    return ids
