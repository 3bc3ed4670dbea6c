"""The panel packers of the tiled GEMM (codegen/gemm.py): operands -> zero-padded panels
dst[r / W][k][W] (W = MR for A, NR for B) of kbp >= kb k-rows each, converted from storage to the
accumulator type, so the micro-kernel needs no remainder loop and no bounds checks.  A's rows
are i (stride rsa) and its k stride is csa; B's "rows" are j (stride csb) and its k stride is
rsb.  Strides are run-time values: the packers pick their loop by stride."""
from __future__ import annotations

import llvmlite.ir as ir

from .gemm_ir import (ONE, ZERO, I64, acc_type, add, define, for_range, gep, i64, if_then, imin, load, mul,
                      masked_vstore, storage_type, store, to_acc, type_bytes, vload, vstore, zero)
from .llvmutil import I1, I32, VOID, vec


def emit_pack_scalar(m: ir.Module, spec):
    """pack_s(src, rs, cs, rows, kb, kbp, dst, W): any strides and panel width, one element
    at a time, walking each row along k (contiguous when cs == 1)."""
    dt = spec.dtype
    st, at = storage_type(dt), acc_type(dt)
    ab, eb = type_bytes(at), dt.size_in_bytes
    fn, b = define(m, "pack_s", VOID, [st.as_pointer(), I64, I64, I64, I64, I64, at.as_pointer(), I64])
    src, rs, cs, rows, kb, kbp, dst, W = fn.args
    npanel = b.sdiv(add(b, rows, b.sub(W, ONE)), W)
    with for_range(b, ZERO, npanel, name="p") as p:
        base = gep(b, src, mul(b, mul(b, p, W), rs))
        out = gep(b, dst, mul(b, mul(b, p, kbp), W))
        nrows = imin(b, W, b.sub(rows, mul(b, p, W)))
        with if_then(b, b.or_(b.icmp_signed("<", nrows, W), b.icmp_signed("<", kb, kbp)), "pad"):
            with for_range(b, ZERO, mul(b, kbp, W), name="z") as z:
                store(b, zero(at), out, z, ab)
        with for_range(b, ZERO, nrows, name="r") as r:
            row = gep(b, base, mul(b, r, rs))
            with for_range(b, ZERO, kb, name="k") as k:
                v = to_acc(b, dt, load(b, row, mul(b, k, cs), eb))
                store(b, v, out, add(b, mul(b, k, W), r), ab)
    b.ret_void()
    return fn


def emit_pack(m: ir.Module, spec, name: str, width: int, pack_s):
    """pack(src, rs, cs, rows, kb, kbp, dst) for panels of `width` (MR for A, NR for B).  Full
    panels: when rs == 1 (B row-major, A transposed) each k is one vector load, walking whole rows;
    otherwise, when cs == 1 (row-major A, transposed B), vector loads along k transposed in
    registers (k_blocks), else k-outer with the `width` scalar loads unrolled.  The last,
    partial panel and the k padding go to pack_s."""
    dt = spec.dtype
    st, at = storage_type(dt), acc_type(dt)
    ab, eb = type_bytes(at), dt.size_in_bytes
    fn, b = define(m, name, VOID, [st.as_pointer(), I64, I64, I64, I64, I64, at.as_pointer()])
    src, rs, cs, rows, kb, kbp, dst = fn.args
    W = i64(width)
    full = b.sdiv(rows, W)
    panel = mul(b, kbp, W)                       # elements per packed panel
    vw = spec.vw
    kfull = mul(b, b.sdiv(kb, i64(vw)), i64(vw))

    def rows_unit():
        """rs == 1 (row-major B, transposed A): a panel's `width` values at one k are
        contiguous, one vector load and one store each (width MR need not be a power of two)."""
        with for_range(b, ZERO, kb, name="kv") as k:
            row = gep(b, src, mul(b, k, cs))
            out = gep(b, dst, mul(b, k, W))
            with for_range(b, ZERO, full, name="pv") as p:
                v = to_acc(b, dt, vload(b, row, mul(b, p, W), width, eb))
                vstore(b, v, out, mul(b, p, panel), min(64, (width * ab) & -(width * ab)))

    def k_scalar(base, out, k_lo):
        with for_range(b, k_lo, kb, name="kg") as k:
            col = gep(b, base, mul(b, k, cs))
            o = gep(b, out, mul(b, k, W))
            for r in range(width):
                store(b, to_acc(b, dt, load(b, col, mul(b, i64(r), rs), eb)), o, i64(r), ab)

    def k_blocks(base, out):
        """k contiguous (cs == 1): VW k-values of each row are one vector load; blocks of VW
        rows are transposed in registers and stored as VW k-rows of the panel (the k tail
        goes to k_scalar).  ~3x the element rate of the per-element loop (gathers)."""
        with for_range(b, ZERO, kfull, i64(vw), name="kt") as k0:
            for g in range(0, width, vw):
                lanes = min(vw, width - g)
                rows = [to_acc(b, dt, vload(b, base, add(b, mul(b, i64(g + r), rs), k0), vw, eb))
                        for r in range(lanes)]
                cols = _transpose(b, rows + [zero(vec(at, vw))] * (vw - lanes))
                for j, v in enumerate(cols):
                    _store_lanes(b, v, out, add(b, mul(b, add(b, k0, i64(j)), W), i64(g)), lanes, ab)
        k_scalar(base, out, kfull)

    def k_outer():
        with for_range(b, ZERO, full, name="pg") as p:
            base = gep(b, src, mul(b, mul(b, p, W), rs))
            out = gep(b, dst, mul(b, p, panel))
            with b.if_else(b.icmp_signed("==", cs, ONE)) as (unit, other):
                with unit:
                    k_blocks(base, out)
                with other:
                    k_scalar(base, out, ZERO)

    with b.if_else(b.icmp_signed("==", rs, ONE)) as (unit, other):
        with unit:
            rows_unit()
        with other:
            k_outer()
    # k padding of the full panels, then the partial panel
    with for_range(b, ZERO, full, name="pz") as p:
        out = gep(b, dst, mul(b, p, panel))
        with for_range(b, mul(b, kb, W), panel, name="z") as z:
            store(b, zero(at), out, z, ab)
    done = mul(b, full, W)
    b.call(pack_s, [gep(b, src, mul(b, done, rs)), rs, cs, b.sub(rows, done), kb, kbp,
                    gep(b, dst, mul(b, full, panel)), W])
    b.ret_void()
    return fn


def _transpose(b, rows):
    """cols[j][i] = rows[i][j] for n vectors of n lanes (n a power of two): log2(n) stages of
    two-source shuffles, stage h swapping the off-diagonal h x h blocks of every 2h x 2h block."""
    n = len(rows)
    h = 1
    while h < n:
        lo = ir.Constant(ir.VectorType(I32, n), [j if not j & h else n + j - h for j in range(n)])
        hi = ir.Constant(ir.VectorType(I32, n), [j + h if not j & h else n + j for j in range(n)])
        new = list(rows)
        for i in range(n):
            if not i & h:
                new[i] = b.shuffle_vector(rows[i], rows[i + h], lo)
                new[i + h] = b.shuffle_vector(rows[i], rows[i + h], hi)
        rows, h = new, 2 * h
    return rows


def _store_lanes(b, v, ptr, idx, lanes: int, align: int):
    """Store the first `lanes` lanes of vector v at ptr[idx] (a masked store when not all)."""
    n = v.type.count
    if lanes == n:
        vstore(b, v, ptr, idx, align)
        return
    masked_vstore(b, v, ptr, idx, ir.Constant(ir.VectorType(I1, n), [1] * lanes + [0] * (n - lanes)), align)
