"""The k-quant quantizers (q4_k, q6_k) of codegen/quantize.py: llama.cpp's quantize_row_q4_K_ref
and quantize_row_q6_K_ref with their scale searches make_qkx2_quants (min/scale fit over 21
candidate scales, weights av_x + |x|) and make_qx_quants (rmse_type 1: weights x^2, 18 candidate
scales), in the reference's exact f32 operation order: elementwise steps as vector code (the same
IEEE operations per element), every sum lane by lane in order (never a tree)."""
from __future__ import annotations

import llvmlite.ir as ir

from .llvmutil import F32, I8, I32, I64, call_intrinsic, splat
from .qscalar import half_back, scan, store, store_half


def _el(b, p, i):
    return b.gep(p, [I64(i) if isinstance(i, int) else i], inbounds=True)


def _ld(b, p, i):
    return b.load(_el(b, p, i))


def _zeroed(s, *ptrs):
    for p in ptrs:
        s.put(p, s.f(0))


def _vt(n, t=F32):
    return ir.VectorType(t, n)


def _vload(b, p, n):
    return b.load(b.bitcast(p, _vt(n).as_pointer()), align=4)


def _vstore_codes(b, v, p):
    """Store the <n x i32> codes v as bytes at i8* p."""
    b.store(b.trunc(v, _vt(v.type.count, I8)), b.bitcast(p, _vt(v.type.count, I8).as_pointer()), align=1)


def _vc(n, value, t=F32):
    return ir.Constant(_vt(n, t), [ir.Constant(t, value)] * n)


def _seq(b, v, start=None):
    """Sum of v's lanes in lane order, like the reference's `sum += v[i]` loop (starting from
    `start`, or from lane 0 when None): exact, not a tree."""
    n = v.type.count
    acc, first = (start, 0) if start is not None else (b.extract_element(v, I32(0)), 1)
    for i in range(first, n):
        acc = b.fadd(acc, b.extract_element(v, I32(i)))
    return acc


def _vnearest(b, v):
    n = v.type.count
    bits = b.bitcast(b.fadd(v, _vc(n, 12582912.0)), _vt(n, I32))
    return b.sub(b.and_(bits, _vc(n, 0x7FFFFF, I32)), _vc(n, 0x400000, I32))


def _vclamp(b, v, lo, hi):
    n = v.type.count
    v = b.select(b.icmp_signed("<", v, _vc(n, hi, I32)), v, _vc(n, hi, I32))
    return b.select(b.icmp_signed(">", v, _vc(n, lo, I32)), v, _vc(n, lo, I32))


def _splat(b, v, n):
    return splat(b, v, n)


def _make_qkx2(s, xv, wv, L, nmax=15, rmin=-1.0, rdelta=0.1, nstep=20):
    """make_qkx2_quants(32, nmax, x, w, L, &the_min, Laux, rmin, rdelta, nstep, false) on the
    <32 x float> x and weights: returns (scale, the_min); writes the codes to L (i8*).  Vector
    code per element, sums in the reference's order (exact)."""
    b, n = s.b, 32
    mn, mx = b.extract_element(xv, I32(0)), b.extract_element(xv, I32(0))
    for i in range(1, n):
        e = b.extract_element(xv, I32(i))
        mn = b.select(b.fcmp_ordered("<", e, mn), e, mn)
        mx = b.select(b.fcmp_ordered(">", e, mx), e, mx)
    sum_w, sum_x = _seq(b, wv), _seq(b, b.fmul(wv, xv))
    vmn, scale, best = s.local(F32), s.local(F32), s.local(F32)
    rscale, rmin_, Lv = s.local(F32), s.local(F32), s.local(_vt(n, I32))
    s.put(vmn, b.select(b.fcmp_ordered(">", mn, s.f(0)), s.f(0), mn))
    with b.if_else(b.fcmp_ordered("==", mx, s.get(vmn))) as (flat, search):
        with flat:
            s.put(Lv, _vc(n, 0, I32))
            s.put(rscale, s.f(0))
            s.put(rmin_, b.fneg(s.get(vmn)))
        with search:
            lo = s.get(vmn)
            iscale = b.fdiv(s.f(nmax), b.fsub(mx, lo))
            s.put(scale, b.fdiv(s.f(1), iscale))
            l = _vclamp(b, _vnearest(b, b.fmul(_splat(b, iscale, n), b.fsub(xv, _splat(b, lo, n)))), 0, nmax)
            s.put(Lv, l)
            diff = b.fsub(b.fadd(b.fmul(_splat(b, s.get(scale), n), b.sitofp(l, _vt(n))), _splat(b, lo, n)), xv)
            s.put(best, _seq(b, b.fmul(wv, b.fmul(diff, diff)), s.f(0)))
            _qkx2_steps(s, xv, wv, Lv, nmax, rmin, rdelta, nstep, mx, sum_w, sum_x, scale, best, vmn)
            s.put(rscale, s.get(scale))
            s.put(rmin_, b.fneg(s.get(vmn)))
    _vstore_codes(b, s.get(Lv), L)
    return s.get(rscale), s.get(rmin_)


def _qkx2_steps(s, xv, wv, Lv, nmax, rmin, rdelta, nstep, hi, sw, sx, scale, best, mn):
    """The candidate-scale loop of make_qkx2_quants (keeps the best by weighted squared error;
    like the reference, a better candidate's min moves the grid of the candidates after it)."""
    b, n = s.b, 32
    with s.loop(nstep + 1, "is") as k:
        lo = s.get(mn)
        step = b.fadd(b.fadd(s.f(rmin), b.fmul(s.f(rdelta), b.sitofp(k, F32))), s.f(nmax))
        iscale = b.fdiv(step, b.fsub(hi, lo))
        l = _vclamp(b, _vnearest(b, b.fmul(_splat(b, iscale, n), b.fsub(xv, _splat(b, lo, n)))), 0, nmax)
        lf = b.sitofp(l, _vt(n))
        wl = b.fmul(wv, lf)
        vl, vl2, vxl = _seq(b, wl, s.f(0)), _seq(b, b.fmul(wl, lf), s.f(0)), _seq(b, b.fmul(wl, xv), s.f(0))
        D = b.fsub(b.fmul(sw, vl2), b.fmul(vl, vl))
        with b.if_then(b.fcmp_ordered(">", D, s.f(0))):
            ts = b.fdiv(b.fsub(b.fmul(sw, vxl), b.fmul(sx, vl)), D)
            tm = b.fdiv(b.fsub(b.fmul(vl2, sx), b.fmul(vl, vxl)), D)
            pos = b.fcmp_ordered(">", tm, s.f(0))
            ts = b.select(pos, b.fdiv(vxl, vl2), ts)
            tm = b.select(pos, s.f(0), tm)
            diff = b.fsub(b.fadd(b.fmul(_splat(b, ts, n), lf), _splat(b, tm, n)), xv)
            mad = _seq(b, b.fmul(wv, b.fmul(diff, diff)), s.f(0))
            with b.if_then(b.fcmp_ordered("<", mad, s.get(best))):
                s.put(Lv, l)
                s.put(best, mad)
                s.put(scale, ts)
                s.put(mn, tm)


def q4_k(s, x, y, nan):
    """quantize_row_q4_K_ref of one super-block: x float*[256] -> y i8*[144]."""
    b = s.b
    for _ in scan(s, x, 256, nan):
        pass
    L = s.local(I8, 256)
    scales, mins = s.local(F32, 8), s.local(F32, 8)
    max_scale, max_min = s.local(F32), s.local(F32)
    _zeroed(s, max_scale, max_min)
    Lp = s.at(L, 0)
    with s.loop(8, "sub") as j:
        xv = _vload(b, _el(b, x, b.mul(j, I64(32))), 32)
        av_x = call_intrinsic(b, "sqrt", [b.fdiv(_seq(b, b.fmul(xv, xv), s.f(0)), s.f(32))])
        wv = b.fadd(_splat(b, av_x, 32), call_intrinsic(b, "fabs", [xv]))
        sc, mn = _make_qkx2(s, xv, wv, _el(b, Lp, b.mul(j, I64(32))))
        b.store(sc, _el(b, s.at(scales, 0), j))
        b.store(mn, _el(b, s.at(mins, 0), j))
        s.put(max_scale, b.select(b.fcmp_ordered(">", sc, s.get(max_scale)), sc, s.get(max_scale)))
        s.put(max_min, b.select(b.fcmp_ordered(">", mn, s.get(max_min)), mn, s.get(max_min)))
    ms, mm = s.get(max_scale), s.get(max_min)
    inv_s = b.select(b.fcmp_ordered(">", ms, s.f(0)), b.fdiv(s.f(63), ms), s.f(0))
    inv_m = b.select(b.fcmp_ordered(">", mm, s.f(0)), b.fdiv(s.f(63), mm), s.f(0))

    def six(inv, arr, j):
        q = b.trunc(s.nearest_int(b.fmul(inv, _ld(b, s.at(arr, 0), j))), I8)   # uint8_t ls = ...
        return b.select(b.icmp_unsigned("<", q, I8(63)), q, I8(63))
    ls = [six(inv_s, scales, j) for j in range(8)]
    lm = [six(inv_m, mins, j) for j in range(8)]
    packed = [None] * 12
    for j in range(8):
        if j < 4:
            packed[j], packed[j + 4] = ls[j], lm[j]
        else:
            packed[j + 4] = b.or_(b.and_(ls[j], I8(0xF)), b.shl(b.and_(lm[j], I8(0xF)), I8(4)))
            packed[j - 4] = b.or_(packed[j - 4], b.shl(b.lshr(ls[j], I8(4)), I8(6)))
            packed[j] = b.or_(packed[j], b.shl(b.lshr(lm[j], I8(4)), I8(6)))
    for k, v in enumerate(packed):
        store(b, y, 4 + k, v)
    d, dmin = b.fdiv(ms, s.f(63)), b.fdiv(mm, s.f(63))
    store_half(b, y, 0, d, s.get(nan))
    store_half(b, y, 2, dmin, s.get(nan))
    dq, dminq = half_back(b, d), half_back(b, dmin)
    for j in range(8):
        dj = b.fmul(dq, b.uitofp(ls[j], F32))
        with b.if_then(b.fcmp_unordered("!=", dj, s.f(0))):
            dm = b.fmul(dminq, b.uitofp(lm[j], F32))
            xv = _vload(b, _el(b, x, 32 * j), 32)
            q = _vnearest(b, b.fdiv(b.fadd(xv, _splat(b, dm, 32)), _splat(b, dj, 32)))
            _vstore_codes(b, _vclamp(b, q, 0, 15), _el(b, Lp, 32 * j))
    for p in range(4):
        with s.loop(32, "l") as l:
            at = b.add(l, I64(64 * p))
            byte = b.or_(_ld(b, Lp, at), b.shl(_ld(b, Lp, b.add(at, I64(32))), I8(4)))
            store(b, y, b.add(l, I64(16 + 32 * p)), byte)


def _make_qx(s, x, L, n=16, nmax=32):
    """make_qx_quants(n, nmax, x, L, 1, NULL): returns the scale; writes codes + nmax to L.
    Vector code per element, sums in the reference's order (exact)."""
    b = s.b
    xv = _vload(b, x, n)
    amax, mx = s.f(0), s.f(0)
    for i in range(n):
        e = b.extract_element(xv, I32(i))
        a = call_intrinsic(b, "fabs", [e])
        gt = b.fcmp_ordered(">", a, amax)
        amax, mx = b.select(gt, a, amax), b.select(gt, e, mx)
    res, scale, best, Lv = s.local(F32), s.local(F32), s.local(F32), s.local(_vt(n, I32))
    w = b.fmul(xv, xv)
    wx = b.fmul(w, xv)

    def sums(iscale):
        l = _vclamp(b, _vnearest(b, b.fmul(_splat(b, iscale, n), xv)), -nmax, nmax - 1)
        lf = b.sitofp(l, _vt(n))
        return b.add(l, _vc(n, nmax, I32)), _seq(b, b.fmul(wx, lf), s.f(0)), _seq(b, b.fmul(b.fmul(w, lf), lf), s.f(0))

    with b.if_else(b.fcmp_ordered("<", amax, s.f(1e-15))) as (zero, search):
        with zero:
            s.put(Lv, _vc(n, 0, I32))
            s.put(res, s.f(0))
        with search:
            codes, slx, sl2 = sums(b.fdiv(s.f(-nmax), mx))
            s.put(Lv, codes)
            s.put(scale, b.select(b.fcmp_unordered("!=", sl2, s.f(0)), b.fdiv(slx, sl2), s.f(0)))
            s.put(best, b.fmul(s.get(scale), slx))
            with s.loop(19, "is") as k:
                is_ = b.sub(k, I64(9))
                with b.if_then(b.icmp_signed("!=", is_, I64(0))):
                    step = b.fadd(s.f(nmax), b.fmul(s.f(0.1), b.sitofp(is_, F32)))
                    codes, vx, v2 = sums(b.fdiv(b.fneg(step), mx))
                    better = b.and_(b.fcmp_ordered(">", v2, s.f(0)),
                                    b.fcmp_ordered(">", b.fmul(vx, vx), b.fmul(s.get(best), v2)))
                    with b.if_then(better):
                        s.put(Lv, codes)
                        sc = b.fdiv(vx, v2)
                        s.put(scale, sc)
                        s.put(best, b.fmul(sc, vx))
            s.put(res, s.get(scale))
    _vstore_codes(b, s.get(Lv), L)
    return s.get(res)


def q6_k(s, x, y, nan):
    """quantize_row_q6_K_ref of one super-block: x float*[256] -> y i8*[210]."""
    b = s.b
    for _ in scan(s, x, 256, nan):
        pass
    L, scales = s.local(I8, 256), s.local(F32, 16)
    Lp, sp = s.at(L, 0), s.at(scales, 0)
    max_scale, max_abs = s.local(F32), s.local(F32)
    _zeroed(s, max_scale, max_abs)
    with s.loop(16, "ib") as ib:
        sc = _make_qx(s, _el(b, x, b.mul(ib, I64(16))), _el(b, Lp, b.mul(ib, I64(16))))
        b.store(sc, _el(b, sp, ib))
        a = s.fabs(sc)
        gt = b.fcmp_ordered(">", a, s.get(max_abs))
        s.put(max_scale, b.select(gt, sc, s.get(max_scale)))
        s.put(max_abs, b.select(gt, a, s.get(max_abs)))
    with b.if_else(b.fcmp_ordered("<", s.get(max_abs), s.f(1e-15))) as (zero, full):
        with zero:
            with s.loop(210, "z") as i:
                store(b, y, i, I8(0))
            store_half(b, y, 208, s.f(0), s.get(nan))
        with full:
            iscale = b.fdiv(s.f(-128), s.get(max_scale))
            d = b.fdiv(s.f(1), iscale)
            store_half(b, y, 208, d, s.get(nan))
            dq = half_back(b, d)
            with s.loop(16, "ib") as ib:
                q = s.nearest_int(b.fmul(iscale, _ld(b, sp, ib)))
                q = b.select(b.icmp_signed("<", q, I32(127)), q, I32(127))
                store(b, y, b.add(ib, I64(192)), b.trunc(q, I8))
            _q6_codes(s, x, y, Lp, dq)
            _q6_pack(s, y, Lp)


def _q6_codes(s, x, y, Lp, dq):
    b = s.b
    with s.loop(16, "j") as j:
        sc = b.load(b.gep(y, [b.add(j, I64(192))], inbounds=True))
        dj = b.fmul(dq, b.sitofp(sc, F32))
        with b.if_then(b.fcmp_unordered("!=", dj, s.f(0))):
            at = b.mul(j, I64(16))
            q = _vclamp(b, _vnearest(b, b.fdiv(_vload(b, _el(b, x, at), 16), _splat(b, dj, 16))), -32, 31)
            _vstore_codes(b, b.add(q, _vc(16, 32, I32)), _el(b, Lp, at))


def _q6_pack(s, y, Lp):
    b = s.b
    for half in range(2):
        j = 128 * half
        with s.loop(32, "l") as l:
            q = [_ld(b, Lp, b.add(l, I64(j + 32 * k))) for k in range(4)]
            lo = [b.and_(v, I8(0xF)) for v in q]
            store(b, y, b.add(l, I64(64 * half)), b.or_(lo[0], b.shl(lo[2], I8(4))))
            store(b, y, b.add(l, I64(64 * half + 32)), b.or_(lo[1], b.shl(lo[3], I8(4))))
            hi = I8(0)
            for k in range(4):
                hi = b.or_(hi, b.shl(b.lshr(q[k], I8(4)), I8(2 * k)))
            store(b, y, b.add(l, I64(128 + 32 * half)), hi)
