"""The fused flash-attention backward (f32 / f64), FlashAttention-2's recomputation: the scores
are rebuilt per (query block, key block) from q, k, the mask and the rows' log-sum-exp (the
forward kernel's `lse` mode), so neither the (L, S) probabilities nor their gradient is written.

One unit per (batch, head): it owns that head's dq, dk and dv, so nothing is shared between
units (a broadcast operand's gradient is summed over its broadcast dims afterwards, by the view
rule).  Per key block j (BK keys) the unit copies K_j scaled (KS (BK, E) and KT (E, BK)) and
V_j^T (VT (Ev, BK)) to the stack and zeroes the dK / dV accumulators; then for each query block
i (BQ rows; causal: from row j0 on, earlier rows see none of these keys):
  S  = Q_i KT                  P = exp(S + mask - lse) (0 where masked or past S)
  dP = dO_i VT                 dS = P (dP - D), D = rowsum(dO_i * O_i) (O: the forward's output)
  dV_j += P^T dO_i             dK_j += dS^T Q_i       dQ_i += dS KS (in the output)
each product a register tile of MR rows x NV vectors (over keys, E or Ev) of broadcast-A FMAs;
causal, a tile stops at the diagonal (its keys, rows or sum bounded; the rest is masked to 0).
Finally dK_j (times scale) and dV_j are stored.  Output: one flat buffer, (B, L, 3, H, E) for
self-attention shapes (dq, dk, dv of a position side by side: the gradient of the projection
q, k, v were split from, with no copy), else [dq | dk | dv], each (B, H, ., .) contiguous (see
`output_strides`); the gradients are views of it.

Compile-time: dtype, E, Ev, causal, the mask kind and the blocking.  Run time (`sizes`, SIZES
order): H, L, S, the operands' strides (q, dO and O: last dim contiguous; k, v and the mask:
any) and where dk and dv start, then the scale as f64 bits.  lse is (B, H, L) contiguous.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from .. import dtype as D
from . import jit, vmath
from .attention import _at, _lanes, _min, _reduce, _stack, _vload, _vstore, read_scale
from .llvmutil import I32, I64, call_intrinsic, const, ltype, splat
from .loops import KERNEL_FN, arg_pointer, counted_loop, kernel_function, new_module, unit_range

SIZES = ("H", "L", "S", "q_b", "q_h", "q_l", "q_e", "k_b", "k_h", "k_s", "k_e", "v_b", "v_h", "v_s", "v_e",
         "o_b", "o_h", "o_l", "O_b", "O_h", "O_l", "m_b", "m_h", "m_l", "m_s", "dk_off", "dv_off",
         "dq_b", "dq_h", "dq_l", "dk_b", "dk_h", "dk_s", "dv_b", "dv_h", "dv_s")
MR, NV = 4, 2           # register tile: rows x vectors (MR a power of two)
STACK_ELEMS = 24576     # budget of a key block's stack copies and accumulators, BK (3 E + 2 Ev)
BQ, BK_MAX = 32, 32     # (8, 4, 128, 64) causal f32, 1 thread: BK 32 took 3.4-3.8 ms, 64 3.8-4.6


@dataclass(frozen=True)
class GradSpec:
    dtype: str          # f32 | f64
    e: int              # head dim of q and k
    ev: int             # head dim of v
    causal: bool
    mask: str | None    # None | "add" | an integer dtype name (attend where != 0)
    width: int          # lanes of the vectors over keys
    we: int             # lanes of the vectors over E (divides e)
    wv: int             # lanes of the vectors over Ev (divides ev)
    bq: int             # query rows per block
    bk: int             # keys per block (a multiple of width)


def interleaved(L, S, E, EV) -> bool:
    """Whether the output is (B, L, 3, H, E) -- dq, dk, dv of one position side by side, the
    layout of the gradient of the (B, L, 3 H E) projection that self-attention's q, k, v are
    split from, which then needs no copy -- rather than [dq | dk | dv], each (B, H, ., .).
    Decided when the gradient is built (sizes of named dims: only one Size object equal to
    itself) and kept in the node's arg, so every binding uses that layout."""
    return E.__class__ is int and EV.__class__ is int and E == EV and (L is S or (L.__class__ is int and L == S))


def output_strides(B, H, L, S, E, EV, inter) -> dict:
    """Offsets and (b, h, row) strides of dq, dk, dv in the flat output (sizes named as SIZES)."""
    if inter:
        row = 3 * H * E
        out = {"dk_off": H * E, "dv_off": 2 * H * E}
        for p in ("dq", "dk", "dv"):
            out[f"{p}_b"], out[f"{p}_h"], out[f"{p}_l" if p == "dq" else f"{p}_s"] = L * row, E, row
        return out
    return {"dk_off": B * H * L * E, "dv_off": B * H * (L * E + S * E),
            "dq_b": H * L * E, "dq_h": L * E, "dq_l": E, "dk_b": H * S * E, "dk_h": S * E, "dk_s": E,
            "dv_b": H * S * EV, "dv_h": S * EV, "dv_s": EV}


def grad_spec(dt: D.DType, e: int, ev: int, causal: bool, mask: str | None) -> GradSpec:
    """The blocking for the host's vector width: BK keys as large as the stack budget allows."""
    width = jit.vector_bits() // (8 * dt.size_in_bytes)
    bk = BK_MAX
    while bk > width and bk * (3 * e + 2 * ev) > STACK_ELEMS:
        bk //= 2
    bk = max(bk, width)
    return GradSpec(dt.name, e, ev, causal, mask, width, _lanes(e, width), _lanes(ev, width), BQ, bk)


class _Gemm:
    """C[i, :n] (+)= sum_x A[i, x] B[x, :n] for rows i < m, in register tiles of MR rows (single
    rows for m's tail) by NV vectors of `wn` lanes (fewer for n's tail).  Callbacks: a_row(i) ->
    a handle made once per tile row, a_at(handle, x) -> the scalar A[i, x], b_row(x) -> pointer to
    B[x, 0], c_row(i) -> pointer to C[i, 0]; n and wn are compile-time, m and k values."""

    def __init__(self, b, ct, wn, al):
        self.b, self.ct, self.wn, self.al = b, ct, wn, al
        self.vt = ir.VectorType(ct, wn) if wn > 1 else ct
        self.acc = _stack(b, self.vt, MR * NV)

    def __call__(self, m, k, n, a_row, a_at, b_row, c_row, accumulate, m_aligned=False, trim=None):
        """trim(i, rows) -> (k0, k1 or None for k, n_stop or None for n): the part of row tile
        i that can be nonzero (the causal diagonal); None: all of it."""
        b = self.b
        fns = (k, n, a_row, a_at, b_row, c_row, accumulate, trim)
        m_full = m if m_aligned else b.and_(m, I64(-MR))
        with counted_loop(b, I64(0), m_full, MR, "gm") as i:
            self._over_n(i, MR, *fns)
        if not m_aligned:
            with counted_loop(b, m_full, m, 1, "gt") as i:
                self._over_n(i, 1, *fns)

    def _over_n(self, i, rows, k, n, a_row, a_at, b_row, c_row, accumulate, trim):
        b = self.b
        group = NV * self.wn
        full, tail = n // group, (n % group) // self.wn
        k0, k1, n_stop = trim(i, rows) if trim is not None else (I64(0), None, None)
        k1 = k if k1 is None else k1
        ks = (k0, k1, a_row, a_at, b_row, c_row, accumulate)
        if full:
            stop = I64(full * group) if n_stop is None else _min(b, I64(full * group), n_stop)
            with counted_loop(b, I64(0), stop, group, "gn") as n0:
                self._tile(i, rows, n0, NV, *ks)
        if tail:
            self._tile(i, rows, I64(full * group), tail, *ks)

    def _tile(self, i, rows, n0, nvec, k0, k1, a_row, a_at, b_row, c_row, accumulate):
        b, wn, al, vt = self.b, self.wn, self.al, self.vt
        hs = [a_row(b.add(i, I64(r))) for r in range(rows)]
        cs = [c_row(b.add(i, I64(r))) for r in range(rows)]
        slots = [[_at(b, self.acc, I64(r * NV + v)) for v in range(nvec)] for r in range(rows)]
        for r in range(rows):
            for v in range(nvec):
                init = _vload(b, cs[r], b.add(n0, I64(v * wn)), vt, al) if accumulate else const(vt, 0.0)
                b.store(init, slots[r][v], align=64)
        with counted_loop(b, k0, k1, 1, "gk") as x:
            bp = b_row(x)
            bv = [_vload(b, bp, b.add(n0, I64(v * wn)), vt, al) for v in range(nvec)]
            for r in range(rows):
                a = splat(b, a_at(hs[r], x), wn)
                for v in range(nvec):
                    b.store(call_intrinsic(b, "fma", [a, bv[v], b.load(slots[r][v], align=64)]), slots[r][v], align=64)
        for r in range(rows):
            for v in range(nvec):
                _vstore(b, b.load(slots[r][v], align=64), cs[r], b.add(n0, I64(v * wn)), al)


def build_attention_grad(spec: GradSpec, name: str = "attention_grad") -> str:
    dt = D.DType.from_name(spec.dtype)
    ct = ltype(dt.compute)
    al = dt.size_in_bytes
    W, BQ, BK, E, EV = spec.width, spec.bq, spec.bk, spec.e, spec.ev
    m = new_module(name)
    fn, b = kernel_function(m, name)
    bufs, sizes = fn.args[0], fn.args[1]
    out = arg_pointer(b, bufs, 0, ct, "out")
    q, k, v, do, lse, o = (arg_pointer(b, bufs, i + 1, ct, n) for i, n in enumerate(("q", "k", "v", "do", "lse", "o")))
    int_mask = spec.mask not in (None, "add")
    mt = ir.IntType(8 * D.DType.from_name(spec.mask).size_in_bytes) if int_mask else ct
    mask = arg_pointer(b, bufs, 7, mt, "mask") if spec.mask else None
    sz = {n: b.load(_at(b, sizes, I64(i)), align=8, name=n) for i, n in enumerate(SIZES)}
    scale = read_scale(b, sizes, len(SIZES), ct)
    st = {"KT": _stack(b, ct, E * BK), "KS": _stack(b, ct, BK * E), "VT": _stack(b, ct, EV * BK),
          "DK": _stack(b, ct, BK * E), "DV": _stack(b, ct, BK * EV), "P": _stack(b, ct, BQ * BK),
          "DS": _stack(b, ct, BQ * BK), "D": _stack(b, ir.VectorType(ct, spec.wv) if spec.wv > 1 else ct, 1)}
    gemms = {w: _Gemm(b, ct, w, al) for w in {W, spec.we, spec.wv}}
    lo, hi = unit_range(fn)
    L, S, H = sz["L"], sz["S"], sz["H"]
    with counted_loop(b, lo, hi, 1, "u") as u:
        hh, bb = b.urem(u, H), b.udiv(u, H)

        def base(p):
            return b.add(b.mul(bb, sz[f"{p}_b"]), b.mul(hh, sz[f"{p}_h"]))
        ctx = {"q": base("q"), "k": base("k"), "v": base("v"), "o": base("o"), "O": base("O"),
               "m": base("m") if mask is not None else None, "row": b.mul(u, L),
               "dq": base("dq"), "dk": b.add(sz["dk_off"], base("dk")), "dv": b.add(sz["dv_off"], base("dv")),
               "dk_s": sz["dk_s"], "dv_s": sz["dv_s"]}
        with counted_loop(b, I64(0), L, 1, "zr") as r:
            row = b.add(ctx["dq"], b.mul(r, sz["dq_l"]))
            with counted_loop(b, I64(0), I64(E), 1, "z") as z:
                b.store(const(ct, 0.0), _at(b, out, b.add(row, z)), align=al)
        nblk = b.udiv(b.add(S, I64(BK - 1)), I64(BK))
        with counted_loop(b, I64(0), nblk, 1, "blk") as jb:
            j0 = b.mul(jb, I64(BK))
            nk = _min(b, I64(BK), b.sub(S, j0))
            _load_keys(b, spec, ct, k, v, sz, ctx, j0, st, scale, al)
            i_start = _min(b, j0, L) if spec.causal else I64(0)
            with counted_loop(b, i_start, L, BQ, "qb") as i0:
                nr = _min(b, I64(BQ), b.sub(L, i0))
                _pair(b, spec, ct, gemms, (q, do, lse, o, mask, out), sz, ctx, i0, nr, j0, nk, st, al)
            _store_keys(b, spec, ct, out, ctx, j0, nk, st, scale, al)
    b.ret_void()
    return str(m)


def _load_keys(b, spec, ct, k, v, sz, ctx, j0, st, scale, al):
    """KS = KT^T = scale k[j0 : j0 + BK], VT = v[j0 : j0 + BK]^T (keys past S read key S - 1),
    and zero the block's dK / dV accumulators."""
    BK, E, EV = spec.bk, spec.e, spec.ev
    last = b.sub(sz["S"], I64(1))
    with counted_loop(b, I64(0), I64(BK), 1, "lk") as c:
        j = _min(b, b.add(j0, c), last)
        krow, vrow = b.add(ctx["k"], b.mul(j, sz["k_s"])), b.add(ctx["v"], b.mul(j, sz["v_s"]))
        with counted_loop(b, I64(0), I64(E), 1, "le") as e:
            x = b.fmul(b.load(_at(b, k, b.add(krow, b.mul(e, sz["k_e"]))), align=al), scale)
            b.store(x, _at(b, st["KS"], b.add(b.mul(c, I64(E)), e)), align=al)
            b.store(x, _at(b, st["KT"], b.add(b.mul(e, I64(BK)), c)), align=al)
            b.store(const(ct, 0.0), _at(b, st["DK"], b.add(b.mul(c, I64(E)), e)), align=al)
        with counted_loop(b, I64(0), I64(EV), 1, "lv") as e:
            x = b.load(_at(b, v, b.add(vrow, b.mul(e, sz["v_e"]))), align=al)
            b.store(x, _at(b, st["VT"], b.add(b.mul(e, I64(BK)), c)), align=al)
            b.store(const(ct, 0.0), _at(b, st["DV"], b.add(b.mul(c, I64(EV)), e)), align=al)


def _store_keys(b, spec, ct, out, ctx, j0, nk, st, scale, al):
    """dk rows j0 .. j0 + nk = scale dK, dv rows = dV."""
    E, EV = spec.e, spec.ev
    with counted_loop(b, I64(0), nk, 1, "sk") as c:
        j = b.add(j0, c)
        with counted_loop(b, I64(0), I64(E), 1, "se") as e:
            x = b.fmul(b.load(_at(b, st["DK"], b.add(b.mul(c, I64(E)), e)), align=al), scale)
            b.store(x, _at(b, out, b.add(ctx["dk"], b.add(b.mul(j, ctx["dk_s"]), e))), align=al)
        with counted_loop(b, I64(0), I64(EV), 1, "sv") as e:
            x = b.load(_at(b, st["DV"], b.add(b.mul(c, I64(EV)), e)), align=al)
            b.store(x, _at(b, out, b.add(ctx["dv"], b.add(b.mul(j, ctx["dv_s"]), e))), align=al)


def _pair(b, spec, ct, gemms, ptrs, sz, ctx, i0, nr, j0, nk, st, al):
    """One (query block, key block) pair: the scores and dP, P and dS, then the three updates."""
    q, do, lse, o, mask, out = ptrs
    W, BK, E, EV = spec.width, spec.bk, spec.e, spec.ev
    last = b.sub(sz["L"], I64(1))
    m_up = b.and_(b.add(nr, I64(MR - 1)), I64(-MR))      # rows past nr read row L - 1, never used

    def row_of(p, stride):
        return lambda r: b.add(ctx[p], b.mul(_min(b, b.add(i0, r), last), sz[stride]))
    P, DS = st["P"], st["DS"]
    trims = _causal_trims(b, spec, i0, j0, nk) if spec.causal else (None, None, None)
    gemms[W](m_up, I64(E), BK, row_of("q", "q_l"),
             lambda h, x: b.load(_at(b, q, b.add(h, b.mul(x, sz["q_e"]))), align=al),
             lambda x: _at(b, st["KT"], b.mul(x, I64(BK))), lambda r: _at(b, P, b.mul(r, I64(BK))), False, True,
             trims[0])
    gemms[W](m_up, I64(EV), BK, row_of("o", "o_l"), lambda h, x: b.load(_at(b, do, b.add(h, x)), align=al),
             lambda x: _at(b, st["VT"], b.mul(x, I64(BK))), lambda r: _at(b, DS, b.mul(r, I64(BK))), False, True,
             trims[0])
    _probabilities(b, spec, ct, (lse, do, o, mask), sz, ctx, i0, nr, j0, nk, (P, DS, st["D"]), al)
    q_row, o_row = row_of("q", "q_l"), row_of("o", "o_l")
    gemms[spec.wv](nk, nr, EV, lambda c: c, lambda c, r: b.load(_at(b, P, b.add(b.mul(r, I64(BK)), c)), align=al),
                   lambda r: _at(b, do, o_row(r)), lambda c: _at(b, st["DV"], b.mul(c, I64(EV))), True, trim=trims[1])
    gemms[spec.we](nk, nr, E, lambda c: c, lambda c, r: b.load(_at(b, DS, b.add(b.mul(r, I64(BK)), c)), align=al),
                   lambda r: _at(b, q, q_row(r)), lambda c: _at(b, st["DK"], b.mul(c, I64(E))), True, trim=trims[1])
    gemms[spec.we](nr, nk, E, lambda r: b.mul(r, I64(BK)), lambda h, c: b.load(_at(b, DS, b.add(h, c)), align=al),
                   lambda c: _at(b, st["KS"], b.mul(c, I64(E))),
                   lambda r: _at(b, out, b.add(ctx["dq"], b.mul(b.add(i0, r), sz["dq_l"]))), True, trim=trims[2])


def _causal_trims(b, spec, i0, j0, nk):
    """The causal diagonal's bounds per row tile (key j0 + c sees row i0 + r iff c <= r + d,
    d = i0 - j0 >= 0): the score products stop at key i + rows + d; dV / dK's row tile of keys
    from c sums rows from c - d on; dq's row tile of rows from r sums keys below r + rows + d."""
    d = b.sub(i0, j0)

    def scores(i, rows):
        return I64(0), None, b.add(b.add(i, I64(rows)), d)

    def keys(i, rows):
        lo = b.sub(i, d)
        return b.select(b.icmp_signed("<", lo, I64(0)), I64(0), lo), None, None

    def rows_(i, rows):
        return I64(0), _min(b, nk, b.add(b.add(i, I64(rows)), d)), None
    return scores, keys, rows_


def _probabilities(b, spec, ct, ptrs, sz, ctx, i0, nr, j0, nk, tiles, al):
    """P = exp(S + mask - lse) where attended (key < S, causal, integer mask) else 0;
    DS (holding dP) = P (dP - D)."""
    lse, do, o, mask = ptrs
    P, DS, dslot = tiles
    W, BK = spec.width, spec.bk
    VT = ir.VectorType(ct, W)
    iota = ir.Constant(ir.VectorType(I64, W), list(range(W)))
    zero = const(VT, 0.0)
    with counted_loop(b, I64(0), nr, 1, "pr") as r:
        row = b.add(i0, r)
        at = b.add(ctx["row"], row)
        l_r = splat(b, b.load(_at(b, lse, at), align=al), W)
        d_r = splat(b, _row_dot(b, spec, ct, do, b.add(ctx["o"], b.mul(row, sz["o_l"])), o,
                                b.add(ctx["O"], b.mul(row, sz["O_l"])), dslot, al), W)
        for cv in range(BK // W):
            off = b.add(b.mul(r, I64(BK)), I64(cv * W))
            s = _vload(b, P, off, VT, al)
            lane = b.add(splat(b, I64(cv * W), W), iota)
            ok = b.icmp_signed("<", lane, splat(b, nk, W))
            j = b.add(splat(b, j0, W), lane)
            if spec.causal:
                ok = b.and_(ok, b.icmp_signed("<=", j, splat(b, row, W)))
            if mask is not None:
                mv = _mask_row(b, spec, mask, sz, ctx["m"], row, j0, cv)
                if spec.mask == "add":
                    s = b.fadd(s, mv)
                else:
                    ok = b.and_(ok, b.icmp_unsigned("!=", mv, const(mv.type, 0)))
            p = b.select(ok, vmath.emit(b, "exp", b.fsub(s, l_r)), zero)
            _vstore(b, p, P, off, al)
            ds = b.fmul(p, b.fsub(_vload(b, DS, off, VT, al), d_r))
            _vstore(b, b.select(ok, ds, zero), DS, off, al)


def _row_dot(b, spec, ct, do, do_at, o, o_at, slot, al):
    """D = dO[row] . O[row] over Ev, in vectors of wv lanes summed at the end."""
    WV, EV = spec.wv, spec.ev
    vt = ir.VectorType(ct, WV) if WV > 1 else ct
    b.store(const(vt, 0.0), slot, align=64)
    with counted_loop(b, I64(0), I64(EV), WV, "dd") as e:
        x = call_intrinsic(b, "fma", [_vload(b, do, b.add(do_at, e), vt, al), _vload(b, o, b.add(o_at, e), vt, al),
                                      b.load(slot, align=64)])
        b.store(x, slot, align=64)
    acc = b.load(slot, align=64)
    return _reduce(b, "fadd", acc, const(ct, -0.0)) if WV > 1 else acc


def _mask_row(b, spec, mask, sz, m_base, row, j0, cv):
    """The mask at `row`, keys j0 + cv W .. + W - 1 (clamped to S - 1), as a vector."""
    W = spec.width
    mrow = b.add(m_base, b.mul(row, sz["m_l"]))
    last = b.sub(sz["S"], I64(1))
    mv = ir.Constant(ir.VectorType(mask.type.pointee, W), ir.Undefined)
    for ln in range(W):
        jj = _min(b, b.add(j0, I64(cv * W + ln)), last)
        mv = b.insert_element(mv, b.load(_at(b, mask, b.add(mrow, b.mul(jj, sz["m_s"])))), I32(ln))
    return mv


def _build(spec):
    return build_attention_grad(spec), "attention_grad"


_kernels = jit.KernelCache(_build, KERNEL_FN)


def get_kernel(spec: GradSpec):
    """(CompiledModule, ctypes function) for a spec, compiled once per structure."""
    fn = _kernels(spec)
    return fn._module, fn
