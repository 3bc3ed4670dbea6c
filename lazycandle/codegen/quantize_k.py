"""The k-quant quantizers (q4_k, q6_k) of codegen/quantize.py: llama.cpp's quantize_row_q4_K_ref
and quantize_row_q6_K_ref with their scale searches make_qkx2_quants (min/scale fit over 21
candidate scales, weights av_x + |x|) and make_qx_quants (rmse_type 1: weights x^2, 18 candidate
scales), emitted as scalar f32 code in the reference's exact operation order."""
from __future__ import annotations

import llvmlite.ir as ir

from .llvmutil import F32, I8, I32, I64, call_intrinsic
from .qscalar import half_back, scan, store, store_half


def _el(b, p, i):
    return b.gep(p, [I64(i) if isinstance(i, int) else i], inbounds=True)


def _ld(b, p, i):
    return b.load(_el(b, p, i))


def _acc(s, p, v):
    s.put(p, s.b.fadd(s.get(p), v))


def _zeroed(s, *ptrs):
    for p in ptrs:
        s.put(p, s.f(0))


def _make_qkx2(s, x, w, L, Laux, nmax=15, rmin=-1.0, rdelta=0.1, nstep=20):
    """make_qkx2_quants(32, nmax, x, w, L, &the_min, Laux, rmin, rdelta, nstep, false):
    returns (scale, the_min) as f32 values; writes the codes to L (i8*)."""
    b, n = s.b, 32
    mn, mx, sw, sx = (s.local(F32) for _ in range(4))
    x0, w0 = _ld(b, x, 0), _ld(b, w, 0)
    s.put(mn, x0), s.put(mx, x0), s.put(sw, w0), s.put(sx, b.fmul(w0, x0))
    with s.loop(n, "i", 1) as i:
        v, wi = _ld(b, x, i), _ld(b, w, i)
        s.put(mn, b.select(b.fcmp_ordered("<", v, s.get(mn)), v, s.get(mn)))
        s.put(mx, b.select(b.fcmp_ordered(">", v, s.get(mx)), v, s.get(mx)))
        _acc(s, sw, wi)
        _acc(s, sx, b.fmul(wi, v))
    m0 = s.get(mn)
    s.put(mn, b.select(b.fcmp_ordered(">", m0, s.f(0)), s.f(0), m0))
    scale, best = s.local(F32), s.local(F32)
    rscale, rmin_ = s.local(F32), s.local(F32)
    hi = s.get(mx)

    def code(iscale, xi, lo):
        return s.clamp(s.nearest_int(b.fmul(iscale, b.fsub(xi, lo))), 0, nmax)

    with b.if_else(b.fcmp_ordered("==", hi, s.get(mn))) as (flat, search):
        with flat:
            with s.loop(n, "z") as i:
                b.store(I8(0), _el(b, L, i))
            s.put(rscale, s.f(0))
            s.put(rmin_, b.fneg(s.get(mn)))
        with search:
            lo = s.get(mn)
            rng = b.fsub(hi, lo)
            iscale = b.fdiv(s.f(nmax), rng)
            s.put(scale, b.fdiv(s.f(1), iscale))
            s.put(best, s.f(0))
            with s.loop(n) as i:
                xi = _ld(b, x, i)
                l = code(iscale, xi, lo)
                b.store(b.trunc(l, I8), _el(b, L, i))
                diff = b.fsub(b.fadd(b.fmul(s.get(scale), b.sitofp(l, F32)), lo), xi)
                _acc(s, best, b.fmul(_ld(b, w, i), b.fmul(diff, diff)))
            _qkx2_steps(s, x, w, L, Laux, nmax, rmin, rdelta, nstep, hi, sw, sx, scale, best, mn)
            s.put(rscale, s.get(scale))
            s.put(rmin_, b.fneg(s.get(mn)))
    return s.get(rscale), s.get(rmin_)


def _qkx2_steps(s, x, w, L, Laux, nmax, rmin, rdelta, nstep, hi, sw, sx, scale, best, mn):
    """The candidate-scale loop of make_qkx2_quants (keeps the best by weighted squared error;
    like the reference, a better candidate's min moves the grid of the candidates after it)."""
    b, n = s.b, 32
    sl, sl2, sxl, mad = (s.local(F32) for _ in range(4))
    with s.loop(nstep + 1, "is") as k:
        lo = s.get(mn)
        step = b.fadd(b.fadd(s.f(rmin), b.fmul(s.f(rdelta), b.sitofp(k, F32))), s.f(nmax))
        iscale = b.fdiv(step, b.fsub(hi, lo))
        _zeroed(s, sl, sl2, sxl)
        with s.loop(n) as i:
            xi, wi = _ld(b, x, i), _ld(b, w, i)
            l = s.clamp(s.nearest_int(b.fmul(iscale, b.fsub(xi, lo))), 0, nmax)
            b.store(b.trunc(l, I8), _el(b, Laux, i))
            wl = b.fmul(wi, b.sitofp(l, F32))
            _acc(s, sl, wl)
            _acc(s, sl2, b.fmul(wl, b.sitofp(l, F32)))
            _acc(s, sxl, b.fmul(wl, xi))
        vsw, vsx, vl, vl2, vxl = s.get(sw), s.get(sx), s.get(sl), s.get(sl2), s.get(sxl)
        D = b.fsub(b.fmul(vsw, vl2), b.fmul(vl, vl))
        with b.if_then(b.fcmp_ordered(">", D, s.f(0))):
            ts = b.fdiv(b.fsub(b.fmul(vsw, vxl), b.fmul(vsx, vl)), D)
            tm = b.fdiv(b.fsub(b.fmul(vl2, vsx), b.fmul(vl, vxl)), D)
            pos = b.fcmp_ordered(">", tm, s.f(0))
            ts = b.select(pos, b.fdiv(vxl, vl2), ts)
            tm = b.select(pos, s.f(0), tm)
            s.put(mad, s.f(0))
            with s.loop(n) as i:
                diff = b.fsub(b.fadd(b.fmul(ts, b.uitofp(_ld(b, Laux, i), F32)), tm), _ld(b, x, i))
                _acc(s, mad, b.fmul(_ld(b, w, i), b.fmul(diff, diff)))
            with b.if_then(b.fcmp_ordered("<", s.get(mad), s.get(best))):
                with s.loop(n) as i:
                    b.store(_ld(b, Laux, i), _el(b, L, i))
                s.put(best, s.get(mad))
                s.put(scale, ts)
                s.put(mn, tm)


def q4_k(s, x, y, nan):
    """quantize_row_q4_K_ref of one super-block: x float*[256] -> y i8*[144]."""
    b = s.b
    for _ in scan(s, x, 256, nan):
        pass
    L, Laux, w = s.local(I8, 256), s.local(I8, 32), s.local(F32, 32)
    scales, mins = s.local(F32, 8), s.local(F32, 8)
    max_scale, max_min, sum_x2 = s.local(F32), s.local(F32), s.local(F32)
    _zeroed(s, max_scale, max_min)
    Lp, Lauxp, wp = s.at(L, 0), s.at(Laux, 0), s.at(w, 0)
    with s.loop(8, "sub") as j:
        xj = _el(b, x, b.mul(j, I64(32)))
        s.put(sum_x2, s.f(0))
        with s.loop(32, "l") as l:
            v = _ld(b, xj, l)
            _acc(s, sum_x2, b.fmul(v, v))
        av_x = call_intrinsic(b, "sqrt", [b.fdiv(s.get(sum_x2), s.f(32))])
        with s.loop(32, "l") as l:
            b.store(b.fadd(av_x, s.fabs(_ld(b, xj, l))), _el(b, wp, l))
        sc, mn = _make_qkx2(s, xj, wp, _el(b, Lp, b.mul(j, I64(32))), Lauxp)
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
            with s.loop(32, "ii") as i:
                at = b.add(i, I64(32 * j))
                l = s.clamp(s.nearest_int(b.fdiv(b.fadd(_ld(b, x, at), dm), dj)), 0, 15)
                b.store(b.trunc(l, I8), _el(b, Lp, at))
    for p in range(4):
        with s.loop(32, "l") as l:
            at = b.add(l, I64(64 * p))
            byte = b.or_(_ld(b, Lp, at), b.shl(_ld(b, Lp, b.add(at, I64(32))), I8(4)))
            store(b, y, b.add(l, I64(16 + 32 * p)), byte)


def _make_qx(s, x, L, n=16, nmax=32):
    """make_qx_quants(n, nmax, x, L, 1, NULL): returns the scale; writes codes + nmax to L."""
    b = s.b
    amax, mx, res, scale, best, slx, sl2 = (s.local(F32) for _ in range(7))
    _zeroed(s, amax, mx)
    with s.loop(n) as i:
        v = _ld(b, x, i)
        a = s.fabs(v)
        gt = b.fcmp_ordered(">", a, s.get(amax))
        s.put(mx, b.select(gt, v, s.get(mx)))
        s.put(amax, b.select(gt, a, s.get(amax)))

    def sums(iscale, write):
        _zeroed(s, slx, sl2)
        with s.loop(n) as i:
            xi = _ld(b, x, i)
            l = s.clamp(s.nearest_int(b.fmul(iscale, xi)), -nmax, nmax - 1)
            if write:
                b.store(b.trunc(b.add(l, I32(nmax)), I8), _el(b, L, i))
            fl = b.sitofp(l, F32)
            wv = b.fmul(xi, xi)
            _acc(s, slx, b.fmul(b.fmul(wv, xi), fl))
            _acc(s, sl2, b.fmul(b.fmul(wv, fl), fl))

    with b.if_else(b.fcmp_ordered("<", s.get(amax), s.f(1e-15))) as (zero, search):
        with zero:
            with s.loop(n, "z") as i:
                b.store(I8(0), _el(b, L, i))
            s.put(res, s.f(0))
        with search:
            m = s.get(mx)
            sums(b.fdiv(s.f(-nmax), m), True)
            v2 = s.get(sl2)
            s.put(scale, b.select(b.fcmp_unordered("!=", v2, s.f(0)), b.fdiv(s.get(slx), v2), s.f(0)))
            s.put(best, b.fmul(s.get(scale), s.get(slx)))
            with s.loop(19, "is") as k:
                is_ = b.sub(k, I64(9))
                with b.if_then(b.icmp_signed("!=", is_, I64(0))):
                    step = b.fadd(s.f(nmax), b.fmul(s.f(0.1), b.sitofp(is_, F32)))
                    iscale = b.fdiv(b.fneg(step), m)
                    sums(iscale, False)
                    vx, v2 = s.get(slx), s.get(sl2)
                    better = b.and_(b.fcmp_ordered(">", v2, s.f(0)),
                                    b.fcmp_ordered(">", b.fmul(vx, vx), b.fmul(s.get(best), v2)))
                    with b.if_then(better):
                        with s.loop(n, "w") as i:
                            l = s.clamp(s.nearest_int(b.fmul(iscale, _ld(b, x, i))), -nmax, nmax - 1)
                            b.store(b.trunc(b.add(l, I32(nmax)), I8), _el(b, L, i))
                        sc = b.fdiv(vx, v2)
                        s.put(scale, sc)
                        s.put(best, b.fmul(sc, vx))
            s.put(res, s.get(scale))
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
            with s.loop(16, "ii") as i:
                at = b.add(i, b.mul(j, I64(16)))
                l = s.clamp(s.nearest_int(b.fdiv(_ld(b, x, at), dj)), -32, 31)
                b.store(b.trunc(b.add(l, I32(32)), I8), _el(b, Lp, at))


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
