"""The generated tiled GEMM (BLIS-style), one LLVM module per (dtype, tile shape, stride pattern).

    for each task (batch, m-range, n-range)            <- tasks are split over the thread pool
      for jc in n-range step NC:                         B block (KC x NC) lives in L3
        for pc in 0..K step KC:  pack B[pc:, jc:] -> Bp    panels Bp[j/NR][k][NR], zero padded
          for ic in m-range step MC:  pack A -> Ap         panels Ap[i/MR][k][MR]  (L2)
            for jr step NR: for ir step MR:  micro-kernel  MR x NR accumulators in registers

Packing reads any strides (stride 0, transposed, gaps) and converts storage -> accumulator type
(f16/bf16/f8 -> f32, narrow ints -> i32), so the micro-kernel only ever sees aligned, dense,
zero-padded panels.  The micro-kernel keeps MR x NV vectors of VW lanes as loop phis, broadcasts
one A element per row and issues explicit `llvm.fma` (ints: mul + add, wrapping).  Results are
added across KC blocks in the output itself, or, when the output type is narrower than the
accumulator, in an accumulator-typed scratch tile W, and rounded once on the last block.
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import llvmlite.ir as ir

from ..dtype import DType
from . import jit
from .gemm_ir import (ONE, ZERO, I1, I64, acc_add, acc_type, define, for_range, from_acc, gep, i64,
                      if_then, imin, load, mul, add, new_module, storage_type, store, to_acc, vload,
                      vstore, zero)
from .llvmutil import VOID, call_intrinsic, splat, vec

MAX_BATCH_RANK = 8
# Parameter block passed to the driver (one int64 each; batch arrays of MAX_BATCH_RANK follow).
FIELDS = ("a", "b", "o", "m", "n", "k", "rsa", "csa", "rsb", "csb", "ldo", "mc", "kc", "nc",
          "mchunk", "nchunk", "mtasks", "ntasks", "bp_off", "w_off", "rank")
BATCH_ARRAYS = ("bshape", "bsa", "bsb", "bso")
NPARAMS = len(FIELDS) + len(BATCH_ARRAYS) * MAX_BATCH_RANK


def param_index(name: str, i: int = 0) -> int:
    if name in FIELDS:
        return FIELDS.index(name)
    return len(FIELDS) + BATCH_ARRAYS.index(name) * MAX_BATCH_RANK + i


@dataclass(frozen=True)
class GemmSpec:
    """What one compiled GEMM kernel is specialised on."""
    dtype: DType
    mr: int          # rows of the register tile
    nv: int          # vectors per row of the register tile
    vw: int          # lanes per vector
    a_pat: str       # "k": A's k stride is 1; "m": A's m stride is 1; "g": general strides
    b_pat: str       # "n": B's n stride is 1; "k": B's k stride is 1; "g": general
    unroll: int = 4  # k-loop unroll of the micro-kernel
    prefetch: int = 1  # prefetch the C tile before, and A ahead inside, the k loop

    @property
    def nr(self) -> int:
        return self.nv * self.vw

    @property
    def needs_w(self) -> bool:
        """Accumulator type differs from the storage type: partial sums go to scratch W."""
        return acc_type(self.dtype) != storage_type(self.dtype)

    @property
    def key(self) -> str:
        return f"{self.dtype.name}_{self.mr}x{self.nv}x{self.vw}_{self.a_pat}{self.b_pat}_u{self.unroll}"


def choose_tile(dt: DType, vector_bits: int | None = None) -> tuple:
    """(MR, NV, VW) for `dt` on this host: NV vectors of VW accumulator lanes per row, MR rows,
    sized so MR*NV accumulators + NV B vectors + 1 broadcast fit the vector register file
    (16 registers up to AVX2, 32 with AVX-512)."""
    bits = vector_bits or jit.vector_bits()
    acc_bits = acc_type(dt).width if isinstance(acc_type(dt), ir.IntType) else \
        {ir.FloatType: 32, ir.DoubleType: 64}[type(acc_type(dt))]
    vw = bits // acc_bits
    regs = 32 if bits >= 512 else 16
    nv = 4 if regs == 32 else 2
    mr = (regs - nv - 1) // nv
    if not dt.is_float and acc_bits == 64 and bits < 512:
        mr = 4        # no vector i64 multiply below AVX-512: the emulation needs spare registers
    return min(mr, 8), nv, vw


# ---- packing ----------------------------------------------------------------------------
def _stride(pattern_unit: bool, runtime):
    return ONE if pattern_unit else runtime


def _emit_pack(m: ir.Module, spec: GemmSpec, name: str, width: int, unit_row: bool, unit_col: bool,
               vector_rows: bool):
    """pack(src, rs, cs, rows, kb, dst): rows x kb block of src (element (r, k) at r*rs + k*cs)
    -> panels dst[r/width][k][width], zero padded past `rows`.  unit_row / unit_col specialise
    rs == 1 / cs == 1.  vector_rows: the `width` values of one k are contiguous in src (rs == 1),
    so they are read as one vector."""
    dt = spec.dtype
    st, at = storage_type(dt), acc_type(dt)
    fn, b = define(m, name, VOID, [st.as_pointer(), I64, I64, I64, I64, at.as_pointer()])
    src, rs, cs, rows, kb, dst = fn.args
    rs, cs = _stride(unit_row, rs), _stride(unit_col, cs)
    esize = dt.size_in_bytes
    full = b.sdiv(rows, i64(width))
    with for_range(b, ZERO, full, name="p") as p:
        base = gep(b, src, mul(b, mul(b, p, i64(width)), rs))
        out = gep(b, dst, mul(b, mul(b, p, kb), i64(width)))
        with for_range(b, ZERO, kb, name="k") as k:
            o = mul(b, k, i64(width))
            if vector_rows:
                v = to_acc(b, dt, vload(b, base, mul(b, k, cs), width, esize))
                vstore(b, v, out, o, min(64, width * _acc_bytes(at)))
            else:
                for r in range(width):
                    x = to_acc(b, dt, load(b, base, add(b, mul(b, i64(r), rs), mul(b, k, cs)), esize))
                    store(b, x, out, add(b, o, i64(r)), _acc_bytes(at))
    rem = b.sub(rows, mul(b, full, i64(width)))
    with if_then(b, b.icmp_signed(">", rem, ZERO), "tail"):
        base = gep(b, src, mul(b, mul(b, full, i64(width)), rs))
        out = gep(b, dst, mul(b, mul(b, full, kb), i64(width)))
        with for_range(b, ZERO, kb, name="kt") as k:
            o = mul(b, k, i64(width))
            for r in range(width):
                slot = gep(b, out, add(b, o, i64(r)))
                b.store(zero(at), slot, align=_acc_bytes(at))
                with if_then(b, b.icmp_signed("<", i64(r), rem), f"r{r}"):
                    x = to_acc(b, dt, load(b, base, add(b, mul(b, i64(r), rs), mul(b, k, cs)), esize))
                    b.store(x, slot, align=_acc_bytes(at))
    b.ret_void()
    return fn


def _acc_bytes(t) -> int:
    return t.width // 8 if isinstance(t, ir.IntType) else {ir.FloatType: 4, ir.DoubleType: 8}[type(t)]


# ---- micro-kernel -----------------------------------------------------------------------
def _fma(b, x, y, acc):
    if isinstance(acc.type.element, ir.IntType):
        return b.add(b.mul(x, y), acc)
    return call_intrinsic(b, "fma", [x, y, acc])


def _emit_micro(m: ir.Module, spec: GemmSpec):
    """micro(kb, ap, bp, o, ldo, w, ldw, mr, nr, first, last): C tile (mr x nr valid of MR x NR)
    gets sum_k ap[k][i] * bp[k][j]; first/last say whether this is the first/last KC block."""
    dt = spec.dtype
    st, at = storage_type(dt), acc_type(dt)
    MR, NV, VW, NR = spec.mr, spec.nv, spec.vw, spec.nr
    vt = vec(at, VW)
    ab = _acc_bytes(at)
    fn, b = define(m, "micro", VOID, [I64, at.as_pointer(), at.as_pointer(), st.as_pointer(), I64,
                                      at.as_pointer(), I64, I64, I64, I1, I1])
    kb, ap, bp, o, ldo, w, ldw, mr, nr, first, last = fn.args
    tile = b.alloca(at, size=MR * NR)

    def step(bb, k, accs):
        bvs = [vload(bb, bp, add(bb, mul(bb, k, i64(NR)), i64(v * VW)), VW, min(64, VW * ab)) for v in range(NV)]
        out = []
        for i in range(MR):
            a = splat(bb, load(bb, ap, add(bb, mul(bb, k, i64(MR)), i64(i)), ab), VW)
            out.append([_fma(bb, a, bvs[v], accs[i][v]) for v in range(NV)])
        return out

    accs = [[zero(vt)] * NV for _ in range(MR)]
    U = spec.unroll
    if spec.prefetch:
        sb = dt.size_in_bytes
        for i in range(MR):
            for off in sorted({0, NR - 1}):
                _prefetch(b, gep(b, o, add(b, mul(b, i64(i), ldo), i64(off))), write=True)

    def unrolled(bb, k, a):
        if spec.prefetch:
            _prefetch(bb, gep(bb, ap, mul(bb, add(bb, k, i64(8 * U)), i64(MR))), write=False)
        return _unrolled(bb, k, a, U, step)

    kmain = mul(b, b.sdiv(kb, i64(U)), i64(U))
    accs = _acc_loop(b, ZERO, kmain, U, accs, unrolled, "ku")
    accs = _acc_loop(b, kmain, kb, 1, accs, step, "k1")

    full = b.and_(b.icmp_signed("==", mr, i64(MR)), b.icmp_signed("==", nr, i64(NR)))
    with b.if_else(full) as (then, otherwise):
        with then:
            for i in range(MR):
                for v in range(NV):
                    _finish(b, spec, accs[i][v], o, add(b, mul(b, i64(i), ldo), i64(v * VW)),
                            w, add(b, mul(b, i64(i), ldw), i64(v * VW)), first, last)
        with otherwise:
            for i in range(MR):
                for v in range(NV):
                    vstore(b, accs[i][v], tile, i64(i * NR + v * VW), ab)
            with for_range(b, ZERO, mr, name="ei") as ei:
                with for_range(b, ZERO, nr, name="ej") as ej:
                    x = load(b, tile, add(b, mul(b, ei, i64(NR)), ej), ab)
                    _finish(b, spec, x, o, add(b, mul(b, ei, ldo), ej), w, add(b, mul(b, ei, ldw), ej),
                            first, last)
    b.ret_void()
    return fn


def _prefetch(b, ptr, write: bool):
    i32 = ir.IntType(32)
    p8 = ir.IntType(8).as_pointer()
    fn = b.module.globals.get("llvm.prefetch.p0") or ir.Function(
        b.module, ir.FunctionType(VOID, [p8, i32, i32, i32]), name="llvm.prefetch.p0")
    b.call(fn, [b.bitcast(ptr, p8), i32(1 if write else 0), i32(3), i32(1)])


def _unrolled(b, k, accs, U, step):
    for u in range(U):
        accs = step(b, add(b, k, i64(u)), accs)
    return accs


def _acc_loop(b, lo, hi, stride, accs, body, name):
    """Counted loop carrying the accumulator grid in phis; returns the grid after the loop."""
    pre = b.block
    head = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    b.cbranch(b.icmp_signed("<", lo, hi), head, done)
    b.position_at_end(head)
    k = b.phi(I64, name)
    k.add_incoming(lo, pre)
    phis = [[b.phi(a.type) for a in row] for row in accs]
    for prow, arow in zip(phis, accs):
        for p, a in zip(prow, arow):
            p.add_incoming(a, pre)
    new = body(b, k, phis)
    k2 = b.add(k, i64(stride), flags=["nsw", "nuw"])
    end = b.block
    k.add_incoming(k2, end)
    for prow, nrow in zip(phis, new):
        for p, n in zip(prow, nrow):
            p.add_incoming(n, end)
    b.cbranch(b.icmp_signed("<", k2, hi), head, done)
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


def _finish(b, spec: GemmSpec, x, o, oi, w, wi, first, last):
    """Write accumulator value(s) x to the output (index oi) or scratch W (index wi)."""
    dt = spec.dtype
    width = x.type.count if isinstance(x.type, ir.VectorType) else 1
    eb = dt.size_in_bytes
    ab = _acc_bytes(acc_type(dt))

    def ld(ptr, idx, align):
        return vload(b, ptr, idx, width, align) if width > 1 else load(b, ptr, idx, align)

    def st(val, ptr, idx, align):
        (vstore if width > 1 else store)(b, val, ptr, idx, align)

    if not spec.needs_w:
        with b.if_else(first) as (then, otherwise):
            with then:
                st(x, o, oi, eb)
            with otherwise:
                st(acc_add(b, ld(o, oi, eb), x), o, oi, eb)
        return
    with b.if_else(first) as (then, otherwise):
        with then:
            with b.if_else(last) as (t2, o2):
                with t2:
                    st(from_acc(b, dt, x), o, oi, eb)
                with o2:
                    st(x, w, wi, ab)
        with otherwise:
            s = acc_add(b, ld(w, wi, ab), x)
            with b.if_else(last) as (t2, o2):
                with t2:
                    st(from_acc(b, dt, s), o, oi, eb)
                with o2:
                    st(s, w, wi, ab)


# ---- driver -----------------------------------------------------------------------------
def _emit_driver(m: ir.Module, spec: GemmSpec, pack_a, pack_b, micro, name: str):
    dt = spec.dtype
    st, at = storage_type(dt), acc_type(dt)
    MR, NR = spec.mr, spec.nr
    fn, b = define(m, name, VOID, [I64.as_pointer(), I64, I64, ir.IntType(8).as_pointer()], internal=False)
    params, t_lo, t_hi, ws = fn.args

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
    W = gep(b, wsa, p("w_off"))
    per_batch = mul(b, mtasks, ntasks)
    offs = [b.alloca(I64) for _ in range(3)]
    rem_slot, pc_slot = b.alloca(I64), b.alloca(I64)

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
            for slot, arr in zip(offs, ("bsa", "bsb", "bso")):
                s = load(b, params, add(b, i64(param_index(arr)), dd), 8)
                b.store(add(b, b.load(slot), mul(b, idx, s)), slot)
        A = gep(b, a_base, b.load(offs[0]))
        B = gep(b, b_base, b.load(offs[1]))
        O = gep(b, o_base, b.load(offs[2]))
        m0 = mul(b, im, mchunk)
        m1 = imin(b, M, add(b, m0, mchunk))
        n0 = mul(b, inn, nchunk)
        n1 = imin(b, N, add(b, n0, nchunk))
        with for_range(b, n0, n1, nc, name="jc") as jc:
            nb = imin(b, nc, b.sub(n1, jc))
            # pc loop runs at least once so that K == 0 writes zeros
            b.store(ZERO, pc_slot)
            loop = b.append_basic_block("pc.body")
            after = b.append_basic_block("pc.done")
            b.branch(loop)
            b.position_at_end(loop)
            pc = b.load(pc_slot)
            kb = imin(b, kc, b.sub(K, pc))
            b.call(pack_b, [gep(b, B, add(b, mul(b, pc, rsb), mul(b, jc, csb))), csb, rsb, nb, kb, Bp])
            first = b.icmp_signed("==", pc, ZERO)
            last = b.icmp_signed(">=", add(b, pc, kb), K)
            with for_range(b, m0, m1, mc, name="ic") as ic:
                mb = imin(b, mc, b.sub(m1, ic))
                b.call(pack_a, [gep(b, A, add(b, mul(b, ic, rsa), mul(b, pc, csa))), rsa, csa, mb, kb, Ap])
                with for_range(b, ZERO, nb, i64(NR), name="jr") as jr:
                    nr = imin(b, i64(NR), b.sub(nb, jr))
                    bpanel = gep(b, Bp, mul(b, jr, kb))
                    col = add(b, jc, jr)
                    with for_range(b, ZERO, mb, i64(MR), name="ir") as ir_:
                        mr = imin(b, i64(MR), b.sub(mb, ir_))
                        row = add(b, ic, ir_)
                        oi = add(b, mul(b, row, ldo), col)
                        wi = add(b, mul(b, b.sub(row, m0), nchunk), b.sub(col, n0))
                        b.call(micro, [kb, gep(b, Ap, mul(b, ir_, kb)), bpanel, gep(b, O, oi), ldo,
                                       gep(b, W, wi), nchunk, mr, nr, first, last])
            b.store(add(b, pc, kc), pc_slot)
            b.cbranch(b.icmp_signed("<", b.load(pc_slot), K), loop, after)
            b.position_at_end(after)
    b.ret_void()
    return fn


def build_ir(spec: GemmSpec) -> tuple:
    """(IR text, exported driver name) for one GEMM kernel."""
    m = new_module(f"gemm_{spec.key}")
    # pack_a reads rows i (stride rsa) and k (stride csa); pack_b reads "rows" j (stride csb)
    # and k (stride rsb): both produce [row/width][k][width] panels.
    pack_a = _emit_pack(m, spec, "pack_a", spec.mr, unit_row=spec.a_pat == "m", unit_col=spec.a_pat == "k",
                        vector_rows=False)
    pack_b = _emit_pack(m, spec, "pack_b", spec.nr, unit_row=spec.b_pat == "n", unit_col=spec.b_pat == "k",
                        vector_rows=spec.b_pat == "n")
    micro = _emit_micro(m, spec)
    name = f"lc_gemm_{spec.key}"
    _emit_driver(m, spec, pack_a, pack_b, micro, name)
    return str(m), name


_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
_kernels: dict = {}
_klock = threading.Lock()


def get_kernel(spec: GemmSpec):
    """Compiled driver for `spec` as a ctypes function fn(params*, t_lo, t_hi, workspace*)."""
    fn = _kernels.get(spec)
    if fn is None:
        with _klock:
            fn = _kernels.get(spec)
            if fn is None:
                text, name = build_ir(spec)
                cm = jit.compile_ir(text, [name], name=name)
                fn = _FN(cm.address(name))
                fn._module = cm
                _kernels[spec] = fn
    return fn
