"""LLVM kernels of qmatmul: out[i, n] = sum_k x[i, k] * W[n, k] with W in GGML blocks, read
straight from the blocks (codegen/qblocks.py unpacks each run of 32 values in registers).

Two ways to the dot products, chosen per call (runtime side: qtensor.py):
  "int8"  (llama.cpp's and candle's way) a first kernel (`QActSpec`) quantizes each activation row
          per 32 values like q8_0 (d = amax / 127, q = round(x / d); xs = d * sum(q) for the
          formats with an additive term), then integer dot products of the weight codes with the
          int8 activations: with AVX-VNNI or AVX512-VNNI (`isa="vnni"`) one vpdpbusd (u8 x s8,
          four products summed into each i32 lane; signed weights go through psign), on AVX2
          pmaddubsw (-> pairs of i16) then pmaddwd (-> 8 x i32), else (`isa="generic"`) the same
          sums from plain vector multiplies -- the same integers on every path (a pair of
          products is at most 2 * 128 * 127, so pmaddubsw never saturates); one f32 FMA per 32
          values with the product of the scales.
  "f32"   dequantize in registers and FMA with the f32 activations (no activation rounding).
Weight rows are the units split over the pool; a tile of `nt` weight rows x `mt` activation rows
(python-unrolled, accumulators in registers) unpacks each block once per tile and keeps nt * mt
independent FMA chains.  A tile running past m (or past the call's last weight row) recomputes
the last row and does not store it.
A NaN anywhere in a weight block (its scale) or an activation block spreads to the outputs it
touches: an activation block with a NaN gets a NaN scale."""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from ..ir.kernels import KernelSpec
from ..ir.qformats import FORMATS
from . import jit, registry
from .llvmutil import F32, I8, I16, I32, I64, call_intrinsic, intrinsic, splat
from .loops import KERNEL_FN, arg_pointer, counted_loop, kernel_function, new_module, unit_range
from .qblocks import V32, chunk, chunk_floats

V8F = ir.VectorType(F32, 8)
V8I = ir.VectorType(I32, 8)
V16S = ir.VectorType(I16, 16)
V32F = ir.VectorType(F32, 32)


@dataclass(frozen=True)
class QActSpec(KernelSpec):
    """Quantize activation rows per 32 values to int8 (bufs = [blocks, x]; sizes = [K, M];
    units = rows): `blocks` is one buffer of act_bytes(M, K) bytes, see act_parts."""

    def extent(self, sizes) -> int:
        return int(sizes[1])

    def describe(self) -> str:
        return "int8 activation blocks for qmatmul"


@dataclass(frozen=True)
class QMatSpec(KernelSpec):
    """One qmatmul kernel: weight format, "int8" or "f32" path, int8 dot ISA ("vnni", "avx2"
    or "generic"), activation rows (mt) and weight rows (nt) per tile.  bufs: [out, w, blocks]
    (int8: the activation blocks QActSpec wrote) or [out, w, x] (f32); sizes = [m, N, K];
    units = weight rows n."""
    fmt: str
    path: str
    isa: str
    mt: int
    nt: int = 1
    centred: bool = False     # q4_0 / q5_0 codes centred (psign) or unsigned + offset term (measured
                              # faster: 5% at m = 1, up to 20% at m = 32, bench of 18:46)

    def describe(self) -> str:
        return f"qmatmul {self.fmt} ({self.path}, {self.isa}, {self.mt} rows per tile)"


def act_bytes(m, K):
    """Bytes of the int8 activation blocks of m rows of K (K a multiple of 32): the codes
    xq (m * K int8), then the blocks' scales xd and their d * sum(q) terms xs (m * K / 32 f32
    each).  m may be a named lc.Size."""
    return m * (K + 8 * (K // 32))


def act_parts(b, base, M, K):
    """(xq, xd, xs) pointers into the activation blocks at i8* `base` for M rows of K."""
    xd_at = b.mul(M, K)
    xs_at = b.add(xd_at, b.mul(M, b.udiv(K, I64(8))))
    return (b.bitcast(base, V32.as_pointer(), name="xq"),
            b.bitcast(b.gep(base, [xd_at], inbounds=True), F32.as_pointer(), name="xd"),
            b.bitcast(b.gep(base, [xs_at], inbounds=True), F32.as_pointer(), name="xs"))


def _shuffle(b, v, idx):
    return b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, len(idx)), list(idx)))


def _tree_sum(b, v):
    n = v.type.count
    while n > 1:
        n //= 2
        v = b.fadd(_shuffle(b, v, range(n)), _shuffle(b, v, range(n, 2 * n)))
    return b.extract_element(v, I32(0))


def _fma(b, x, y, z):
    return call_intrinsic(b, "fmuladd", [x, y, z])


# ---- activation quantization -----------------------------------------------------------------
def build_act(spec: QActSpec, name="qact") -> str:
    m = new_module(name)
    fn, b = kernel_function(m, name)
    lo, hi = unit_range(fn)
    p = fn.args[0]
    K = b.load(fn.args[1], align=8)
    M = b.load(b.gep(fn.args[1], [I64(1)]), align=8)
    xq, xd, xs = act_parts(b, arg_pointer(b, p, 0, I8, "blocks"), M, K)
    x = arg_pointer(b, p, 1, V32F, "x")
    nc = b.udiv(K, I64(32))
    with counted_loop(b, lo, hi, 1, "row") as r:
        with counted_loop(b, I64(0), nc, 1, "c") as c:
            at = b.add(b.mul(r, nc), c)
            v = b.load(b.gep(x, [at], inbounds=True), align=4)
            a = call_intrinsic(b, "fabs", [v])
            amax = call_intrinsic(b, "vector.reduce.fmax", [a], ret=F32)
            nan = call_intrinsic(b, "vector.reduce.or", [b.fcmp_unordered("uno", v, v)],
                                 ret=ir.IntType(1))
            d = b.fdiv(amax, ir.Constant(F32, 127.0))
            idv = b.select(b.fcmp_unordered("!=", d, ir.Constant(F32, 0)), b.fdiv(ir.Constant(F32, 1), d),
                           ir.Constant(F32, 0))
            r_ = call_intrinsic(b, "round", [b.fmul(v, splat(b, idv, 32))])
            q = b.call(intrinsic(m, "llvm.fptosi.sat.v32i8.v32f32", V32, [V32F]), [r_])
            b.store(q, b.gep(xq, [at], inbounds=True), align=1)
            d = b.select(nan, ir.Constant(F32, float("nan")), d)
            b.store(d, b.gep(xd, [at], inbounds=True))
            qsum = call_intrinsic(b, "vector.reduce.add", [b.sext(q, ir.VectorType(I32, 32))], ret=I32)
            b.store(b.fmul(d, b.sitofp(qsum, F32)), b.gep(xs, [at], inbounds=True))
    b.ret_void()
    return str(m)


# ---- integer dot products -------------------------------------------------------------------
def _dot_avx2(b, w, y, signed):
    """<8 x i32>: lane k = sum of w[j] * y[j] over j in 4k..4k+3 (pmaddubsw + pmaddwd)."""
    m = b.module
    if signed:
        psign = intrinsic(m, "llvm.x86.avx2.psign.b", V32, [V32, V32])
        w, y = call_abs(b, w), b.call(psign, [y, w])
    maddubs = intrinsic(m, "llvm.x86.avx2.pmadd.ub.sw", V16S, [V32, V32])
    maddwd = intrinsic(m, "llvm.x86.avx2.pmadd.wd", V8I, [V16S, V16S])
    return b.call(maddwd, [b.call(maddubs, [w, y]), ir.Constant(V16S, [I16(1)] * 16)])


def _dot_vnni(b, w, y, signed):
    """_dot_avx2's lanes by one vpdpbusd (AVX-VNNI, or AVX512-VNNI with VL: one intrinsic)."""
    m = b.module
    if signed:
        psign = intrinsic(m, "llvm.x86.avx2.psign.b", V32, [V32, V32])
        w, y = call_abs(b, w), b.call(psign, [y, w])
    dp = intrinsic(m, "llvm.x86.avx512.vpdpbusd.256", V8I, [V8I, V8I, V8I])
    return b.call(dp, [ir.Constant(V8I, [0] * 8), b.bitcast(w, V8I), b.bitcast(y, V8I)])


def call_abs(b, v):
    return b.call(intrinsic(b.module, "llvm.abs.v32i8", V32, [V32, ir.IntType(1)]), [v, ir.Constant(ir.IntType(1), 0)])


def _dot_generic(b, w, y, signed):
    """The same lanes as _dot_avx2 from plain vector code (any ISA)."""
    t16 = ir.VectorType(I16, 32)
    wx = b.sext(w, t16) if signed else b.zext(w, t16)
    prod = b.sext(b.mul(wx, b.sext(y, t16)), ir.VectorType(I32, 32))
    parts = [_shuffle(b, prod, range(r, 32, 4)) for r in range(4)]
    return b.add(b.add(parts[0], parts[1]), b.add(parts[2], parts[3]))


def _lanes(b, s0, s1):
    """<8 x float>: s0 in lanes 0..3, s1 in lanes 4..7 (None when s0 is s1: scalar path)."""
    if s1 is s0:
        return None
    return b.shuffle_vector(splat(b, s0, 8), splat(b, s1, 8), ir.Constant(V8I, [0, 1, 2, 3, 12, 13, 14, 15]))


def _lane_scales(b, s0, lanes, xd):
    """<8 x float> of the chunk's scales times the activation block's scale xd."""
    if lanes is None:
        return splat(b, b.fmul(s0, xd), 8)
    return b.fmul(lanes, splat(b, xd, 8))


# ---- the matmul kernel ----------------------------------------------------------------------
def build(spec: QMatSpec, name="qmatmul") -> str:
    f = FORMATS[spec.fmt]
    m = new_module(name)
    fn, b = kernel_function(m, name)
    lo, hi = unit_range(fn)
    p = fn.args[0]
    out, w = arg_pointer(b, p, 0, F32, "out"), arg_pointer(b, p, 1, I8, "w")
    int8 = spec.path == "int8"
    sz = fn.args[1]
    M, N, K = (b.load(b.gep(sz, [I64(k)]), align=8) for k in range(3))
    if int8:
        xq, xd, xs = act_parts(b, arg_pointer(b, p, 2, I8, "blocks"), M, K)
    else:
        x = arg_pointer(b, p, 2, V8F, "x")
    nb = b.udiv(K, I64(f.block))
    ncx = b.udiv(K, I64(32))
    rowb = b.mul(nb, I64(f.nbytes))
    mt, nt, nacc = spec.mt, spec.nt, 1 if int8 else 4
    dot = {"vnni": _dot_vnni, "avx2": _dot_avx2}.get(spec.isa, _dot_generic)
    ntiles = b.udiv(b.add(M, I64(mt - 1)), I64(mt))
    with counted_loop(b, lo, hi, nt, "n") as n0:
        ns = [b.select(b.icmp_signed("<", v, hi), v, b.sub(hi, I64(1)))
              for v in (b.add(n0, I64(u)) for u in range(nt))]
        wrows = [b.gep(w, [b.mul(v, rowb)], inbounds=True) for v in ns]
        with counted_loop(b, I64(0), ntiles, 1, "tile") as tile:
            rows = [b.select(b.icmp_unsigned("<", r, M), r, b.sub(M, I64(1)))
                    for r in (b.add(b.mul(tile, I64(mt)), I64(t)) for t in range(mt))]
            acc, off = _block_loop(b, fn, spec, f, nb, ncx, wrows, rows, nacc, dot,
                                   (xq, xd, xs) if int8 else x)
            for u in range(nt):
                n_ok = b.icmp_signed("<", b.add(n0, I64(u)), hi)
                for t in range(mt):
                    total = acc[u][t][0]
                    for a in acc[u][t][1:]:
                        total = b.fadd(total, a)
                    v = b.fadd(_tree_sum(b, total), off[u][t])
                    r = b.add(b.mul(tile, I64(mt)), I64(t))
                    with b.if_then(b.and_(n_ok, b.icmp_unsigned("<", r, M))):
                        b.store(v, b.gep(out, [b.add(b.mul(r, N), ns[u])], inbounds=True))
    b.ret_void()
    return str(m)


def _block_loop(b, fn, spec, f, nb, ncx, wrows, rows, nacc, dot, act):
    """The loop over the blocks of nt weight rows x mt activation rows; returns the final
    accumulators acc[u][t][k] (<8 x float>) and additive terms off[u][t] (float)."""
    int8 = spec.path == "int8"
    nt, mt = len(wrows), len(rows)
    pre = b.block
    head, body, done = (fn.append_basic_block(f"blk.{s_}") for s_ in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    blk = b.phi(I64, "blk")
    blk.add_incoming(I64(0), pre)
    acc = [[[b.phi(V8F) for _ in range(nacc)] for _ in range(mt)] for _ in range(nt)]
    off = [[b.phi(F32) for _ in range(mt)] for _ in range(nt)]
    for ph in _flat(acc):
        ph.add_incoming(ir.Constant(V8F, [0.0] * 8), pre)
    for ph in _flat(off):
        ph.add_incoming(ir.Constant(F32, 0.0), pre)
    b.cbranch(b.icmp_signed("<", blk, nb), body, done)
    b.position_at_end(body)
    new_acc = [[list(r) for r in u] for u in acc]
    new_off = [list(u) for u in off]
    for c in range(f.chunks):
        cx = b.add(b.mul(blk, I64(f.chunks)), I64(c))
        if int8:
            xq, xd, xs = act
            ys = [b.add(b.mul(r, ncx), cx) for r in rows]
            yq = [b.load(b.gep(xq, [at], inbounds=True), align=1) for at in ys]
            dx = [b.load(b.gep(xd, [at], inbounds=True)) for at in ys]
            sx = [None] * mt
        else:
            ats = [b.mul(b.add(b.mul(r, ncx), cx), I64(4)) for r in rows]
            xv = [[b.load(b.gep(act, [b.add(at, I64(k))], inbounds=True), align=4) for k in range(4)] for at in ats]
        for u in range(nt):
            bp = b.gep(wrows[u], [b.mul(blk, I64(f.nbytes))], inbounds=True)
            if int8:
                vals, signed, (s0, s1), coef = chunk(b, spec.fmt, bp, c, spec.centred)
                lanes = _lanes(b, s0, s1)
                for t in range(mt):
                    prod = b.sitofp(dot(b, vals, yq[t], signed), V8F)
                    new_acc[u][t][0] = _fma(b, prod, _lane_scales(b, s0, lanes, dx[t]), new_acc[u][t][0])
                    if coef is not None:
                        if sx[t] is None:
                            sx[t] = b.load(b.gep(xs, [ys[t]], inbounds=True))
                        new_off[u][t] = _fma(b, coef, sx[t], new_off[u][t])
            else:
                parts = chunk_floats(b, spec.fmt, bp, c)
                for t in range(mt):
                    for k in range(4):
                        new_acc[u][t][k] = _fma(b, parts[k], xv[t][k], new_acc[u][t][k])
    latch = b.block
    blk.add_incoming(b.add(blk, I64(1)), latch)
    for ph, v in zip(_flat(acc), _flat(new_acc)):
        ph.add_incoming(v, latch)
    for ph, v in zip(_flat(off), _flat(new_off)):
        ph.add_incoming(v, latch)
    b.branch(head)
    b.position_at_end(done)
    return acc, off


def _flat(nested):
    out = []
    for v in nested:
        out.extend(_flat(v) if isinstance(v, list) else [v])
    return out


_BUILDERS = {QActSpec: (build_act, "qact"), QMatSpec: (build, "qmatmul")}


def _build(spec):
    fn, name = _BUILDERS[type(spec)]
    return fn(spec, name), name


_kernels = jit.KernelCache(_build, KERNEL_FN)
for _cls in _BUILDERS:
    registry.register(_cls, lambda spec: _build(spec)[0], _kernels)


def act_kernel():
    spec = QActSpec()
    return spec, _kernels(spec)


def kernel(fmt: str, path: str, isa: str, mt: int, nt: int, centred: bool = False):
    spec = QMatSpec(fmt, path, isa if path == "int8" else "none", int(mt), int(nt), bool(centred))
    return spec, _kernels(spec)
