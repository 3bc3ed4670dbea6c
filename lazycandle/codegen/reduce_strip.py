"""Inner-output reductions (the last dim kept, e.g. sum(0)) over one strip of a row: the strip's
accumulators live in a stack array while the reduced rows are walked in passes over the strip
(codegen/reduce.py's module docstring says which pass form runs where and why).  Split from
reduce.py, whose kernel (`kern`) and tuning constants (`t`, read when the kernel is built) it
is given."""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from ..ir.kernels import OUTPUT_STRIP
from .llvmutil import F64, I32, I64, vec, FM_REDUCE
from .loops import counted_loop, plain_latch


@dataclass(frozen=True)
class StripTuning:
    """reduce.py's constants for the strip walk (module attributes there, which tests and
    benches set)."""
    unroll: int              # output vectors per step
    row_block: int           # rows per pass of a strip that is not one stream
    row_prefetch_bytes: int  # a strip of at most this many bytes a row prefetches the next block
    one_row: bool            # a strip of a whole row of adjacent rows reads one row per pass ...
    page: int                # ... f32-valued sums only over rows shorter than this (bytes)
    chain: int               # f32-valued sums: rows added in one f32 chain before one widening
    pair_flags: tuple        # fast-math flags of the chain's f32 adds


def reduce_strip(kern, t, in_base, out_row, red_dims, jd, j_lo, j_hi):
    """Outputs [j_lo, j_hi) of one row (at most OUTPUT_STRIP): their accumulators live in a
    stack array (L1), and the reduced dims are walked outermost, so each step reads a run
    of up to OUTPUT_STRIP contiguous inputs (a whole strip of a row for sum(0)) instead of
    one or two cache lines per row, which the hardware prefetcher cannot follow.  `kern`: the
    reduce kernel being built; `t`: its StripTuning."""
    b, W, U = kern.b, kern.W, t.unroll
    vt = vec(kern.acc_t, W)
    with b.goto_block(kern.fn.entry_basic_block):
        b.position_at_start(kern.fn.entry_basic_block)
        arr = b.alloca(ir.ArrayType(kern.acc_t, OUTPUT_STRIP))
        arr.align = 64
        if kern.narrow_sum:
            parr = b.alloca(ir.ArrayType(kern.val_t, OUTPUT_STRIP))
            parr.align = 64
    accp = b.bitcast(arr, kern.acc_t.as_pointer())
    partp = b.bitcast(parr, kern.val_t.as_pointer()) if kern.narrow_sum else None
    n = b.sub(j_hi, j_lo)
    nu = b.mul(b.udiv(n, I64(U * W)), I64(U * W))
    nv = b.mul(b.udiv(n, I64(W)), I64(W))
    al = kern.acc_t.width // 8 if isinstance(kern.acc_t, ir.IntType) else (8 if kern.acc_t == F64 else 4)

    def at(jj, w):
        p = b.gep(accp, [jj], inbounds=True)
        return p if w == 1 else b.bitcast(p, vt.as_pointer())

    def part(jj, w, ty):
        """The f32 partial at [jj, jj+w), as a pointer to `ty`."""
        p = b.gep(partp, [jj], inbounds=True)
        return p if w == 1 else b.bitcast(p, ty.as_pointer())

    with counted_loop(b, I64(0), nv, W, "ai") as jj:
        b.store(kern.init(W), at(jj, W), align=al)
    with counted_loop(b, nv, n, 1, "at") as jj:
        b.store(kern.init(1), at(jj, 1), align=al)
    sj = [s[jd] for s in kern.strides]
    base = [kern.sadd(x, j_lo, s) for x, s in zip(in_base, sj)]

    def step(rows, jj, w):
        """acc[jj:jj+w] combined with the values of `rows` (one trip through L1 per block),
        each widened to the accumulator's type first."""
        p = at(jj, w)
        acc = b.load(p, align=al)
        for offs in rows:
            o = [kern.sadd(x, jj, s) for x, s in zip(offs, sj)]
            if w > 1:
                ahead(rows, o)
            acc = kern.combine(acc, kern.value(o, sj, w))
        b.store(acc, p, align=al)

    last = red_dims[-1]
    sl = [s[last] for s in kern.strides]
    # a strip of at most ROW_PREFETCH_BYTES a row: prefetch the same place of the next
    # block's rows (else the place itself, in L1 already: no branch in the loop)
    widest = max((d.size_in_bytes for d in kern.in_dt), default=1)      # (a reduction may read no buffer)
    narrow_pf = b.icmp_unsigned("<=", n, I64(t.row_prefetch_bytes // widest))

    def ahead(rows, o):
        """For a full block of rows: prefetch ROW_BLOCK rows on from the row read at `o`."""
        if len(rows) == t.row_block and t.row_prefetch_bytes:
            kern.prefetch_at({k: b.select(narrow_pf, kern.sadd(x, I64(t.row_block), st), x)
                              for k, (x, st) in enumerate(zip(o, sl))})

    def add_widened(jj, w, v):
        """acc[jj:jj+w] += v, an f32 value of w = 1, W or 2W lanes widened to f64 (a
        2W-lane value in two halves)."""
        parts = [(jj, w, v)]
        if w == 2 * W:
            parts = [(b.add(jj, I64(h * W)), W, b.shuffle_vector(v, v, ir.Constant(
                ir.VectorType(I32, W), [I32(h * W + i) for i in range(W)]))) for h in range(2)]
        for j0, wp, vp in parts:
            p = at(j0, wp)
            acc = b.load(p, align=al)
            b.store(b.fadd(acc, b.fpext(vp, acc.type), flags=FM_REDUCE), p, align=al)

    def chain_step(rows, jj, w, first, last):
        """For a value narrower than its f64 accumulator: the group's f32 chain at
        [jj, jj+w) carried through `rows` -- started from the first of them (`first`),
        else from the partial -- then stored as the partial, or (`last`) widened into the
        accumulators.  A group's rows are added in the same order whatever the rows per
        pass, so a column's sum does not depend on the pass or on the strip's width."""
        o = [[kern.sadd(x, jj, s) for x, s in zip(offs, sj)] for offs in rows]
        if w > 1:
            for oo in o:
                ahead(rows, oo)
        vals = [kern.value(oo, sj, w, widen=False) for oo in o]
        c = vals[0] if first else b.load(part(jj, w, vals[0].type), align=4)
        for v in vals[1:] if first else vals:
            c = b.fadd(c, v, flags=t.pair_flags)
        if last:
            add_widened(jj, w, c)
        else:
            b.store(c, part(jj, w, c.type), align=4)

    def strip(one, rows):
        """One pass of `rows` over the strip: U vectors a step, then one, then a scalar tail.
        The tails are marked plain: LLVM re-vectorising and unrolling them in each of a
        kernel's up to six passes doubled an f32 sum(0)'s compile time."""
        pair = kern.narrow_sum
        with counted_loop(b, I64(0), nu, U * W, "su") as jj:
            for k in range(0, U, 2) if pair else range(U):
                one(rows, b.add(jj, I64(k * W)), 2 * W if pair else W)
        with counted_loop(b, nv, n, 1, "st", on_latch=plain_latch(b)) as jj:
            one(rows, jj, 1)
        with counted_loop(b, nu, nv, W, "sv", on_latch=plain_latch(b)) as jj:
            one(rows, jj, W)

    def rows_at(offs, i, k):
        """The input offsets of rows i .. i+k-1 of the last reduced dim."""
        return [[kern.sadd(x, b.add(i, I64(r)), s) for x, s in zip(offs, sl)] for r in range(k)]

    def chains(offs, ng, k):
        """Groups of CHAIN rows in passes of k rows: each group's values meet in one f32
        chain (held in the partial between passes), widened into the accumulators once."""
        assert t.chain % k == 0, (t.chain, k)
        with counted_loop(b, I64(0), ng, t.chain, "cg") as g:
            strip(lambda r, jj, w: chain_step(r, jj, w, True, k == t.chain), rows_at(offs, g, k))
            if t.chain // k > 2:
                with counted_loop(b, b.add(g, I64(k)), b.add(g, I64(t.chain - k)), k, "cm") as i:
                    strip(lambda r, jj, w: chain_step(r, jj, w, False, False), rows_at(offs, i, k))
            if k < t.chain:
                strip(lambda r, jj, w: chain_step(r, jj, w, False, True), rows_at(offs, b.add(g, I64(t.chain - k)), k))

    # a strip of a whole row of adjacent rows reads one row per pass: the input is one
    # stream (ROW_BLOCK rows per pass are for strips of part of a row, whose runs the
    # prefetchers follow row by row)
    nl = kern.dims[last]
    wide = None
    if t.one_row:
        wide = b.icmp_unsigned("==", n, kern.dims[jd])
        for x, y in zip(sl, sj):     # (each input's rows adjacent: row stride m x element stride)
            row = kern.smul(kern.dims[jd], y)
            wide = b.and_(wide, b.icmp_signed("==", I64(x) if isinstance(x, int) else x,
                                              I64(0) if row is None else row))
        if kern.narrow_sum:         # (an f32 chain's blocked passes over rows of a page or more ran 5-9 % faster)
            wide = b.and_(wide, b.icmp_unsigned("<", n, I64(t.page // widest)))
    with kern.red_loops(red_dims[:-1], base) as (offs, _):
        if kern.narrow_sum:
            ng = b.mul(b.udiv(nl, I64(t.chain)), I64(t.chain))
            if wide is None:
                chains(offs, ng, t.row_block)
            else:
                with b.if_else(wide) as (one_row, blocked):
                    with one_row:
                        chains(offs, ng, 1)
                    with blocked:
                        chains(offs, ng, t.row_block)
            with counted_loop(b, ng, nl, 1, "cr") as i:     # rows after the last group: each widened
                strip(lambda r, jj, w: chain_step(r, jj, w, True, True), rows_at(offs, i, 1))
        else:
            # ROW_BLOCK rows per pass: each accumulator is loaded and stored once per block,
            # not once per row (a wide strip: one row per pass)
            nlb = b.mul(b.udiv(nl, I64(t.row_block)), I64(t.row_block))
            if wide is not None:
                nlb = b.select(wide, I64(0), nlb)
            with counted_loop(b, I64(0), nlb, t.row_block, "rb") as i:
                strip(step, rows_at(offs, i, t.row_block))
            with counted_loop(b, nlb, nl, 1, "rr") as i:
                strip(step, rows_at(offs, i, 1))
    out0 = b.add(out_row, j_lo)
    with counted_loop(b, I64(0), nv, W, "fo") as jj:
        kern._store(b.add(out0, jj), b.load(at(jj, W), align=al), W)
    with counted_loop(b, nv, n, 1, "ft") as jj:
        kern._store(b.add(out0, jj), b.load(at(jj, 1), align=al), 1)
