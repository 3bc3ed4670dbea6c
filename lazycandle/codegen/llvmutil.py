"""Small llvmlite helpers shared by every kernel generator: LLVM types by name, intrinsic
declaration (llvmlite's declare_intrinsic cannot name vector overloads), vector splats and
fast-math flag sets."""
from __future__ import annotations

import llvmlite.ir as ir

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
VOID = ir.VoidType()

TYPES = {"i1": I1, "i8": I8, "i16": I16, "i32": I32, "i64": I64,
         "half": F16, "float": F32, "double": F64}

# Never nnan/ninf: they let LLVM delete NaN and Inf handling.
FM_ELEMENTWISE = ("contract",)
FM_REDUCE = ("contract", "reassoc", "nsz")


def ltype(name: str) -> ir.Type:
    return TYPES[name]


def vec(t: ir.Type, width: int) -> ir.Type:
    return t if width == 1 else ir.VectorType(t, width)


def scalar_type(t: ir.Type) -> ir.Type:
    return t.element if isinstance(t, ir.VectorType) else t


def width_of(t: ir.Type) -> int:
    return t.count if isinstance(t, ir.VectorType) else 1


def is_float_type(t: ir.Type) -> bool:
    return isinstance(scalar_type(t), (ir.HalfType, ir.FloatType, ir.DoubleType))


def type_suffix(t: ir.Type) -> str:
    """LLVM overload suffix: f32, v8f32, i64, v16i8 ..."""
    s = scalar_type(t)
    base = {ir.HalfType: "f16", ir.FloatType: "f32", ir.DoubleType: "f64"}.get(type(s))
    if base is None:
        base = f"i{s.width}"
    return f"v{t.count}{base}" if isinstance(t, ir.VectorType) else base


def intrinsic(module: ir.Module, name: str, ret: ir.Type, args) -> ir.Function:
    """Get or declare `name` (a fully mangled intrinsic name such as llvm.fma.v8f32)."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ret, list(args)), name=name)


def call_intrinsic(b: ir.IRBuilder, base: str, args, ret: ir.Type | None = None, flags=()):
    """Call llvm.<base>.<suffix of first arg type>, e.g. call_intrinsic(b, "fma", [x, y, z])."""
    t = args[0].type
    fn = intrinsic(b.module, f"llvm.{base}.{type_suffix(t)}", ret or t, [a.type for a in args])
    return b.call(fn, args, fastmath=flags) if flags else b.call(fn, args)


def const(t: ir.Type, value):
    """A scalar constant, or a splat vector constant when t is a vector type."""
    s = scalar_type(t)
    c = ir.Constant(s, value)
    if isinstance(t, ir.VectorType):
        return ir.Constant(t, [c] * t.count)
    return c


def splat(b: ir.IRBuilder, x, width: int):
    """Broadcast scalar value x to a vector of `width` lanes (vbroadcast)."""
    if width == 1:
        return x
    vt = ir.VectorType(x.type, width)
    v = b.insert_element(ir.Constant(vt, ir.Undefined), x, I32(0))
    return b.shuffle_vector(v, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(I32, width), [0] * width))
