"""Loop-building helpers over llvmlite's IRBuilder: counted loops with i64 induction variables
(phi based, `nuw nsw` increments) and kernel entry boilerplate."""
from __future__ import annotations

import contextlib

import llvmlite.ir as ir

from . import jit
from .llvmutil import I8, I64, VOID


def new_module(name: str) -> ir.Module:
    m = ir.Module(name)
    m.triple, m.data_layout = jit.triple_and_layout()
    return m


def kernel_function(m: ir.Module, name: str):
    """define void @name(i8** ptrs, i64 lo, i64 hi) -- the ABI of every parallel kernel."""
    fn = ir.Function(m, ir.FunctionType(VOID, [I8.as_pointer().as_pointer(), I64, I64]), name)
    fn.args[0].name, fn.args[1].name, fn.args[2].name = "ptrs", "lo", "hi"
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    return fn, b


def arg_pointer(b: ir.IRBuilder, ptrs, index: int, elem_type: ir.Type, name=""):
    p = b.load(b.gep(ptrs, [I64(index)], inbounds=True), name=f"{name}raw")
    return b.bitcast(p, elem_type.as_pointer(), name=name)


@contextlib.contextmanager
def counted_loop(b: ir.IRBuilder, start, stop, step=1, name="i", on_latch=None):
    """for (i = start; i < stop; i += step): yields i.  The body may create blocks.
    Runs zero times when start >= stop.  `on_latch(branch)` may tag the back edge (loop
    metadata)."""
    step = I64(step) if isinstance(step, int) else step
    pre = b.block
    fn = pre.function
    head = fn.append_basic_block(f"{name}.head")
    body = fn.append_basic_block(f"{name}.body")
    done = fn.append_basic_block(f"{name}.done")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    i.add_incoming(start, pre)
    b.cbranch(b.icmp_signed("<", i, stop), body, done)
    b.position_at_end(body)
    yield i
    nxt = b.add(i, step, name=f"{name}.next", flags=("nsw",))
    i.add_incoming(nxt, b.block)
    latch = b.branch(head)
    if on_latch is not None:
        on_latch(latch)
    b.position_at_end(done)
