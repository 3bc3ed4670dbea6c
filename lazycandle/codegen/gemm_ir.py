"""IR-building helpers shared by the GEMM generators: i64 counted loops, typed pointer
arithmetic, vector loads/stores and the storage <-> accumulator conversions read from the dtype
table (codec for f16/bf16/f8, sign/zero extension for narrow integers)."""
from __future__ import annotations

from contextlib import contextmanager

import llvmlite.ir as ir

from ..dtype import DType
from . import codecs
from .llvmutil import I32, I64, VOID, intrinsic, ltype, type_suffix, vec, width_of
from .loops import counted_loop, plain_latch

ZERO = ir.Constant(I64, 0)
ONE = ir.Constant(I64, 1)


def i64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def acc_name(dt: DType) -> str:
    """LLVM type a dot product of `dt` accumulates in: the compute type for floats (f32 for the
    16/8-bit floats), at least i32 for integers (the low bits of a wider wrapping sum are the
    narrow wrapping sum)."""
    return dt.compute if dt.is_float else f"i{max(32, dt.bits)}"


def type_bytes(t: ir.Type) -> int:
    """Size of a scalar integer or float type in bytes."""
    return t.width // 8 if isinstance(t, ir.IntType) else {ir.HalfType: 2, ir.FloatType: 4, ir.DoubleType: 8}[type(t)]


def acc_bytes(dt: DType) -> int:
    return type_bytes(acc_type(dt))


def storage_type(dt: DType) -> ir.Type:
    return ltype(dt.storage)


def acc_type(dt: DType) -> ir.Type:
    return ltype(acc_name(dt))


def to_acc(b: ir.IRBuilder, dt: DType, v):
    """Stored value(s) of `dt` -> accumulator value(s)."""
    if dt.codec:
        return codecs.decode(b, dt.codec, v)
    target = vec(acc_type(dt), width_of(v.type))
    if v.type == target:
        return v
    return b.sext(v, target) if dt.is_signed else b.zext(v, target)


def from_acc(b: ir.IRBuilder, dt: DType, v):
    """Accumulator value(s) -> stored value(s) of `dt`, rounded once (floats) or wrapped (ints)."""
    if dt.codec:
        return codecs.encode(b, dt.codec, v)
    target = vec(storage_type(dt), width_of(v.type))
    return v if v.type == target else b.trunc(v, target)


def acc_add(b, x, y):
    return b.fadd(x, y) if _is_float(x.type) else b.add(x, y)


def _is_float(t) -> bool:
    s = t.element if isinstance(t, ir.VectorType) else t
    return isinstance(s, (ir.HalfType, ir.FloatType, ir.DoubleType))


def zero(t: ir.Type):
    s = t.element if isinstance(t, ir.VectorType) else t
    c = ir.Constant(s, 0.0 if _is_float(s) else 0)
    return ir.Constant(t, [c] * t.count) if isinstance(t, ir.VectorType) else c


# ---- pointers ---------------------------------------------------------------------------
def gep(b, ptr, idx):
    return b.gep(ptr, [idx], inbounds=True)


def load(b, ptr, idx, align):
    return b.load(gep(b, ptr, idx), align=align)


def store(b, val, ptr, idx, align):
    b.store(val, gep(b, ptr, idx), align=align)


def vload(b, ptr, idx, width, align):
    """Load `width` consecutive elements starting at ptr[idx] as one vector."""
    p = b.bitcast(gep(b, ptr, idx), vec(ptr.type.pointee, width).as_pointer())
    return b.load(p, align=align)


def vstore(b, val, ptr, idx, align):
    p = b.bitcast(gep(b, ptr, idx), val.type.as_pointer())
    b.store(val, p, align=align)


def masked_vload(b, ptr, idx, mask, align):
    """The lanes of `mask` (an i1 vector) from ptr[idx ...]; the others read as 0 and are not
    touched in memory (a tail past the end of a buffer)."""
    vt = vec(ptr.type.pointee, mask.type.count)
    fn = intrinsic(b.module, f"llvm.masked.load.{type_suffix(vt)}.p0{type_suffix(vt)}", vt,
                   [vt.as_pointer(), I32, mask.type, vt])
    return b.call(fn, [b.bitcast(gep(b, ptr, idx), vt.as_pointer()), I32(align), mask, zero(vt)])


def masked_vstore(b, val, ptr, idx, mask, align):
    """Store the lanes of `mask` of vector val at ptr[idx ...]."""
    vt = val.type
    fn = intrinsic(b.module, f"llvm.masked.store.{type_suffix(vt)}.p0{type_suffix(vt)}", VOID,
                   [vt, vt.as_pointer(), I32, mask.type])
    b.call(fn, [val, b.bitcast(gep(b, ptr, idx), vt.as_pointer()), I32(align), mask])


def imin(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def mul(b, x, y):
    return b.mul(x, y, flags=["nsw"])


def add(b, x, y):
    return b.add(x, y, flags=["nsw"])


# ---- control flow -----------------------------------------------------------------------
@contextmanager
def for_range(b: ir.IRBuilder, start, stop, step=ONE, name="i", plain=True):
    """`for (i = start; i < stop; i += step)` with an i64 phi; yields i.  plain: mark the loop
    not to be vectorised or unrolled by LLVM."""
    with counted_loop(b, start, stop, step, name, on_latch=plain_latch(b) if plain else None) as i:
        yield i


@contextmanager
def if_then(b: ir.IRBuilder, cond, name="if"):
    then = b.append_basic_block(f"{name}.then")
    after = b.append_basic_block(f"{name}.end")
    b.cbranch(cond, then, after)
    b.position_at_end(then)
    yield
    b.branch(after)
    b.position_at_end(after)


def define(module: ir.Module, name: str, ret, args, internal=True) -> tuple:
    """Create a function; returns (fn, builder positioned in its entry block).  Internal
    functions are `noinline`: inlining the micro-kernel and packers into the driver only
    multiplies LLVM's work (loop unswitching on the first/last flags) for no speed."""
    fn = ir.Function(module, ir.FunctionType(ret, args), name=name)
    if internal:
        fn.linkage = "internal"
        fn.attributes.add("noinline")
    for a in fn.args:
        if isinstance(a.type, ir.PointerType):
            a.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    return fn, b


def new_module(name: str) -> ir.Module:
    from .jit import triple_and_layout
    m = ir.Module(name=name)
    m.triple, m.data_layout = triple_and_layout()
    return m


