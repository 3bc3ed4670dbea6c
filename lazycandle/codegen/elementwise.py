"""Fused elementwise kernels.  One kernel evaluates a DAG of elementwise ops over N strided
inputs and writes M contiguous outputs of the same shape.

Loop nest (after merging dims that are contiguous for every operand):
  rank 1:  i in [lo, hi): vector body of W lanes, then a scalar tail;
  rank>1:  rows r in [lo, hi) of the flattened outer dims (row -> outer index by div/mod),
           then the inner dim as a vector body + scalar tail.
Each input is read through its own strides: inner stride 1 -> vector load, 0 -> one scalar load
splatted, otherwise per-lane loads.  f16/bf16/f8 values are decoded on load, rounded after every
op (so fusion never changes a value) and encoded on store.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import llvmlite.ir as ir

from .. import dtype as D
from ..ir.ops import OPS
from . import codecs, jit
from .llvmutil import I1, I8, I64, ltype, vec, splat, const, call_intrinsic, width_of, scalar_type
from .loops import new_module, kernel_function, arg_pointer, counted_loop


@dataclass(frozen=True)
class EwSpec:
    """Structural description of a fused elementwise kernel (also its cache key)."""
    shape: tuple            # merged iteration shape, rank >= 1
    inputs: tuple           # ((dtype_name, strides), ...)
    instrs: tuple           # ((op_name, arg, dtype_name, out_dtype_name, refs), ...)
    outputs: tuple          # ((instr_index, dtype_name), ...)  contiguous outputs

    @property
    def parallel_extent(self) -> int:
        return self.shape[0] if len(self.shape) == 1 else prod(self.shape[:-1])

    @property
    def inner(self) -> int:
        return 1 if len(self.shape) == 1 else self.shape[-1]

    def width(self) -> int:
        bits = max([_bits(D.DType.from_name(dt)) for dt, _ in self.inputs] +
                   [_bits(D.DType.from_name(ins[3])) for ins in self.instrs] +
                   [_bits(D.DType.from_name(ins[2])) for ins in self.instrs] + [8])
        return max(4, jit.vector_bits() // bits)


def _bits(dt) -> int:
    return ltype(dt.compute).width if dt.compute.startswith("i") else {"float": 32, "double": 64}[dt.compute]


def _cast(b, v, src: D.DType, dst: D.DType):
    """Convert a compute value of `src` to the compute type of `dst` (one rounding)."""
    w = width_of(v.type)
    dst_t = vec(ltype(dst.compute), w)
    if src.is_float:
        if dst.is_float:
            if dst.codec:
                return codecs.decode(b, dst.codec, codecs.encode(b, dst.codec, v))
            if v.type == dst_t:
                return v
            sw, dw = _bits(src), _bits(dst)
            return b.fpext(v, dst_t) if dw > sw else b.fptrunc(v, dst_t)
        wide = b.call(_sat_fn(b, v.type, w), [v])   # saturating: NaN/out-of-range never trap
        return wide if dst_t == wide.type else b.trunc(wide, dst_t)
    # src integer
    if dst.is_float:
        mid_t = vec(ltype("double"), w) if dst.codec or dst.compute == "double" else dst_t
        f = b.sitofp(v, mid_t) if src.is_signed else b.uitofp(v, mid_t)
        if dst.codec:
            return codecs.decode(b, dst.codec, codecs.encode(b, dst.codec, f))
        return f
    sw, dw = _bits(src), _bits(dst)
    if dw == sw:
        return v
    if dw < sw:
        return b.trunc(v, dst_t)
    return b.sext(v, dst_t) if src.is_signed else b.zext(v, dst_t)


def _sat_fn(b, src_t, w):
    from .llvmutil import intrinsic, type_suffix
    ret = vec(I64, w)
    return intrinsic(b.module, f"llvm.fptosi.sat.{type_suffix(ret)}.{type_suffix(src_t)}", ret, [src_t])


def _emit_instrs(b, spec, load, w):
    """Evaluate the instruction list.  `load(k)` returns input k's raw storage value.
    Returns the list of values to store (storage representation) per output."""
    raw = {}        # ref -> raw storage value (inputs, or copies of them)
    comp = {}       # ref -> compute value
    dtypes = {}

    def get(ref, want_raw=False):
        if ref[0] == "i":
            k = ref[1]
            if ref not in raw:
                raw[ref] = load(k)
                dtypes[ref] = D.DType.from_name(spec.inputs[k][0])
        if ref[0] == "c":
            dt = D.DType.from_name(ref[2])
            return const(vec(ltype(dt.compute), w), ref[1])
        if want_raw and ref in raw:
            return raw[ref]
        if ref not in comp:
            dt = dtypes[ref]
            comp[ref] = codecs.decode(b, dt.codec, raw[ref]) if dt.codec else raw[ref]
        return comp[ref]

    for j, (op, arg, dtn, odtn, refs) in enumerate(spec.instrs):
        dt, odt = D.DType.from_name(dtn), D.DType.from_name(odtn)
        me = ("v", j)
        dtypes[me] = odt
        if op == "copy" and refs[0] in raw:
            raw[me] = raw[refs[0]]
            continue
        vals = [get(r) for r in refs]
        kind = OPS[op]
        if op == "cast":
            src = dtypes.get(refs[0]) or D.DType.from_name(refs[0][2])
            out = _cast(b, vals[0], src, odt)
        else:
            out = kind.emit(b, dt, vals, arg)
            if kind.out_dtype == "u8":
                out = b.zext(out, vec(I8, width_of(out.type)))
            elif odt.codec:
                out = codecs.roundtrip(b, odt.codec, out)
        comp[me] = out

    stores = []
    for j, odtn in spec.outputs:
        ref = ("v", j)
        odt = D.DType.from_name(odtn)
        if ref in raw:
            stores.append(raw[ref])
        else:
            v = comp[ref]
            stores.append(codecs.encode(b, odt.codec, v) if odt.codec else v)
    return stores


def build(spec: EwSpec, name: str = "ew") -> str:
    """LLVM IR text of the kernel `name` for `spec`."""
    m = new_module(name)
    fn, b = kernel_function(m, name)
    ptrs, lo, hi = fn.args
    n_in = len(spec.inputs)
    in_dt = [D.DType.from_name(dt) for dt, _ in spec.inputs]
    out_dt = [D.DType.from_name(dt) for _, dt in spec.outputs]
    in_ptr = [arg_pointer(b, ptrs, k, ltype(dt.storage), f"in{k}") for k, dt in enumerate(in_dt)]
    out_ptr = [arg_pointer(b, ptrs, n_in + k, ltype(dt.storage), f"out{k}") for k, dt in enumerate(out_dt)]
    W = spec.width()
    rank = len(spec.shape)
    strides = [s for _, s in spec.inputs]

    def body(in_base, out_base, idx, inner_strides, w, hoisted):
        """Emit one lane-group of width w at inner position idx."""

        def load(k):
            st = ltype(in_dt[k].storage)
            s = inner_strides[k]
            if s == 0:
                if w in hoisted.get(k, {}):
                    return hoisted[k][w]
                return splat(b, b.load(b.gep(in_ptr[k], [in_base[k]], inbounds=True)), w)
            if s == 1:
                p = b.gep(in_ptr[k], [b.add(in_base[k], idx)], inbounds=True)
                if w == 1:
                    return b.load(p, align=in_dt[k].size_in_bytes)
                return b.load(b.bitcast(p, ir.VectorType(st, w).as_pointer()), align=in_dt[k].size_in_bytes)
            off = b.add(in_base[k], b.mul(idx, I64(s)))
            if w == 1:
                return b.load(b.gep(in_ptr[k], [off], inbounds=True), align=in_dt[k].size_in_bytes)
            v = ir.Constant(ir.VectorType(st, w), ir.Undefined)
            for lane in range(w):
                p = b.gep(in_ptr[k], [b.add(off, I64(lane * s))], inbounds=True)
                v = b.insert_element(v, b.load(p, align=in_dt[k].size_in_bytes), I64(lane))
            return v

        vals = _emit_instrs(b, spec, load, w)
        for k, v in enumerate(vals):
            p = b.gep(out_ptr[k], [b.add(out_base, idx)], inbounds=True)
            if w == 1:
                b.store(v, p, align=out_dt[k].size_in_bytes)
            else:
                b.store(v, b.bitcast(p, v.type.as_pointer()), align=out_dt[k].size_in_bytes)

    def inner_loop(start, stop, in_base, out_base, inner_strides):
        """Vector body over [start, stop) in steps of W, then the scalar tail."""
        hoisted = {}
        n = b.sub(stop, start)
        vec_stop = b.add(start, b.mul(b.sdiv(n, I64(W)), I64(W)))
        # scalar loads of broadcast (stride 0) inputs are loop-invariant: load them once here
        for k, s in enumerate(inner_strides):
            if s == 0:
                x = b.load(b.gep(in_ptr[k], [in_base[k]], inbounds=True), align=in_dt[k].size_in_bytes)
                hoisted[k] = {1: x, W: splat(b, x, W)}
        with counted_loop(b, start, vec_stop, W, "v") as i:
            body(in_base, out_base, i, inner_strides, W, hoisted)
        with counted_loop(b, vec_stop, stop, 1, "t") as i:
            body(in_base, out_base, i, inner_strides, 1, hoisted)

    if rank == 1:
        inner_loop(lo, hi, [I64(0)] * n_in, I64(0), [s[0] for s in strides])
    else:
        outer = spec.shape[:-1]
        inner_n = spec.shape[-1]
        with counted_loop(b, lo, hi, 1, "row") as r:
            rem = r
            in_base = [I64(0)] * n_in
            for d in range(len(outer) - 1, -1, -1):
                if d > 0:
                    idx = b.urem(rem, I64(outer[d]))
                    rem = b.udiv(rem, I64(outer[d]))
                else:
                    idx = rem
                in_base = [base if s[d] == 0 else b.add(base, b.mul(idx, I64(s[d]))) for base, s in zip(in_base, strides)]
            out_base = b.mul(r, I64(inner_n))
            inner_loop(I64(0), I64(inner_n), in_base, out_base, [s[-1] for s in strides])
    b.ret_void()
    return str(m)


def compile_spec(spec: EwSpec):
    """Compiled kernel for `spec`: (CompiledModule, function name)."""
    text = build(spec, "ew")
    return jit.compile_ir(text, ["ew"], name="ew"), "ew"
