"""The fused flash-attention kernel of lc.nn.scaled_dot_product_attention (f32 / f64):
out = softmax(q k^T * scale + mask) v, one unit per (batch, head, block of BQ query rows), with
an online softmax over blocks of BK keys, so the (L, S) score matrix is never written.

Per unit, on the stack:
  QT  (E, BQ)   the block's query rows, scaled and transposed once (rows past L are zeros);
  PT  (BK, BQ)  one key block's scores, then its probabilities;
  ACC (BQ, Ev)  the running numerators; M, LS (BQ): the running row max and denominator.
For each key block: scores PT = k_blk . QT by a register tile of (RV row vectors x CB keys)
fused multiply-adds (a key element is one broadcast load); the mask (causal: key j <= row i,
torch's top-left triangle; additive float; or integer "attend where nonzero") is applied,
then per row vector (the softmax statistics are vectors over query rows, so no horizontal
reductions): m' = max(m, max_j s), alpha = e^(m - m'), p = e^(s - m'), l = l alpha + sum p;
finally ACC = ACC alpha + p v_blk by a tile of (4 rows x 4 vectors over Ev).  The output row
is ACC / l; a fully masked row (l = 0, ACC = 0) is 0, as torch's (>= 2.5) attention gives.  Causal units stop
at their last row's diagonal.

With few query rows (L <= W / 2, e.g. one decoding step) the unit is 4 rows (1 when L = 1) and the vectors run
over keys instead ("keys" mode): a score is a vector dot product over E (q rows kept as
QR (BQ, E), k's last dim contiguous), the softmax statistics are scalars per row and a block's
probabilities are vectors over its keys, P (BQ, BK).

With `lse` the unit also writes its rows' log-sum-exp m + log l (+inf for a fully masked row)
to a (B, H, L) buffer, the backward's input (codegen/attention_grad.py): after the operands
when it writes the output too (the scheduler pairs the forward with the backward's lse node),
else as its one output, skipping P @ V (`out` False).

Compile-time: dtype, E, Ev, the mask kind, the mode, lse and the blocking (from the host's vector width).
Run time (the `sizes` array, SIZES order): H, L, S, the number of query blocks and every
operand's strides (the last dim of v is contiguous; q, k and the mask are read through any
strides, stride 0 for broadcast batch dims), the output's (b, h, row) strides (its rows are
contiguous: nn_attention writes (B, L, H, Ev), so merging the heads back is a view), then the
scale as f64 bits (`read_scale`).  So a new
sequence length, e.g. each decode step's longer KV cache, compiles nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from .. import dtype as D
from . import jit, vmath
from .llvmutil import F64, I32, I64, call_intrinsic, const, intrinsic, ltype, splat, type_suffix
from .loops import KERNEL_FN, arg_pointer, counted_loop, kernel_function, new_module, unit_range

SIZES = ("H", "L", "S", "nqb", "q_b", "q_h", "q_l", "q_e", "k_b", "k_h", "k_s", "k_e", "v_b", "v_h", "v_s",
         "m_b", "m_h", "m_l", "m_s", "o_b", "o_h", "o_l")
MAX_HEAD_DIM = 256
FLOAT_DTYPES = ("f32", "f64")
RB_MAX, EVV = 4, 4      # P @ V tile: rows x vectors over Ev


@dataclass(frozen=True)
class AttentionSpec:
    dtype: str          # f32 | f64 (q, k, v and the output)
    e: int              # head dim of q and k
    ev: int             # head dim of v
    causal: bool
    mask: str | None    # None | "add" (a float mask of dtype) | an integer dtype name (attend where != 0)
    width: int          # lanes of the score vectors (over query rows)
    wv: int             # lanes of the P @ V vectors (over Ev; divides ev)
    bq: int             # query rows per unit
    bk: int             # keys per block
    cb: int             # keys per score tile ("rows")
    mode: str = "rows"  # "rows": score vectors over query rows; "keys": over keys (few query rows)
    we: int = 1         # lanes of the q . k dot products over E ("keys"; divides e)
    lse: bool = False   # write each row's log-sum-exp (B, H, L) (the backward's)
    out: bool = True    # write the output (False: the log-sum-exp alone)


def _lanes(n: int, width: int) -> int:
    """The widest power-of-two vector (<= width lanes) that divides n."""
    w = 1
    while w * 2 <= width and n % (w * 2) == 0:
        w *= 2
    return w


def attention_spec(dt: D.DType, e: int, ev: int, causal: bool, mask: str | None, L: int) -> AttentionSpec:
    """The spec for the host's vector width.  A unit's score vectors run over 2 W query rows (W
    when L <= W: a 16-token BERT layer's attention took 2/3 of the time), so for a few rows
    (decoding: L = 1) the kernel vectorises over keys instead."""
    bits = jit.vector_bits()
    width = bits // (8 * dt.size_in_bytes)
    wv = _lanes(ev, width)
    if L <= width // 2:     # one row per unit when decoding, else RB
        return AttentionSpec(dt.name, e, ev, causal, mask, width, wv, 1 if L == 1 else RB_MAX, 4 * width, 1, "keys",
                             _lanes(e, width))
    bq = width if L <= width else 2 * width     # one row vector when it holds L: 2 W rows were half padding
    return AttentionSpec(dt.name, e, ev, causal, mask, width, wv, bq, 64, 8 if bits >= 512 else 4)


def query_regime(dt: D.DType, L: int):
    """The query lengths (lo, hi; hi None: no bound) that get attention_spec's spec of L, or
    None for L < 1: a binding inside them runs the same kernel."""
    width = jit.vector_bits() // (8 * dt.size_in_bytes)
    for lo, hi in ((1, 1), (2, width // 2), (width // 2 + 1, width), (width + 1, None)):
        if lo <= L and (hi is None or L <= hi):
            return lo, hi
    return None


def read_scale(b, sizes, at, ct):
    """The softmax scale, stored as f64 bits in sizes[at] (so the kernel takes the standard
    arguments and no scalar slot), in the compute type."""
    scale = b.load(b.bitcast(_at(b, sizes, I64(at)), F64.as_pointer()), align=8)
    return scale if ct == F64 else b.fptrunc(scale, ct)


def _at(b, p, off):
    return b.gep(p, [off], inbounds=True)


def _vload(b, p, off, vt, al):
    return b.load(b.bitcast(_at(b, p, off), vt.as_pointer()), align=al)


def _vstore(b, val, p, off, al):
    b.store(val, b.bitcast(_at(b, p, off), val.type.as_pointer()), align=al)


def _min(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def _stack(b, t, n):
    a = b.alloca(ir.ArrayType(t, n))
    a.align = 64
    return b.bitcast(a, t.as_pointer())


def build_attention(spec: AttentionSpec, name: str = "attention") -> str:
    dt = D.DType.from_name(spec.dtype)
    ct = ltype(dt.compute)
    al = dt.size_in_bytes
    W, WV, BQ, BK, CB, E, EV = spec.width, spec.wv, spec.bq, spec.bk, spec.cb, spec.e, spec.ev
    keys = spec.mode == "keys"
    RV = 0 if keys else BQ // W
    VT, VV = ir.VectorType(ct, W), ir.VectorType(ct, WV) if WV > 1 else ct
    ninf = const(ct, float("-inf"))
    m = new_module(name)
    fn, b = kernel_function(m, name)
    bufs, sizes = fn.args[0], fn.args[1]
    out = arg_pointer(b, bufs, 0, ct, "out")
    q = arg_pointer(b, bufs, 1, ct, "q")
    k = arg_pointer(b, bufs, 2, ct, "k")
    v = arg_pointer(b, bufs, 3, ct, "v")
    int_mask = spec.mask not in (None, "add")
    mt = ir.IntType(8 * D.DType.from_name(spec.mask).size_in_bytes) if int_mask else ct
    mask = arg_pointer(b, bufs, 4, mt, "mask") if spec.mask else None
    lse_out = arg_pointer(b, bufs, 5 if spec.mask else 4, ct, "lse") if spec.lse and spec.out else out
    sz = {n: b.load(_at(b, sizes, I64(i)), align=8, name=n) for i, n in enumerate(SIZES)}
    scale = read_scale(b, sizes, len(SIZES), ct)
    QT, PT, ACC = _stack(b, ct, E * BQ), _stack(b, ct, BK * BQ), _stack(b, ct, BQ * EV)
    M, LS, AL = _stack(b, ct, BQ), _stack(b, ct, BQ), _stack(b, ct, BQ)
    VE = ir.VectorType(ct, spec.we) if spec.we > 1 else ct
    sacc = _stack(b, VE, BQ) if keys else _stack(b, VT, RV * CB)   # register tiles (promoted by LLVM)
    oacc = _stack(b, VV, RB_MAX * EVV)
    red = _stack(b, VT, 2)                 # running block max / denominator of one row vector ("rows")
    zero_t = const(VT, 0.0)
    lo, hi = unit_range(fn)
    L, S, H = sz["L"], sz["S"], sz["H"]
    with counted_loop(b, lo, hi, 1, "u") as u:
        qb, bh = b.urem(u, sz["nqb"]), b.udiv(u, sz["nqb"])
        hh, bb = b.urem(bh, H), b.udiv(bh, H)
        r0 = b.mul(qb, I64(BQ))
        nr = _min(b, I64(BQ), b.sub(L, r0))

        def base(p):
            return b.add(b.mul(bb, sz[f"{p}_b"]), b.mul(hh, sz[f"{p}_h"]))
        q_base = b.add(base("q"), b.mul(r0, sz["q_l"]))
        k_base, v_base = base("k"), base("v")
        m_base = base("m") if mask is not None else None
        # QT = (scale q_blk)^T, zero rows past L; ACC = 0, M = -inf, LS = 0
        with counted_loop(b, I64(0), I64(BQ), 1, "r") as r:
            ok = b.icmp_signed("<", r, nr)
            row = b.add(q_base, b.mul(_min(b, r, b.sub(nr, I64(1))), sz["q_l"]))
            with counted_loop(b, I64(0), I64(E), 1, "e") as e:
                x = b.fmul(b.load(_at(b, q, b.add(row, b.mul(e, sz["q_e"]))), align=al), scale)
                at = b.add(b.mul(r, I64(E)), e) if keys else b.add(b.mul(e, I64(BQ)), r)
                b.store(b.select(ok, x, const(ct, 0.0)), _at(b, QT, at), align=al)
            b.store(ninf, _at(b, M, r), align=al)
            b.store(const(ct, 0.0), _at(b, LS, r), align=al)
            with counted_loop(b, I64(0), I64(EV), 1, "z") as z:
                b.store(const(ct, 0.0), _at(b, ACC, b.add(b.mul(r, I64(EV)), z)), align=al)
        kv_end = _min(b, S, b.add(r0, nr)) if spec.causal else S
        nblk = b.udiv(b.add(kv_end, I64(BK - 1)), I64(BK))
        with counted_loop(b, I64(0), nblk, 1, "blk") as jb:
            j0 = b.mul(jb, I64(BK))
            nk = _min(b, I64(BK), b.sub(kv_end, j0))
            if keys:
                _key_scores(b, spec, ct, k, k_base, sz, j0, nk, QT, PT, sacc, al)
                for r in range(BQ):
                    _key_softmax_step(b, spec, ct, VT, r, r0, j0, nk, L, S, PT, M, LS, AL, mask, m_base, sz, al)
            else:
                _scores(b, spec, ct, VT, RV, k, k_base, sz, S, j0, nk, QT, PT, sacc, zero_t, al)
                for rv in range(RV):
                    _softmax_step(b, spec, ct, VT, rv, r0, j0, nk, L, PT, M, LS, AL, red, mask, m_base, sz, ninf, al)
            if spec.out:
                _accumulate(b, spec, ct, VV, v, v_base, sz, j0, nk, nr, PT, ACC, AL, oacc, al)
        if spec.lse:
            _store_lse(b, ct, lse_out, b.add(b.mul(bh, L), r0), nr, M, LS, al)
        if spec.out:
            o_base = b.add(b.add(b.mul(bb, sz["o_b"]), b.mul(hh, sz["o_h"])), b.mul(r0, sz["o_l"]))
            _store_rows(b, ct, out, o_base, sz["o_l"], nr, EV, WV, VV, ACC, LS, al)
    b.ret_void()
    return str(m)


def _store_rows(b, ct, out, o_base, o_l, nr, EV, WV, VV, ACC, LS, al):
    """out rows (o_l apart) = ACC / l; a row with every key masked (l = 0) is 0, as torch gives."""
    with counted_loop(b, I64(0), nr, 1, "o") as r:
        ls = b.load(_at(b, LS, r), align=al)
        den = splat(b, b.select(b.fcmp_ordered("==", ls, const(ct, 0.0)), const(ct, 1.0), ls), WV)
        row = b.add(o_base, b.mul(r, o_l))
        with counted_loop(b, I64(0), I64(EV), WV, "oe") as e:
            off = b.add(b.mul(r, I64(EV)), e)
            _vstore(b, b.fdiv(_vload(b, ACC, off, VV, al), den), out, b.add(row, e), al)


def _store_lse(b, ct, out, base, nr, M, LS, al):
    """out[base + r] = m + log(l), the rows' log-sum-exp; +inf for a row with every key masked
    (l = 0), so the backward's exp(s - lse) is 0 there and its gradients are 0, as torch's."""
    with counted_loop(b, I64(0), nr, 1, "o") as r:
        ls = b.load(_at(b, LS, r), align=al)
        lse = b.fadd(b.load(_at(b, M, r), align=al), vmath.emit(b, "log", ls))
        dead = b.fcmp_ordered("==", ls, const(ct, 0.0))
        b.store(b.select(dead, const(ct, float("inf")), lse), _at(b, out, b.add(base, r)), align=al)


def _scores(b, spec, ct, VT, RV, k, k_base, sz, S, j0, nk, QT, PT, sacc, zero_t, al):
    """PT[c, :] = sum_e k[j0 + c, e] QT[e, :] for c < nk, in tiles of CB keys (a tile's keys past
    S read key S - 1: valid memory, results never used)."""
    BQ, CB, W = spec.bq, spec.cb, spec.width
    with counted_loop(b, I64(0), nk, CB, "c0") as c0:
        rows = []
        for cc in range(CB):
            j = _min(b, b.add(j0, b.add(c0, I64(cc))), b.sub(S, I64(1)))
            rows.append(b.add(k_base, b.mul(j, sz["k_s"])))
        for t in range(RV * CB):
            b.store(zero_t, _at(b, sacc, I64(t)), align=64)
        with counted_loop(b, I64(0), I64(spec.e), 1, "se") as e:
            qv = [_vload(b, QT, b.add(b.mul(e, I64(BQ)), I64(rv * W)), VT, al) for rv in range(RV)]
            ke = b.mul(e, sz["k_e"])
            for cc in range(CB):
                kx = splat(b, b.load(_at(b, k, b.add(rows[cc], ke)), align=al), W)
                for rv in range(RV):
                    slot = _at(b, sacc, I64(rv * CB + cc))
                    b.store(call_intrinsic(b, "fma", [qv[rv], kx, b.load(slot, align=64)]), slot, align=64)
        for cc in range(CB):
            for rv in range(RV):
                off = b.add(b.mul(b.add(c0, I64(cc)), I64(BQ)), I64(rv * W))
                _vstore(b, b.load(_at(b, sacc, I64(rv * CB + cc)), align=64), PT, off, al)


def _mask_vector(b, spec, ct, VT, mask, m_base, sz, L, row0, j):
    """The mask at rows row0 .. row0 + W - 1 (clamped to L - 1) and key j, as a vector."""
    col = b.add(m_base, b.mul(j, sz["m_s"]))
    vec = ir.Constant(ir.VectorType(mask.type.pointee, spec.width), ir.Undefined)
    for lane in range(spec.width):
        i = _min(b, b.add(row0, I64(lane)), b.sub(L, I64(1)))
        x = b.load(_at(b, mask, b.add(col, b.mul(i, sz["m_l"]))))
        vec = b.insert_element(vec, x, I32(lane))
    return vec


def _softmax_step(b, spec, ct, VT, rv, r0, j0, nk, L, PT, M, LS, AL, red, mask, m_base, sz, ninf, al):
    """Mask one row vector's scores of the block, then the online softmax update of its rows."""
    W, BQ = spec.width, spec.bq
    row0 = b.add(r0, I64(rv * W))
    rows = b.add(splat(b, row0, W), ir.Constant(ir.VectorType(I64, W), list(range(W))))
    vninf = const(VT, float("-inf"))
    mx, den = _at(b, red, I64(0)), _at(b, red, I64(1))
    b.store(vninf, mx, align=64)
    with counted_loop(b, I64(0), nk, 1, "sm") as c:
        off = b.add(b.mul(c, I64(BQ)), I64(rv * W))
        s = _vload(b, PT, off, VT, al)
        j = b.add(j0, c)
        if spec.mask == "add":
            s = b.fadd(s, _mask_vector(b, spec, ct, VT, mask, m_base, sz, L, row0, j))
        elif spec.mask is not None:
            mv = _mask_vector(b, spec, ct, VT, mask, m_base, sz, L, row0, j)
            s = b.select(b.icmp_unsigned("!=", mv, const(mv.type, 0)), s, vninf)
        if spec.causal:
            s = b.select(b.icmp_signed("<=", splat(b, j, W), rows), s, vninf)
        _vstore(b, s, PT, off, al)
        b.store(call_intrinsic(b, "maxnum", [b.load(mx, align=64), s]), mx, align=64)
    m_old = _vload(b, M, I64(rv * W), VT, al)
    m_new = call_intrinsic(b, "maxnum", [m_old, b.load(mx, align=64)])
    m_use = b.select(b.fcmp_ordered("==", m_new, vninf), const(VT, 0.0), m_new)
    alpha = vmath.emit(b, "exp", b.fsub(m_old, m_use))
    b.store(b.fmul(_vload(b, LS, I64(rv * W), VT, al), alpha), den, align=64)
    with counted_loop(b, I64(0), nk, 1, "ex") as c:
        off = b.add(b.mul(c, I64(BQ)), I64(rv * W))
        p = vmath.emit(b, "exp", b.fsub(_vload(b, PT, off, VT, al), m_use))
        _vstore(b, p, PT, off, al)
        b.store(b.fadd(b.load(den, align=64), p), den, align=64)
    _vstore(b, m_new, M, I64(rv * W), al)
    _vstore(b, b.load(den, align=64), LS, I64(rv * W), al)
    _vstore(b, alpha, AL, I64(rv * W), al)


def _accumulate(b, spec, ct, VV, v, v_base, sz, j0, nk, nr, PT, ACC, AL, oacc, al):
    """ACC[r, :] = ACC[r, :] alpha[r] + sum_c PT[c, r] v[j0 + c, :] for the rows below nr (in
    groups of RB, or the unit's one row; BQ is a multiple of RB), over Ev in groups of EVV vectors."""
    BQ, EV, WV = spec.bq, spec.ev, spec.wv
    RB = min(BQ, RB_MAX)
    group = EVV * WV
    full, tail = EV // group, (EV % group) // WV

    def tile(r, ev0, nvec):
        alphas = [splat(b, b.load(_at(b, AL, b.add(r, I64(rr))), align=al), WV) for rr in range(RB)]
        for rr in range(RB):
            for vv in range(nvec):
                off = b.add(b.mul(b.add(r, I64(rr)), I64(EV)), b.add(ev0, I64(vv * WV)))
                b.store(b.fmul(_vload(b, ACC, off, VV, al), alphas[rr]), _at(b, oacc, I64(rr * EVV + vv)), align=64)
        with counted_loop(b, I64(0), nk, 1, "pv") as c:
            vrow = b.add(b.add(v_base, b.mul(b.add(j0, c), sz["v_s"])), ev0)
            vals = [_vload(b, v, b.add(vrow, I64(vv * WV)), VV, al) for vv in range(nvec)]
            for rr in range(RB):
                if spec.mode == "keys":
                    at = b.add(b.mul(b.add(r, I64(rr)), I64(spec.bk)), c)
                else:
                    at = b.add(b.add(b.mul(c, I64(BQ)), r), I64(rr))
                p = splat(b, b.load(_at(b, PT, at), align=al), WV)
                for vv in range(nvec):
                    slot = _at(b, oacc, I64(rr * EVV + vv))
                    b.store(call_intrinsic(b, "fma", [p, vals[vv], b.load(slot, align=64)]), slot, align=64)
        for rr in range(RB):
            for vv in range(nvec):
                off = b.add(b.mul(b.add(r, I64(rr)), I64(EV)), b.add(ev0, I64(vv * WV)))
                _vstore(b, b.load(_at(b, oacc, I64(rr * EVV + vv)), align=64), ACC, off, al)

    with counted_loop(b, I64(0), nr, RB, "pr") as r:
        if full:
            with counted_loop(b, I64(0), I64(full * group), group, "pe") as ev0:
                tile(r, ev0, EVV)
        if tail:
            tile(r, I64(full * group), tail)


def _reduce(b, name, vec, start=None):
    """llvm.vector.reduce.<name> of a vector (reassociated: a tree, not a serial chain)."""
    vt = vec.type
    args = ([start] if start is not None else []) + [vec]
    f = intrinsic(b.module, f"llvm.vector.reduce.{name}.{type_suffix(vt)}", vt.element, [a.type for a in args])
    return b.call(f, args, fastmath=("reassoc",) if name == "fadd" else ())


def _key_scores(b, spec, ct, k, k_base, sz, j0, nk, QR, P, sacc, al):
    """P[r, c] = QR[r, :] . k[j0 + c, :] for c < nk and the unit's RB rows, the dot products as
    vectors of `we` lanes over E (k's last dim is contiguous) summed at the end."""
    BQ, BK, E, WE = spec.bq, spec.bk, spec.e, spec.we
    VE = ir.VectorType(ct, WE) if WE > 1 else ct
    with counted_loop(b, I64(0), nk, 1, "kc") as c:
        krow = b.add(k_base, b.mul(b.add(j0, c), sz["k_s"]))
        for r in range(BQ):
            b.store(const(VE, 0.0), _at(b, sacc, I64(r)), align=64)
        with counted_loop(b, I64(0), I64(E), WE, "ke") as e:
            kv = _vload(b, k, b.add(krow, e), VE, al)
            for r in range(BQ):
                slot = _at(b, sacc, I64(r))
                qv = _vload(b, QR, b.add(I64(r * E), e), VE, al)
                b.store(call_intrinsic(b, "fma", [qv, kv, b.load(slot, align=64)]), slot, align=64)
        for r in range(BQ):
            acc = b.load(_at(b, sacc, I64(r)), align=64)
            s = _reduce(b, "fadd", acc, const(ct, -0.0)) if WE > 1 else acc
            b.store(s, _at(b, P, b.add(I64(r * BK), c)), align=al)


def _key_softmax_step(b, spec, ct, VT, r, r0, j0, nk, L, S, P, M, LS, AL, mask, m_base, sz, al):
    """Mask row r's scores of the block (keys past nk too), then its online softmax update, the
    block's keys as BK / W vectors."""
    W, BK = spec.width, spec.bk
    row = b.add(r0, I64(r))
    vninf = const(VT, float("-inf"))
    iota = ir.Constant(ir.VectorType(I64, W), list(range(W)))
    scores, mx = [], vninf
    for cv in range(BK // W):
        off = I64(r * BK + cv * W)
        s = _vload(b, P, off, VT, al)
        lane = b.add(splat(b, I64(cv * W), W), iota)
        ok = b.icmp_signed("<", lane, splat(b, nk, W))
        j = b.add(splat(b, j0, W), lane)
        if spec.causal:
            ok = b.and_(ok, b.icmp_signed("<=", j, splat(b, row, W)))
        if spec.mask is not None:
            mrow = b.add(m_base, b.mul(_min(b, row, b.sub(L, I64(1))), sz["m_l"]))
            mv = ir.Constant(ir.VectorType(mask.type.pointee, W), ir.Undefined)
            for ln in range(W):
                jj = _min(b, b.add(j0, I64(cv * W + ln)), b.sub(S, I64(1)))
                mv = b.insert_element(mv, b.load(_at(b, mask, b.add(mrow, b.mul(jj, sz["m_s"])))), I32(ln))
            if spec.mask == "add":
                s = b.fadd(s, mv)
            else:
                ok = b.and_(ok, b.icmp_unsigned("!=", mv, const(mv.type, 0)))
        s = b.select(ok, s, vninf)
        scores.append(s)
        mx = call_intrinsic(b, "maxnum", [mx, s])
    m_old = b.load(_at(b, M, I64(r)), align=al)
    m_new = call_intrinsic(b, "maxnum", [m_old, _reduce(b, "fmax", mx)])
    m_use = b.select(b.fcmp_ordered("==", m_new, const(ct, float("-inf"))), const(ct, 0.0), m_new)
    alpha = vmath.emit(b, "exp", b.fsub(m_old, m_use))
    tot = const(VT, 0.0)
    for cv, s in enumerate(scores):
        p = vmath.emit(b, "exp", b.fsub(s, splat(b, m_use, W)))
        _vstore(b, p, P, I64(r * BK + cv * W), al)
        tot = b.fadd(tot, p)
    den = b.fadd(b.fmul(b.load(_at(b, LS, I64(r)), align=al), alpha), _reduce(b, "fadd", tot, const(ct, -0.0)))
    b.store(m_new, _at(b, M, I64(r)), align=al)
    b.store(den, _at(b, LS, I64(r)), align=al)
    b.store(alpha, _at(b, AL, I64(r)), align=al)


def _build(spec):
    return build_attention(spec), "attention"


_kernels = jit.KernelCache(_build, KERNEL_FN)


def get_kernel(spec: AttentionSpec):
    """(CompiledModule, ctypes function) for a spec, compiled once per structure."""
    fn = _kernels(spec)
    return fn._module, fn
