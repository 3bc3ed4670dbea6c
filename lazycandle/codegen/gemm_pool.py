"""The tiled GEMM as one job of the native worker pool (runtime/native_pool.py), so a parallel
GEMM is a single native call: no Python pool hand-off and no GIL between the threads.

    lc_gemm_part(bufs, sizes, scalars, p_lo, p_hi)       (codegen/loops.py KERNEL_FN ABI)
      bufs  = [driver, params, workspace, counter]       driver: a codegen/gemm.py lc_gemm_<key>
      sizes = [ntask, block, workspace bytes per part]

The pool hands part p of [p_lo, p_hi) to one thread; part p works in its own slice of the
workspace and takes blocks of `block` tasks from the shared counter (an atomic add) until all
`ntask` are taken, so a thread slowed down by another process does not hold the others up.
The module does not depend on the dtype: the driver is called through its address.
"""
from __future__ import annotations

import llvmlite.ir as ir

from . import jit
from .gemm_ir import ONE, ZERO, I64, add, define, finalize_ir, for_range, gep, imin, load, mul, new_module
from .llvmutil import VOID

ENTRY = "lc_gemm_part"
BUFS = ("driver", "params", "workspace", "counter")
SIZES = ("ntask", "block", "ws_stride")

_I8P = ir.IntType(8).as_pointer()
_DRIVER = ir.FunctionType(VOID, [I64.as_pointer(), I64, I64, _I8P])


def build_ir() -> str:
    m = new_module("gemm_pool")
    fn, b = define(m, ENTRY, VOID, [_I8P.as_pointer(), I64.as_pointer(), I64.as_pointer(), I64, I64],
                   internal=False)
    for a in fn.args[:3]:
        a.attributes.discard("noalias")          # params and counter are shared between threads
    bufs, sizes, _scalars, p_lo, p_hi = fn.args
    driver, params, ws, counter = (load(b, bufs, i64c, 8) for i64c in (ZERO, ONE, ir.Constant(I64, 2),
                                                                       ir.Constant(I64, 3)))
    driver = b.bitcast(driver, _DRIVER.as_pointer())
    params = b.bitcast(params, I64.as_pointer())
    counter = b.bitcast(counter, I64.as_pointer())
    ntask, block, stride = (load(b, sizes, ir.Constant(I64, i), 8) for i in range(3))
    with for_range(b, p_lo, p_hi, name="part") as part:
        mine = gep(b, ws, mul(b, part, stride))
        take = b.append_basic_block("take")
        run = b.append_basic_block("run")
        done = b.append_basic_block("done")
        b.branch(take)
        b.position_at_end(take)
        lo = b.atomic_rmw("add", counter, block, "monotonic")
        b.cbranch(b.icmp_signed("<", lo, ntask), run, done)
        b.position_at_end(run)
        b.call(driver, [params, lo, imin(b, ntask, add(b, lo, block)), mine])
        b.branch(take)
        b.position_at_end(done)
    b.ret_void()
    return finalize_ir(m)


_state: dict = {}


def entry_address() -> int:
    """Address of lc_gemm_part (compiled once per process; cached on disk like any kernel)."""
    addr = _state.get("addr")
    if addr is None:
        cm = jit.compile_ir(build_ir(), [ENTRY], name=ENTRY)
        addr = _state["addr"] = cm.address(ENTRY)
        _state["module"] = cm
    return addr
