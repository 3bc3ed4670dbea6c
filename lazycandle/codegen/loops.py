"""Loop-building helpers over llvmlite's IRBuilder: counted loops with i64 induction variables
(phi based, `nuw nsw` increments) and kernel entry boilerplate."""
from __future__ import annotations

import contextlib
import ctypes

import llvmlite.ir as ir

from . import jit
from .llvmutil import I8, I64, VOID


_PLAIN = "lc.loop.plain"


def plain_loop_md(module: ir.Module):
    """Loop metadata asking LLVM to neither vectorise nor unroll the loop: our kernels carry
    explicit vector code, and re-vectorising their scalar edge loops only costs compile time.
    Completed into a self-referencing node by `finalize_ir`."""
    return module.add_metadata([ir.MetaDataString(module, _PLAIN)])


def finalize_ir(module: ir.Module) -> str:
    """IR text of `module` with the plain-loop placeholder turned into real loop metadata."""
    text = str(module)
    marker = f'!{{ !"{_PLAIN}" }}'
    for line in text.splitlines():
        if line.endswith(marker):
            node = line.split(" = ")[0]
            text = text.replace(line, f'{node} = distinct !{{{node}, !{{!"llvm.loop.vectorize.enable", i1 false}}, '
                                      f'!{{!"llvm.loop.unroll.disable"}}}}')
            break
    return text


def plain_latch(b: ir.IRBuilder):
    """An `on_latch` for counted_loop marking the loop plain (plain_loop_md)."""
    return lambda br: br.set_metadata("llvm.loop", plain_loop_md(b.module))


def new_module(name: str) -> ir.Module:
    m = ir.Module(name)
    m.triple, m.data_layout = jit.triple_and_layout()
    return m


# The ABI of every parallel kernel: void @name(i8** bufs, i64* sizes, i64* scalars, i64 lo, i64 hi).
# bufs: one pointer per input then per output; sizes: the kernel's runtime sizes and strides;
# scalars: 8-byte slots (f64 bits for float scalars, i64 for integers); [lo, hi): the units this
# call runs.  All kernels of a plan share it, so they can later be linked behind one entry.
KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def kernel_function(m: ir.Module, name: str):
    """Declare the kernel `name` with the common ABI; returns (function, builder at entry)."""
    p64 = I64.as_pointer()
    fn = ir.Function(m, ir.FunctionType(VOID, [I8.as_pointer().as_pointer(), p64, p64, I64, I64]), name)
    for a, n in zip(fn.args, ("bufs", "sizes", "scalars", "lo", "hi")):
        a.name = n
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    return fn, b


def unit_range(fn):
    """The kernel's [lo, hi) arguments."""
    return fn.args[3], fn.args[4]


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
