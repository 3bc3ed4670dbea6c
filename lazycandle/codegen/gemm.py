"""The generated tiled GEMM (BLIS-style), one LLVM module per (dtype, register tile).

    for each task (batch, m-range, n-range)            <- tasks are split over threads (gemm_pool.py)
      for jc in n-range step NC:                         B block (KC x NC) lives in L3
        for pc in 0..K step KC:  pack B[pc:, jc:] -> Bp    panels Bp[j/NR][k][NR], zero padded
          for ic in m-range step MC:  pack A -> Ap         panels Ap[i/MR][k][MR]  (L2)
            for jr step NR: for ir step MR:  micro-kernel  MR x NR accumulators in registers

Packing (gemm_pack.py) reads any strides (stride 0, transposed, gaps) and converts storage ->
accumulator type (f16/bf16/f8 -> f32, narrow ints -> i32), so the micro-kernel only ever sees
aligned, dense, zero-padded panels.  A parallel plan whose B is one matrix packs it once,
whole, into a buffer all threads read (the "pack_b" role's tasks run first; `bshared` in the
parameter block), and its tasks are then blocks of rows.  When asked (a_keep), Ap holds the
task's whole packed A and is reused across NC blocks and across consecutive tasks reading the
same A (a broadcast lhs).  The micro-kernel keeps MR x NV vectors of VW lanes as loop phis,
broadcasts one A element per row and issues explicit `llvm.fma` (ints: mul + add, wrapping);
a last row tile of few rows runs a 4- or 8-row copy of it (edge_rows).  Results are added
across KC blocks in the output itself, or, when the output type is narrower than the
accumulator, in an accumulator-typed scratch W (the task's rows x NC) and rounded once on the
last block.  On hosts with AMX the bf16 form runs its micro-kernel on tiles (gemm_amx.py): same
driver, 32 x 32 blocks, partial sums kept in W as whole tiles, a row-major A read in place.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace

import llvmlite.ir as ir

from ..dtype import DType
from . import gemm_amx, gemm_pairs, jit, registry
from .gemm_epilogue import EP_FN, MAX_INPUTS as MAX_EPILOGUE_INPUTS
from .gemm_ir import (ONE, ZERO, I64, acc_add, acc_type, define, for_range, from_acc, gep, i64,
                      if_then, imin, load, mul, add, new_module, storage_type, store, type_bytes, vload,
                      vstore, zero)
from .gemm_pack import emit_pack, emit_pack_scalar
from .llvmutil import I1, VOID, call_intrinsic, splat, vec
from .loops import finalize_ir
from ..ir.kernels import KernelSpec

MAX_BATCH_RANK = 8
# Parameter block passed to the driver (one int64 each; batch arrays of MAX_BATCH_RANK follow).
FIELDS = ("a", "b", "o", "m", "n", "k", "rsa", "csa", "rsb", "csb", "ldo", "mc", "kc", "nc",
          "mchunk", "nchunk", "mtasks", "ntasks", "bp_off", "w_off", "rank", "a_keep", "a_rows",
          "bshared", "bgroup", "ep_fn", "escal") + tuple(f"{f}{k}" for f in ("e", "rse", "cse", "esz") for k in range(MAX_EPILOGUE_INPUTS))
BATCH_ARRAYS = ("bshape", "bsa", "bsb", "bso") + tuple(f"bse{k}" for k in range(MAX_EPILOGUE_INPUTS))
NPARAMS = len(FIELDS) + len(BATCH_ARRAYS) * MAX_BATCH_RANK


_PARAM_BASE = {**{f: i for i, f in enumerate(FIELDS)},
               **{arr: len(FIELDS) + j * MAX_BATCH_RANK for j, arr in enumerate(BATCH_ARRAYS)}}


def param_index(name: str, i: int = 0) -> int:
    """Slot of a field, or of element i of a batch array, in the parameter block."""
    return _PARAM_BASE[name] + i


@dataclass(frozen=True)
class GemmSpec(KernelSpec):
    """What one compiled GEMM kernel is specialised on (strides and sizes are run-time values:
    the packers pick their loop by stride at run time)."""
    dtype: DType
    mr: int          # rows of the register tile
    nv: int          # vectors per row of the register tile
    vw: int          # lanes per vector
    unroll: int = 4  # k-loop unroll of the micro-kernel
    prefetch: int = 8  # prefetch the C tile before the k loop, and A this many unrolled steps ahead
    role: str = "gemm"   # "gemm": the driver; "pack_b": the shared-B packer (build_ir)
    pairs: bool = False  # bf16 panels in k-pairs for the dot-product instruction (gemm_pairs.py)
    amx: bool = False    # bf16 on AMX tiles (gemm_amx.py): MR = NR = 32, k in steps of unroll = 32

    @property
    def nr(self) -> int:
        return self.nv * self.vw

    @property
    def needs_w(self) -> bool:
        """Accumulator type differs from the storage type: partial sums go to scratch W."""
        return acc_type(self.dtype) != storage_type(self.dtype)

    @property
    def key(self) -> str:
        role = "" if self.role == "gemm" else f"_{self.role}"
        form = "_pairs" if self.pairs else "_amx" if self.amx else ""
        return f"{self.dtype.name}_{self.mr}x{self.nv}x{self.vw}_u{self.unroll}p{self.prefetch}{form}{role}"

    def extent(self, sizes) -> int:
        """Register tiles of the output for sizes (nbatch, m, n, k): the most tasks a call
        splits into (runtime/matmul.TiledPlan chunks them)."""
        nb, m, n, _ = sizes
        return nb * -(-m // self.mr) * -(-n // self.nr)

    def cost(self, sizes) -> float:
        nb, m, n, k = sizes
        return 2.0 * nb * m * n * k

    def describe(self) -> str:
        what = "tiled GEMM" if self.role == "gemm" else "tiled GEMM's shared-B packer"
        form = ", bf16 pair dot products" if self.pairs else ", AMX tiles" if self.amx else ""
        return f"{what} {self.dtype.name}, register tile {self.mr}x{self.nr}, k unroll {self.unroll}{form}"


def choose_tile(dt: DType, vector_bits: int | None = None) -> tuple:
    """(MR, NV, VW) for `dt` on this host: NV vectors of VW accumulator lanes per row, MR rows,
    sized so MR*NV accumulators + NV B vectors + 1 broadcast fit the vector register file
    (16 registers up to AVX2, 32 with AVX-512).  With 32 registers a float tile is 2 vectors
    wide and 14 rows tall (28 FMA chains, 2 B loads + 14 broadcasts per k): measured ~3 %
    faster at 1024^2 f32 than 6 x 4 vectors, whose 64-wide B panel crowds L1 (KC x 256 bytes);
    integer tiles (mul + add, one temporary) stay 4 vectors wide."""
    bits = vector_bits or jit.vector_bits()
    acc_bits = 8 * type_bytes(acc_type(dt))
    vw = bits // acc_bits
    regs = 32 if bits >= 512 else 16
    nv = 2 if regs == 16 or dt.is_float else 4
    mr = (regs - nv - 1) // nv
    if not dt.is_float and acc_bits == 64 and bits < 512:
        mr = 4        # no vector i64 multiply below AVX-512: the emulation needs spare registers
    return min(mr, 14), nv, vw


def tiled_spec(dt: DType) -> GemmSpec:
    """The tiled GEMM's spec for `dt` on this host: bf16 on AMX tiles where the host runs them
    (gemm_amx.usable), else choose_tile's register tile, in the bf16 pair form where the host
    has the instruction for it."""
    if gemm_amx.usable(dt):
        return GemmSpec(dt, gemm_amx.MR, gemm_amx.NR // 16, 16, unroll=gemm_amx.KSTEP, prefetch=0, amx=True)
    mr, nv, vw = choose_tile(dt)
    return GemmSpec(dt, mr, nv, vw, pairs=gemm_pairs.usable(dt, vw))


# ---- micro-kernel -----------------------------------------------------------------------
def _fma(b, x, y, acc):
    if isinstance(acc.type.element, ir.IntType):
        return b.add(b.mul(x, y), acc)
    return call_intrinsic(b, "fma", [x, y, acc])


def edge_rows(mr: int, amx: bool = False) -> tuple:
    """Row counts of the extra micro-kernels for a last row tile of few rows (MR = 14: 4, 8;
    AMX: one row of tiles, 16), so that e.g. 256 rows (18 tiles + 4 rows) do not compute a
    whole 14-row tile for 4."""
    return tuple(r for r in ((gemm_amx.ROWS,) if amx else (4, 8)) if r < mr)


def _emit_micro(m: ir.Module, spec: GemmSpec, rows: int = 0):
    """micro(kb, ap, bp, o, ldo, w, ldw, mr, nr, first, last): C tile (mr x nr valid of R x NR,
    R = rows or MR) gets sum_k ap[k][i] * bp[k][j] (ap: an MR-wide packed panel of which the
    first R rows are read); first/last say whether this is the first/last KC block."""
    dt = spec.dtype
    st, at = storage_type(dt), acc_type(dt)
    MR, NV, VW, NR, U = spec.mr, spec.nv, spec.vw, spec.nr, spec.unroll
    R = rows or MR
    vt = vec(at, VW)
    ab = type_bytes(at)
    fn, b = define(m, "micro" if R == MR else f"micro_r{R}", VOID,
                   [I64, at.as_pointer(), at.as_pointer(), st.as_pointer(), I64, at.as_pointer(), I64, I64, I64,
                    I1, I1] + [I64, I64] * spec.amx)
    kb, ap, bp, o, ldo, w, ldw, mr, nr, first, last = fn.args[:11]
    tile = b.alloca(at, size=R * NR)
    if spec.amx:        # the tiles run the k loop and leave C in `tile`
        tile.align = 64
        gemm_amx.micro_tiles(b, R, kb, ap, bp, tile, w, first, last, *fn.args[11:])
        with if_then(b, last, "out"):   # partial sums stay in W (tile order) between KC blocks
            yes = ir.Constant(I1, 1)
            store_tile(b, spec, R, lambda i, v: vload(b, tile, i64(gemm_amx.tile_index(i, v * VW)), VW, 64), tile,
                       None, (o, ldo, w, ldw, mr, nr, yes, yes), at=lambda i, j: gemm_amx.tile_index_ir(b, i, j))
        b.ret_void()
        return fn
    o_rows = [b.gep(o, [mul(b, i64(i), ldo)]) for i in range(R)]
    w_rows = [b.gep(w, [mul(b, i64(i), ldw)]) for i in range(R)]
    if spec.prefetch:
        for row in o_rows:
            for off in sorted({0, NR - 1}):
                _prefetch(b, b.gep(row, [i64(off)]), write=True)

    def steps(bb, a_ptr, b_ptr, accs):
        """U k-steps reading the panels at a_ptr / b_ptr (constant offsets only)."""
        if spec.prefetch:
            _prefetch(bb, bb.gep(a_ptr, [i64(spec.prefetch * U * MR)]), write=False)
        for u in range(U):
            bvs = [vload(bb, b_ptr, i64(u * NR + v * VW), VW, min(64, VW * ab)) for v in range(NV)]
            new = []
            for i in range(R):
                a = splat(bb, load(bb, a_ptr, i64(u * MR + i), ab), VW)
                new.append([_fma(bb, a, bvs[v], accs[i][v]) for v in range(NV)])
            accs = new
        return accs

    init = [[zero(vt)] * NV for _ in range(R)]
    if spec.pairs:          # panels of k-pair words: U k-rows are U / 2 words a row
        words = ir.IntType(32).as_pointer()
        accs = _acc_loop(b, kb, U, b.bitcast(ap, words), b.bitcast(bp, words), MR * U // 2, NR * U // 2, init,
                         gemm_pairs.micro_steps(spec, R, _prefetch))
    else:
        accs = _acc_loop(b, kb, U, ap, bp, MR * U, NR * U, init, steps)

    def spill():
        for i in range(R):
            for v in range(NV):
                vstore(b, accs[i][v], tile, i64(i * NR + v * VW), ab)
    store_tile(b, spec, R, lambda i, v: accs[i][v], tile, spill, fn.args[3:], o_rows, w_rows)
    b.ret_void()
    return fn


def store_tile(b, spec: GemmSpec, R: int, get, tile, spill, args, o_rows=None, w_rows=None, at=None) -> None:
    """Store the micro-kernel's R x NR accumulators as _by_mode says: get(i, v) gives vector v
    of row i; a partial tile (mr x nr valid) goes element by element from the R x NR scratch
    `tile` (spill(), when given, writes it first), element (i, j) at at(i, j) (default
    i * NR + j).  args: (o, ldo, w, ldw, mr, nr, first, last) of the micro-kernel."""
    o, ldo, w, ldw, mr, nr, first, last = args
    NV, VW, NR = spec.nv, spec.vw, spec.nr
    ab = type_bytes(acc_type(spec.dtype))
    o_rows = o_rows or [b.gep(o, [mul(b, i64(i), ldo)]) for i in range(R)]
    w_rows = w_rows or [b.gep(w, [mul(b, i64(i), ldw)]) for i in range(R)]
    full = b.and_(b.icmp_signed("==", mr, i64(R)), b.icmp_signed("==", nr, i64(NR)))
    with b.if_else(full) as (then, otherwise):
        with then:
            def whole_tile(mode):
                for i in range(R):
                    for v in range(NV):
                        _apply(b, spec, mode, get(i, v), o_rows[i], i64(v * VW), w_rows[i], i64(v * VW))
            _by_mode(b, spec, first, last, whole_tile)
        with otherwise:
            if spill:
                spill()

            def edge_tile(mode):
                with for_range(b, ZERO, mr, name="ei") as ei:
                    with for_range(b, ZERO, nr, name="ej") as ej:
                        x = load(b, tile, at(ei, ej) if at else add(b, mul(b, ei, i64(NR)), ej), ab)
                        _apply(b, spec, mode, x, o, add(b, mul(b, ei, ldo), ej), w, add(b, mul(b, ei, ldw), ej))
            _by_mode(b, spec, first, last, edge_tile)


def _call_micro(b, micro: dict, mr, args) -> None:
    """Call the micro-kernel with the fewest rows >= mr (micro: {rows: function})."""
    *small, full = sorted(micro)
    if not small:
        b.call(micro[full], args)
        return
    with b.if_else(b.icmp_signed("<=", mr, i64(small[0]))) as (few, more):
        with few:
            b.call(micro[small[0]], args)
        with more:
            _call_micro(b, {r: micro[r] for r in small[1:] + [full]}, mr, args)


def _prefetch(b, ptr, write: bool):
    i32 = ir.IntType(32)
    p8 = ir.IntType(8).as_pointer()
    fn = b.module.globals.get("llvm.prefetch.p0") or ir.Function(
        b.module, ir.FunctionType(VOID, [p8, i32, i32, i32]), name="llvm.prefetch.p0")
    b.call(fn, [b.bitcast(ptr, p8), i32(1 if write else 0), i32(3), i32(1)])


def _acc_loop(b, kb, U, ap, bp, a_step, b_step, accs, body):
    """for (k = 0; k < kb; k += U) with the accumulator grid and both panel pointers in phis;
    returns the grid after the loop."""
    pre = b.block
    head = b.append_basic_block("k.body")
    done = b.append_basic_block("k.done")
    b.cbranch(b.icmp_signed(">", kb, ZERO), head, done)
    b.position_at_end(head)
    k = b.phi(I64, "k")
    pa, pb = b.phi(ap.type, "pa"), b.phi(bp.type, "pb")
    phis = [[b.phi(a.type) for a in row] for row in accs]
    for phi, init in [(k, ZERO), (pa, ap), (pb, bp)] + [(p, a) for pr, ar in zip(phis, accs) for p, a in zip(pr, ar)]:
        phi.add_incoming(init, pre)
    new = body(b, pa, pb, phis)
    k2 = b.add(k, i64(U), flags=["nsw", "nuw"])
    end = b.block
    for phi, nxt in [(k, k2), (pa, b.gep(pa, [i64(a_step)], inbounds=True)), (pb, b.gep(pb, [i64(b_step)], inbounds=True))] + \
            [(p, n) for pr, nr in zip(phis, new) for p, n in zip(pr, nr)]:
        phi.add_incoming(nxt, end)
    b.cbranch(b.icmp_signed("<", k2, kb), head, done)
    b.position_at_end(done)
    outs = []
    for arow, nrow in zip(accs, new):
        row = []
        for a, n in zip(arow, nrow):
            p = b.phi(a.type)
            p.add_incoming(a, pre)
            p.add_incoming(n, end)
            row.append(p)
        outs.append(row)
    return outs


def _by_mode(b, spec: GemmSpec, first, last, emit):
    """Branch once on (first, last) KC block and emit the tile store for that case:
    "set" / "add" into the output when it has the accumulator type, otherwise "round"
    (single block), "w_set", "w_add" (scratch W) and "w_round" (W + tile, rounded to the output)."""
    if not spec.needs_w:
        with b.if_else(first) as (then, otherwise):
            with then:
                emit("set")
            with otherwise:
                emit("add")
        return
    code = b.or_(b.shl(b.zext(first, I64), ONE), b.zext(last, I64))
    after = b.append_basic_block("mode.end")
    sw = b.switch(code, after)
    for value, mode in ((3, "round"), (2, "w_set"), (0, "w_add"), (1, "w_round")):
        blk = b.append_basic_block(f"mode.{mode}")
        sw.add_case(i64(value), blk)
        b.position_at_end(blk)
        emit(mode)
        b.branch(after)
    b.position_at_end(after)


def _apply(b, spec: GemmSpec, mode: str, x, o, oi, w, wi):
    """Store accumulator value(s) x as `mode` says (see _by_mode); oi / wi index o / w."""
    dt = spec.dtype
    width = x.type.count if isinstance(x.type, ir.VectorType) else 1
    eb, ab = dt.size_in_bytes, type_bytes(acc_type(dt))

    def ld(ptr, idx, align):
        return vload(b, ptr, idx, width, align) if width > 1 else load(b, ptr, idx, align)

    def st(val, ptr, idx, align):
        (vstore if width > 1 else store)(b, val, ptr, idx, align)

    if mode == "set":
        st(x, o, oi, eb)
    elif mode == "add":
        st(acc_add(b, ld(o, oi, eb), x), o, oi, eb)
    elif mode == "round":
        st(from_acc(b, dt, x), o, oi, eb)
    elif mode == "w_set":
        st(x, w, wi, ab)
    elif mode == "w_add":
        st(acc_add(b, ld(w, wi, ab), x), w, wi, ab)
    else:
        st(from_acc(b, dt, acc_add(b, ld(w, wi, ab), x)), o, oi, eb)


# ---- driver -----------------------------------------------------------------------------
def _emit_driver(m: ir.Module, spec: GemmSpec, pack_a, pack_b, micro, name: str):
    """The exported lc_gemm_<key>(params*, t_lo, t_hi, ws*): runs tasks [t_lo, t_hi) of the
    problem in the parameter block (FIELDS, then the batch arrays; addresses as integers,
    strides in elements).  ws: the calling thread's 64-byte aligned scratch, in accumulator
    elements Ap at 0, Bp at bp_off, W at w_off.  Task t is batch t // (mtasks*ntasks), block
    (t % ... // ntasks, t % ntasks) of mchunk x nchunk outputs."""
    dt = spec.dtype
    st, at = storage_type(dt), acc_type(dt)
    MR, NR = spec.mr, spec.nr
    fn, b = define(m, name, VOID, [I64.as_pointer(), I64, I64, ir.IntType(8).as_pointer()], internal=False)
    params, t_lo, t_hi, ws = fn.args
    if spec.amx:
        gemm_amx.configure(b)       # once per call: the tile micro-kernels run inside it
        direct = b.and_(b.icmp_signed("==", load(b, params, i64(param_index("csa")), 8), ONE),
                        b.icmp_signed("==", b.srem(load(b, params, i64(param_index("k")), 8), i64(gemm_amx.KSTEP)),
                                      ZERO))

    def p(field, i=0):
        return load(b, params, i64(param_index(field, i)), 8)

    a_base = b.inttoptr(p("a"), st.as_pointer())
    b_base = b.inttoptr(p("b"), st.as_pointer())
    o_base = b.inttoptr(p("o"), st.as_pointer())
    M, N, K = p("m"), p("n"), p("k")
    rsa, csa, rsb, csb, ldo = p("rsa"), p("csa"), p("rsb"), p("csb"), p("ldo")
    mc, kc, nc = p("mc"), p("kc"), p("nc")
    mchunk, nchunk, mtasks, ntasks = p("mchunk"), p("nchunk"), p("mtasks"), p("ntasks")
    rank = p("rank")
    wsa = b.bitcast(ws, at.as_pointer())
    Ap = wsa
    Bp = gep(b, wsa, p("bp_off"))
    # bshared != 0: B is already packed, whole, at that address (shared_b_offset), by the
    # pack_b role's tasks, for every batch element (the plan only asks for it when B is one)
    bshared = p("bshared")
    shared = b.icmp_signed("!=", bshared, ZERO)
    Bs = b.inttoptr(bshared, at.as_pointer())
    npad = _round_up_ir(b, N, NR)
    W = b.gep(wsa, [p("w_off")])          # not inbounds: only allocated when partial sums need it
    per_batch = mul(b, mtasks, ntasks)
    NE = MAX_EPILOGUE_INPUTS
    offs = [b.alloca(I64) for _ in range(3 + NE)]
    # epilogue (gemm_epilogue.py): a function applied to each output tile after its last KC block
    ep_fn = p("ep_fn")
    has_ep = b.icmp_signed("!=", ep_fn, ZERO)
    ep_call = b.inttoptr(ep_fn, EP_FN.as_pointer())
    escal = p("escal")
    ep_ptrs, ep_rs, ep_cs = (b.alloca(I64, size=NE) for _ in range(3))
    for k in range(NE):
        b.store(p(f"rse{k}"), gep(b, ep_rs, i64(k)))
        b.store(p(f"cse{k}"), gep(b, ep_cs, i64(k)))
    rem_slot, pc_slot = b.alloca(I64), b.alloca(I64)
    # a_keep: Ap holds the task's whole packed A (all KC x MC blocks), kept across the NC blocks
    # and across consecutive tasks that read the same A rows (broadcast lhs, split over n)
    a_keep = b.icmp_signed("!=", p("a_keep"), ZERO)
    a_rows = p("a_rows")
    prev_a, prev_m0 = b.alloca(I64), b.alloca(I64)

    with for_range(b, t_lo, t_hi, name="t") as t:
        bi = b.sdiv(t, per_batch)
        r = b.srem(t, per_batch)
        im, inn = b.sdiv(r, ntasks), b.srem(r, ntasks)
        # batch index -> element offsets of A, B, O (row-major over the batch shape)
        for slot in offs:
            b.store(ZERO, slot)
        b.store(bi, rem_slot)
        with for_range(b, ZERO, rank, name="d") as d:
            dd = b.sub(b.sub(rank, ONE), d)
            size = load(b, params, add(b, i64(param_index("bshape")), dd), 8)
            cur = b.load(rem_slot)
            idx = b.srem(cur, size)
            b.store(b.sdiv(cur, size), rem_slot)
            for slot, arr in zip(offs, ("bsa", "bsb", "bso") + tuple(f"bse{k}" for k in range(NE))):
                s = load(b, params, add(b, i64(param_index(arr)), dd), 8)
                b.store(add(b, b.load(slot), mul(b, idx, s)), slot)
        A = gep(b, a_base, b.load(offs[0]))
        B = gep(b, b_base, b.load(offs[1]))
        O = gep(b, o_base, b.load(offs[2]))
        E = [add(b, p(f"e{k}"), mul(b, b.load(offs[3 + k]), p(f"esz{k}"))) for k in range(NE)]   # byte addresses
        m0 = mul(b, im, mchunk)
        m1 = imin(b, M, add(b, m0, mchunk))
        n0 = mul(b, inn, nchunk)
        n1 = imin(b, N, add(b, n0, nchunk))
        a_off = b.load(offs[0])
        same_a = b.and_(b.icmp_signed(">", t, t_lo),
                        b.and_(b.icmp_signed("==", a_off, b.load(prev_a)), b.icmp_signed("==", m0, b.load(prev_m0))))
        fresh_a = b.not_(b.and_(a_keep, same_a))
        b.store(a_off, prev_a)
        b.store(m0, prev_m0)
        with for_range(b, n0, n1, nc, name="jc") as jc:
            pack_a_now = b.or_(b.not_(a_keep), b.and_(fresh_a, b.icmp_signed("==", jc, n0)))
            nb = imin(b, nc, b.sub(n1, jc))
            # pc loop runs at least once so that K == 0 writes zeros
            b.store(ZERO, pc_slot)
            loop = b.append_basic_block("pc.body")
            after = b.append_basic_block("pc.done")
            b.branch(loop)
            b.position_at_end(loop)
            pc = b.load(pc_slot)
            kb = imin(b, kc, b.sub(K, pc))
            kbp = mul(b, b.sdiv(add(b, kb, i64(spec.unroll - 1)), i64(spec.unroll)), i64(spec.unroll))
            b.call(pack_b, [gep(b, B, add(b, mul(b, pc, rsb), mul(b, jc, csb))), csb, rsb,
                            b.select(shared, ZERO, nb), kb, kbp, Bp])
            Bblk = b.select(shared, b.gep(Bs, [add(b, mul(b, pc, npad), mul(b, jc, kbp))]), Bp)
            first = b.icmp_signed("==", pc, ZERO)
            last = b.icmp_signed(">=", add(b, pc, kb), K)
            with for_range(b, m0, m1, mc, name="ic") as ic:
                mb = imin(b, mc, b.sub(m1, ic))
                ap_blk = gep(b, Ap, b.select(a_keep, add(b, mul(b, pc, a_rows), mul(b, b.sub(ic, m0), kbp)), ZERO))
                # a kept block is not packed again: zero rows (a select, not a branch, so that
                # LLVM does not unswitch, i.e. duplicate, the loop nest on the flag)
                # AMX, row-major A and K in whole tile steps: whole row blocks are read in place
                # (skip: their rows), only a last partial one is packed (zero rows past m)
                skip = mul(b, b.sdiv(mb, i64(MR)), i64(MR)) if spec.amx else ZERO
                skip = b.select(direct, skip, ZERO) if spec.amx else skip
                rows_a = b.select(pack_a_now, b.sub(mb, skip), ZERO)
                b.call(pack_a, [gep(b, A, add(b, mul(b, add(b, ic, skip), rsa), mul(b, pc, csa))), rsa, csa, rows_a,
                                kb, kbp, gep(b, ap_blk, mul(b, skip, kbp))])
                with for_range(b, ZERO, nb, i64(NR), name="jr") as jr:
                    nr = imin(b, i64(NR), b.sub(nb, jr))
                    bpanel = gep(b, Bblk, mul(b, jr, kbp))
                    col = add(b, jc, jr)
                    with for_range(b, ZERO, mb, i64(MR), name="ir") as ir_:
                        mr = imin(b, i64(MR), b.sub(mb, ir_))
                        row = add(b, ic, ir_)
                        oi = add(b, mul(b, row, ldo), col)
                        wi = add(b, mul(b, b.sub(row, m0), nb), jr)      # W: the task's rows x this NC block
                        if spec.amx:    # ... in MR x NR blocks of tile order
                            wi = add(b, mul(b, b.sub(row, m0), _round_up_ir(b, nb, NR)), mul(b, jr, i64(MR)))
                        a_at = gep(b, ap_blk, mul(b, ir_, kbp))
                        args = [kbp, a_at, bpanel, gep(b, O, oi), ldo, b.gep(W, [wi]), nb, mr, nr, first, last]
                        if spec.amx:    # A's tile rows: in place (row stride, 64 bytes a step) or packed
                            inplace = b.and_(direct, b.icmp_signed("==", mr, i64(MR)))
                            src = b.bitcast(gep(b, A, add(b, mul(b, row, rsa), pc)), a_at.type)
                            args[1] = b.select(inplace, src, a_at)
                            args += [b.select(inplace, mul(b, rsa, i64(2)), i64(64)),
                                     b.select(inplace, i64(64), i64(MR * 64))]
                        _call_micro(b, micro, mr, args)
                        with if_then(b, b.and_(last, has_ep), "ep"):
                            for k in range(NE):     # tile origin of each epilogue operand
                                at = add(b, mul(b, row, p(f"rse{k}")), mul(b, col, p(f"cse{k}")))
                                b.store(add(b, E[k], mul(b, at, p(f"esz{k}"))), gep(b, ep_ptrs, i64(k)))
                            b.call(ep_call, [b.bitcast(gep(b, O, oi), ir.IntType(8).as_pointer()), ldo, mr, nr,
                                             ep_ptrs, ep_rs, ep_cs, b.inttoptr(escal, I64.as_pointer())])
            b.store(add(b, pc, kc), pc_slot)
            b.cbranch(b.icmp_signed("<", b.load(pc_slot), K), loop, after)
            b.position_at_end(after)
    if spec.amx:
        gemm_amx.release(b)
    b.ret_void()
    return fn


def _round_up_ir(b, x, mult: int):
    return mul(b, b.sdiv(add(b, x, i64(mult - 1)), i64(mult)), i64(mult))


def shared_b_offset(pc: int, col: int, n: int, kbp: int, nr: int) -> int:
    """Element offset in the shared packed B of the panel starting at column `col` (a multiple
    of NR) of the KC block starting at k = pc (kbp: that block's padded depth): block pc holds
    kbp x roundup(n, NR) elements from pc * roundup(n, NR) on (kbp <= KC), panels in order."""
    return pc * (-(-n // nr) * nr) + col * kbp


def _emit_pack_b_tasks(m: ir.Module, spec: GemmSpec, pack_b, name: str):
    """lc_gemm_<key>_pack_b(params*, t_lo, t_hi, ws*): tasks [t_lo, t_hi) of packing all of B
    into the shared buffer at `bshared` (shared_b_offset): task t packs columns
    [g * bgroup, +bgroup) of KC block t // groups, g = t % groups (bgroup a multiple of NR)."""
    dt = spec.dtype
    st = storage_type(dt)
    fn, b = define(m, name, VOID, [I64.as_pointer(), I64, I64, ir.IntType(8).as_pointer()], internal=False)
    params, t_lo, t_hi, _ws = fn.args

    def p(field):
        return load(b, params, i64(param_index(field)), 8)

    B = b.inttoptr(p("b"), st.as_pointer())
    Bs = b.inttoptr(p("bshared"), acc_type(dt).as_pointer())
    N, K, rsb, csb, kc, group = p("n"), p("k"), p("rsb"), p("csb"), p("kc"), p("bgroup")
    groups = b.sdiv(add(b, N, b.sub(group, ONE)), group)
    npad = _round_up_ir(b, N, spec.nr)
    with for_range(b, t_lo, t_hi, name="t") as t:
        pc = mul(b, b.sdiv(t, groups), kc)
        col = mul(b, b.srem(t, groups), group)
        kb = imin(b, kc, b.sub(K, pc))
        kbp = _round_up_ir(b, kb, spec.unroll)
        b.call(pack_b, [gep(b, B, add(b, mul(b, pc, rsb), mul(b, col, csb))), csb, rsb,
                        imin(b, group, b.sub(N, col)), kb, kbp,
                        gep(b, Bs, add(b, mul(b, pc, npad), mul(b, col, kbp)))])
    b.ret_void()
    return fn


def build_ir(spec: GemmSpec) -> tuple:
    """(IR text, driver name, (packer name,)): one module holds the driver lc_gemm_<key> and
    the shared-B packer lc_gemm_<key>_pack_b (same signature; the "pack_b" role names it), so
    the packer costs no compile of its own (its own module compiled the B packing loop again:
    ~0.15 s of LLVM on a new process's first parallel GEMM)."""
    spec = replace(spec, role="gemm")
    m = new_module(f"gemm_{spec.key}")
    if spec.amx:         # B in k-pair panels (gemm_pairs.py), A in tile rows (gemm_amx.py)
        def pack(name, width):
            return (gemm_pairs.emit_pack if name == "pack_b" else gemm_amx.emit_pack_a)(m, spec, name, width)
    elif spec.pairs:
        def pack(name, width):
            return gemm_pairs.emit_pack(m, spec, name, width)
    else:
        pack_s = emit_pack_scalar(m, spec)

        def pack(name, width):
            return emit_pack(m, spec, name, width, pack_s)
    pack_b = pack("pack_b", spec.nr)
    name = f"lc_gemm_{spec.key}"
    _emit_pack_b_tasks(m, spec, pack_b, name + "_pack_b")
    pack_a = pack("pack_a", spec.mr)
    micro = {r: _emit_micro(m, spec, r) for r in edge_rows(spec.mr, spec.amx) + (spec.mr,)}
    _emit_driver(m, spec, pack_a, pack_b, micro, name)
    return finalize_ir(m), name, (name + "_pack_b",)


class _Kernels(jit.KernelCache):
    """The compiled functions of GEMM specs: a "pack_b" role is the packer exported by its
    driver's module (build_ir), compiled with it."""

    def __call__(self, spec):
        fn = self._fns.get(spec)
        if fn is not None:
            return fn
        if spec.role == "gemm":
            return super().__call__(spec)
        cm = super().__call__(replace(spec, role="gemm"))._module
        with self._lock:
            fn = self._fns.get(spec)
            if fn is None:
                fn = self.fntype(cm.address(f"lc_gemm_{spec.key}"))
                fn._module = cm
                self._fns[spec] = fn
        return fn

    def on_disk(self, spec) -> bool:
        return super().on_disk(replace(spec, role="gemm"))


_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
# Compiled driver (or packer) for a spec as a ctypes function fn(params*, t_lo, t_hi, workspace*).
get_kernel = _Kernels(build_ir, _FN)
registry.register(GemmSpec, lambda spec: build_ir(spec)[0], get_kernel, lambda spec: spec.vw)
