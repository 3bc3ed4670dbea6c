"""LLVM glue that turns work which is not a plain kernel into native pool jobs: each function
has the kernel ABI (codegen/loops.py KERNEL_FN: bufs, sizes, scalars, lo, hi), so
runtime/native_pool.py splits it like any kernel and no Python runs on a worker.

- `lc_task_blas_s` / `lc_task_blas_d`: tasks lo..hi-1 of a table of single-threaded CBLAS
  calls (runtime/matmul_blas.py cuts GEMMs into them).  bufs = [A, B, C] base addresses;
  sizes = TASK_WORDS i64 words per task:
      [form, trans1, trans2, M, N, K, base1, off1, ld1, base2, off2, ld2, off3, ld3]
  form GEMM: cblas_?gemm(RowMajor, trans1, trans2, M, N, K, 1, P1, ld1, P2, ld2, 0, P3, ld3);
  form GEMV: cblas_?gemv(RowMajor, trans1, M, N, 1, P1, ld1, P2, ld2, 0, P3, ld3), where
  Pi = bufs[base_i] + off_i bytes (P3 on bufs[2]).  The CBLAS functions are imported by
  address from the library runtime/blas.py loaded, when this module is linked.
- `lc_task_scratch`: an inner kernel over [lo, hi) with its own scratch block in one pointer
  slot (argsort's per-chunk workspace).  bufs = [inner fn, inner bufs, inner sizes, inner
  scalars, scratch base, counter]; sizes = [nbufs, slot, scratch stride].  Each call takes
  the next block by an atomic add on the counter (the caller sizes the blocks for the most
  chunks the section can have and zeroes the counter).
- `lc_task_call3`: fn(params, lo, hi), the ABI of the gemm_copy kernels; bufs = [fn, params]."""
from __future__ import annotations

import llvmlite.ir as ir

from .llvmutil import F32, F64, I8, I32, I64, VOID
from .loops import counted_loop, kernel_function, new_module

TASK_WORDS = 14
GEMM, GEMV = 0, 1
ROW_MAJOR = 101
MAX_INNER_BUFS = 16
EXPORTS_BLAS = ("lc_task_blas_s", "lc_task_blas_d")
EXPORTS = ("lc_task_scratch", "lc_task_call3")
BLAS_IMPORTS = ("lc_cblas_sgemm", "lc_cblas_sgemv", "lc_cblas_dgemm", "lc_cblas_dgemv")

I8P = I8.as_pointer()
I64P = I64.as_pointer()
KERNEL_T = ir.FunctionType(VOID, [I8P.as_pointer(), I64P, I64P, I64, I64])


def _declare(m, name, ret, args):
    f = ir.Function(m, ir.FunctionType(ret, args), name)
    f.attributes.add("nounwind")
    return f


def _blas_tasks(m, kind: str):
    """lc_task_blas_<kind>: the CBLAS calls of tasks [lo, hi)."""
    ft = F32 if kind == "s" else F64
    fp = ft.as_pointer()
    gemm = _declare(m, f"lc_cblas_{kind}gemm", VOID, [I32] * 6 + [ft, fp, I32, fp, I32, ft, fp, I32])
    gemv = _declare(m, f"lc_cblas_{kind}gemv", VOID, [I32] * 4 + [ft, fp, I32, fp, I32, ft, fp, I32])
    fn, b = kernel_function(m, f"lc_task_blas_{kind}")
    bufs, sizes, _, lo, hi = fn.args
    one, zero = ir.Constant(ft, 1.0), ir.Constant(ft, 0.0)
    with counted_loop(b, lo, hi, name="task") as t:
        base = b.mul(t, I64(TASK_WORDS))
        w = [b.load(b.gep(sizes, [b.add(base, I64(k))])) for k in range(TASK_WORDS)]
        i32 = [b.trunc(v, I32) for v in w]

        def operand(which, off):
            p = b.load(b.gep(bufs, [which]))
            return b.bitcast(b.gep(p, [off]), fp)
        p1, p2 = operand(w[6], w[7]), operand(w[9], w[10])
        p3 = operand(I64(2), w[12])
        rm = I32(ROW_MAJOR)
        with b.if_else(b.icmp_signed("==", w[0], I64(GEMM))) as (is_gemm, is_gemv):
            with is_gemm:
                b.call(gemm, [rm, i32[1], i32[2], i32[3], i32[4], i32[5], one, p1, i32[8], p2, i32[11],
                              zero, p3, i32[13]])
            with is_gemv:
                b.call(gemv, [rm, i32[1], i32[3], i32[4], one, p1, i32[8], p2, i32[11], zero, p3, i32[13]])
    b.ret_void()


def _scratch(m):
    """lc_task_scratch: the inner kernel on a copy of its pointer table with a scratch block."""
    fn, b = kernel_function(m, "lc_task_scratch")
    bufs, sizes, _, lo, hi = fn.args
    word = [b.load(b.gep(bufs, [I64(k)])) for k in range(6)]
    inner = b.bitcast(word[0], KERNEL_T.as_pointer())
    ibufs = b.bitcast(word[1], I8P.as_pointer())
    isizes, iscalars = b.bitcast(word[2], I64P), b.bitcast(word[3], I64P)
    counter = b.bitcast(word[5], I64P)
    nbufs, slot, stride = (b.load(b.gep(sizes, [I64(k)])) for k in range(3))
    k = b.atomic_rmw("add", counter, I64(1), "monotonic")
    table = b.alloca(I8P, MAX_INNER_BUFS)
    with counted_loop(b, I64(0), nbufs, name="p") as p:
        b.store(b.load(b.gep(ibufs, [p])), b.gep(table, [p]))
    b.store(b.gep(word[4], [b.mul(k, stride)]), b.gep(table, [slot]))
    b.call(inner, [table, isizes, iscalars, lo, hi])
    b.ret_void()


def _call3(m):
    """lc_task_call3: fn(params, lo, hi)."""
    fn, b = kernel_function(m, "lc_task_call3")
    bufs, _, _, lo, hi = fn.args
    target = ir.FunctionType(VOID, [I8P, I64, I64]).as_pointer()
    f = b.bitcast(b.load(b.gep(bufs, [I64(0)])), target)
    b.call(f, [b.load(b.gep(bufs, [I64(1)])), lo, hi])
    b.ret_void()


def build(with_blas: bool) -> str:
    """The module's IR; the BLAS task functions only when a BLAS library is there to import."""
    m = new_module("lc_pool_tasks")
    if with_blas:
        _blas_tasks(m, "s")
        _blas_tasks(m, "d")
    _scratch(m)
    _call3(m)
    return str(m)
