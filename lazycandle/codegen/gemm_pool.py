"""The tiled GEMM as one job of the native worker pool (runtime/native_pool.py), so a parallel
GEMM is a single native call: no Python pool hand-off and no GIL between the threads.

    lc_gemm_part(bufs, sizes, scalars, p_lo, p_hi)       (codegen/loops.py KERNEL_FN ABI)
      bufs  = [driver, params, workspace, counter, packer, pack counter, packs done]
      sizes = [ntask, block, workspace bytes per part, npack]
      driver: a codegen/gemm.py lc_gemm_<key>; packer: its "pack_b" role (when npack > 0)

The pool hands part p of [p_lo, p_hi) to one thread; part p works in its own slice of the
workspace.  With npack > 0 it first takes pack tasks one at a time from the pack counter (B
is packed once, shared by every part) and then waits until all `npack` are done; then it
takes blocks of `block` GEMM tasks from the shared counter (an atomic add) until all `ntask`
are taken, so a thread slowed down by another process does not hold the others up (a late
thread finds the packing done and only joins the GEMM tasks).  The module does not depend on
the dtype: the driver and packer are called through their addresses.
"""
from __future__ import annotations

import llvmlite.ir as ir

from . import jit
from .gemm_ir import ONE, I64, add, define, for_range, gep, imin, load, mul, new_module
from .llvmutil import VOID
from .loops import finalize_ir

ENTRY = "lc_gemm_part"
BUFS = ("driver", "params", "workspace", "counter", "packer", "pack_counter", "packs_done")
SIZES = ("ntask", "block", "ws_stride", "npack")

_I8P = ir.IntType(8).as_pointer()
_DRIVER = ir.FunctionType(VOID, [I64.as_pointer(), I64, I64, _I8P])


def build_ir() -> str:
    m = new_module("gemm_pool")
    fn, b = define(m, ENTRY, VOID, [_I8P.as_pointer(), I64.as_pointer(), I64.as_pointer(), I64, I64],
                   internal=False)
    for a in fn.args[:3]:
        a.attributes.discard("noalias")          # params and counter are shared between threads
    bufs, sizes, _scalars, p_lo, p_hi = fn.args
    driver, params, ws, counter, packer, pack_counter, packs_done = (
        load(b, bufs, ir.Constant(I64, i), 8) for i in range(len(BUFS)))
    driver = b.bitcast(driver, _DRIVER.as_pointer())
    packer = b.bitcast(packer, _DRIVER.as_pointer())
    params = b.bitcast(params, I64.as_pointer())
    counter, pack_counter, packs_done = (b.bitcast(x, I64.as_pointer()) for x in (counter, pack_counter, packs_done))
    ntask, block, stride, npack = (load(b, sizes, ir.Constant(I64, i), 8) for i in range(len(SIZES)))
    with for_range(b, p_lo, p_hi, name="part") as part:
        mine = gep(b, ws, mul(b, part, stride))
        _pack_phase(b, packer, params, mine, pack_counter, packs_done, npack)
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


def _pack_phase(b, packer, params, ws, pack_counter, packs_done, npack) -> None:
    """Take pack tasks until none is left, then spin until every one is done (the packed B
    is written with plain stores before each task's seq_cst count, and read after the load
    that sees the last one)."""
    take = b.append_basic_block("pack.take")
    run = b.append_basic_block("pack.run")
    wait = b.append_basic_block("pack.wait")
    done = b.append_basic_block("pack.done")
    b.branch(take)
    b.position_at_end(take)
    t = b.atomic_rmw("add", pack_counter, ONE, "seq_cst")
    b.cbranch(b.icmp_signed("<", t, npack), run, wait)
    b.position_at_end(run)
    b.call(packer, [params, t, add(b, t, ONE), ir.Constant(_I8P, None)])
    b.atomic_rmw("add", packs_done, ONE, "seq_cst")
    b.branch(take)
    b.position_at_end(wait)
    finished = b.load_atomic(packs_done, "seq_cst", 8)
    spin = b.append_basic_block("pack.spin")
    b.cbranch(b.icmp_signed(">=", finished, npack), done, spin)
    b.position_at_end(spin)
    if jit.triple_and_layout()[0].startswith(("x86_64", "i386", "i686")):
        pause = b.module.globals.get("llvm.x86.sse2.pause") or ir.Function(
            b.module, ir.FunctionType(VOID, []), name="llvm.x86.sse2.pause")
        b.call(pause, [])
    b.branch(wait)
    b.position_at_end(done)


_state: dict = {}


def entry_address() -> int:
    """Address of lc_gemm_part (compiled once per process; cached on disk like any kernel)."""
    addr = _state.get("addr")
    if addr is None:
        cm = jit.compile_ir(build_ir(), [ENTRY], name=ENTRY)
        addr = _state["addr"] = cm.address(ENTRY)
        _state["module"] = cm
    return addr
