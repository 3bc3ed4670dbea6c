"""Epilogue of the tiled GEMM: the elementwise consumers of a matmul (bias add, activation,
residual add, ...) applied to each MR x NR output tile right after the micro-kernel stored its
last KC block, while the tile is in L1, so `(x @ w + b).gelu()` makes one pass over the output
in memory and never reads the product back from L2 or DRAM.

The epilogue is its own small module, `lc_gemm_ep_<key>(tile, ldo, mr, nr, ptrs, rs, cs,
scalars)`, whose address the GEMM driver takes as a parameter (one GEMM module per dtype and
tile serves every epilogue: compiling the GEMM again for each epilogue took ~5x the
elementwise kernel's compile time).  It rewrites the tile in place.

The epilogue is an instruction DAG of the fused elementwise kernels (ir/kernels.EwSpec), emitted
with codegen/elementwise's `_emit_instrs`: one of its inputs is the matmul result (the rounded
storage value, so fusing never changes a value), the others are operands read at the tile's
(row, col) through their own strides: a row stride passed at run time and a column stride whose
class (0 broadcast, 1 unit, or a runtime stride) the kernel is compiled for.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llvmlite.ir as ir

from .. import dtype as D
from ..ir.epilogue import MAX_INPUTS
from ..ir.kernels import RUNTIME, EwSpec
from . import jit
from .elementwise import _emit_instrs, lanes, load_scalars
from .gemm_ir import (I64, ZERO, define, for_range, gep, i64, load, masked_vload, masked_vstore, mul, add,
                      new_module, storage_type, vload, vstore)
from .llvmutil import I8, VOID, splat
from .loops import finalize_ir

# tile (bytes), ldo, mr, nr, operand tile addresses[MAX_INPUTS], row strides, col strides, scalars
EP_FN = ir.FunctionType(VOID, [I8.as_pointer(), I64, I64, I64, I64.as_pointer(), I64.as_pointer(),
                               I64.as_pointer(), I64.as_pointer()])

@dataclass(frozen=True)
class Epilogue:
    """ew: the DAG (rank 2 over (m, n), one output of the matmul's dtype); mm_input: which of
    its inputs is the matmul result; cols: each input's column stride class (the matmul
    result's entry is unused)."""
    ew: EwSpec
    mm_input: int
    cols: tuple

    @property
    def extras(self) -> list:
        """Input indices other than the matmul result, in parameter order."""
        return [k for k in range(len(self.ew.inputs)) if k != self.mm_input]

    @property
    def key(self) -> str:
        import hashlib
        return hashlib.sha1(repr(self).encode()).hexdigest()[:16]

    @property
    def dtype(self) -> D.DType:
        return D.DType.from_name(self.ew.inputs[self.mm_input][0])


class Emitter:
    """Emits the epilogue DAG: `args` are the scalars (i64*), then per extra input its tile
    pointer, row stride and column stride."""

    def __init__(self, b: ir.IRBuilder, ep: Epilogue, args):
        self.b, self.ep = b, ep
        self.scalars = load_scalars(b, args[0], ep.ew.scalars)
        self.inputs = {k: tuple(args[1 + 3 * i: 4 + 3 * i]) for i, k in enumerate(ep.extras)}

    def _scalar(self, k, w):
        # splatted where used, not cached: the uses sit in branches that do not dominate each other
        return splat(self.b, self.scalars[k], w)

    def _load(self, k, row, col, w, mask=None):
        """Raw storage value(s) of extra input k at tile element (row, col ...col + w); with
        `mask` (the tile's last columns) only its lanes are read."""
        b = self.b
        ptr, rs, cs = self.inputs[k]
        eb = D.DType.from_name(self.ep.ew.inputs[k][0]).size_in_bytes
        cls = self.ep.cols[k]
        if cls == 0 or w == 1:
            off = mul(b, row, rs) if cls == 0 else add(b, mul(b, row, rs), mul(b, col, cs))
            return splat(b, load(b, ptr, off, eb), w)
        if cls == 1:
            at = add(b, mul(b, row, rs), col)
            return vload(b, ptr, at, w, eb) if mask is None else masked_vload(b, ptr, at, mask, eb)
        v = ir.Constant(ir.VectorType(ptr.type.pointee, w), ir.Undefined)
        base = add(b, mul(b, row, rs), mul(b, col, cs))
        for lane in range(w):
            idx = i64(lane) if mask is None else b.select(b.extract_element(mask, i64(lane)), i64(lane), ZERO)
            v = b.insert_element(v, load(b, ptr, add(b, base, mul(b, idx, cs)), eb), i64(lane))
        return v

    def apply(self, value, row, col, w, mask=None):
        """The epilogue's output (storage representation) for the matmul's stored value(s)
        `value` at tile element (row, col), w lanes along the row (those of `mask` if given)."""
        def load_input(k):
            return value if k == self.ep.mm_input else self._load(k, row, col, w, mask)
        return _emit_instrs(self.b, self.ep.ew, load_input, w, self._scalar)[0]


def col_class(stride: int):
    return stride if stride in (0, 1) else RUNTIME


def build_ir(ep: Epilogue) -> tuple:
    """(IR text, exported name) of the tile function: rows of the tile in whole vectors of the
    DAG's lane count, then one masked vector for the last columns (a scalar tail evaluated
    gelu_erf's table lookups lane by lane: the small-m GEMM's 3-column tiles ran 5x slower
    with it than without)."""
    m = new_module(f"gemm_ep_{ep.key}")
    name = f"lc_gemm_ep_{ep.key}"
    fn, b = define(m, name, VOID, list(EP_FN.args), internal=False)
    tile, ldo, mr, nr, ptrs, rss, css, escal = fn.args
    args = [escal]
    for i, k in enumerate(ep.extras):
        st = storage_type(D.DType.from_name(ep.ew.inputs[k][0]))
        args += [b.inttoptr(load(b, ptrs, i64(i), 8), st.as_pointer()), load(b, rss, i64(i), 8),
                 load(b, css, i64(i), 8)]
    em = Emitter(b, ep, args)
    dt = ep.dtype
    eb = dt.size_in_bytes
    o = b.bitcast(tile, storage_type(dt).as_pointer())
    W = lanes(ep.ew)
    full = mul(b, b.sdiv(nr, i64(W)), i64(W))
    with for_range(b, ZERO, mr, name="r") as r:
        row = gep(b, o, mul(b, r, ldo))
        with for_range(b, ZERO, full, i64(W), name="j") as j:
            vstore(b, em.apply(vload(b, row, j, W, eb), r, j, W), row, j, eb)
        if W > 1:       # (W = 1: no tail)
            with b.if_then(b.icmp_signed("<", full, nr)):
                lane = ir.Constant(ir.VectorType(I64, W), [i64(t) for t in range(W)])
                mask = b.icmp_signed("<", lane, splat(b, b.sub(nr, full), W))
                got = em.apply(masked_vload(b, row, full, mask, eb), r, full, W, mask)
                masked_vstore(b, got, row, full, mask, eb)
    b.ret_void()
    return finalize_ir(m), name


_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
get_kernel = jit.KernelCache(build_ir, _FN)
