"""Strided copy-and-convert kernels for the BLAS path: gather a strided operand of any dtype
into a dense f32/f64 buffer ("in": storage -> accumulator type, e.g. f16/bf16/f8 -> f32), or
round a dense accumulator buffer into the output dtype ("out").  One kernel per (dtype,
direction, unit inner strides); shapes and strides are runtime parameters.

    copy(params*, row_lo, row_hi): for each row (all dims but the last, row-major) in
    [row_lo, row_hi): dst[row, j] = convert(src[row, j]) for j < shape[-1]
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

from ..dtype import DType
from . import jit, registry
from .gemm_ir import (ONE, ZERO, I64, acc_type, add, define, for_range, from_acc, gep, i64, load, mul,
                      new_module, storage_type, store, to_acc, type_bytes)
from .llvmutil import VOID
from .loops import finalize_ir
from ..ir.kernels import KernelSpec

MAX_RANK = 8
# params: src, dst, rank, then shape[MAX_RANK], src strides[MAX_RANK], dst strides[MAX_RANK]
NPARAMS = 3 + 3 * MAX_RANK


def param_offsets() -> dict:
    return {"src": 0, "dst": 1, "rank": 2, "shape": 3, "ss": 3 + MAX_RANK, "ds": 3 + 2 * MAX_RANK}


@dataclass(frozen=True)
class CopySpec(KernelSpec):
    dtype: DType
    direction: str      # "in": dtype storage -> accumulator; "out": accumulator -> dtype storage
    unit_inner: bool    # both inner strides are 1 (the loop vectorises)

    @property
    def key(self) -> str:
        return f"{self.dtype.name}_{self.direction}_{'u' if self.unit_inner else 'g'}"

    def extent(self, sizes) -> int:
        """Rows of a copy of sizes (rows, cols)."""
        return sizes[0] if sizes[1] else 0

    def cost(self, sizes) -> float:
        return float(sizes[0] * sizes[1])

    def describe(self) -> str:
        return f"GEMM operand copy {self.dtype.name} {self.direction}{' (unit inner stride)' if self.unit_inner else ''}"

def build_ir(spec: CopySpec) -> tuple:
    """(IR text, exported name) of one copy kernel."""
    dt = spec.dtype
    st, at = storage_type(dt), acc_type(dt)
    src_t, dst_t = (st, at) if spec.direction == "in" else (at, st)
    conv = to_acc if spec.direction == "in" else from_acc
    src_b, dst_b = ((dt.size_in_bytes, type_bytes(at)) if spec.direction == "in" else (type_bytes(at), dt.size_in_bytes))
    m = new_module(f"gemm_copy_{spec.key}")
    name = f"lc_gemm_copy_{spec.key}"
    fn, b = define(m, name, VOID, [I64.as_pointer(), I64, I64], internal=False)
    params, lo, hi = fn.args
    po = param_offsets()

    def p(i):
        return load(b, params, i, 8)

    src = b.inttoptr(p(i64(po["src"])), src_t.as_pointer())
    dst = b.inttoptr(p(i64(po["dst"])), dst_t.as_pointer())
    rank = p(i64(po["rank"]))
    last = b.sub(rank, ONE)
    ncol = p(add(b, i64(po["shape"]), last))
    scol = ONE if spec.unit_inner else p(add(b, i64(po["ss"]), last))
    dcol = ONE if spec.unit_inner else p(add(b, i64(po["ds"]), last))
    rem_slot, so_slot, do_slot = b.alloca(I64), b.alloca(I64), b.alloca(I64)
    with for_range(b, lo, hi, name="row") as row:
        b.store(row, rem_slot)
        b.store(ZERO, so_slot)
        b.store(ZERO, do_slot)
        with for_range(b, ZERO, last, name="d") as d:
            dd = b.sub(b.sub(last, ONE), d)          # innermost row dim first
            size = p(add(b, i64(po["shape"]), dd))
            cur = b.load(rem_slot)
            idx = b.srem(cur, size)
            b.store(b.sdiv(cur, size), rem_slot)
            b.store(add(b, b.load(so_slot), mul(b, idx, p(add(b, i64(po["ss"]), dd)))), so_slot)
            b.store(add(b, b.load(do_slot), mul(b, idx, p(add(b, i64(po["ds"]), dd)))), do_slot)
        s_row = gep(b, src, b.load(so_slot))
        d_row = gep(b, dst, b.load(do_slot))
        # unit strides: leave the loop to LLVM's vectoriser (the conversions vectorise)
        with for_range(b, ZERO, ncol, name="j", plain=not spec.unit_inner) as j:
            x = load(b, s_row, mul(b, j, scol), src_b)
            store(b, conv(b, dt, x), d_row, mul(b, j, dcol), dst_b)
    b.ret_void()
    return finalize_ir(m), name


_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
# Compiled driver for a spec as a ctypes function fn(params*, row_lo, row_hi).
get_kernel = jit.KernelCache(build_ir, _FN)
registry.register(CopySpec, lambda spec: build_ir(spec)[0], get_kernel)
