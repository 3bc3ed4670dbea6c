"""Bit-exact checks of the dtype codecs (lazycandle.codegen.codecs) against NumPy / ml_dtypes.

Each case JIT-compiles a tiny kernel `k(src, dst, n)`: a loop over <W x T> vectors followed by a
scalar tail loop, around one codec call.  W = 8 (vector body + tail) and W = 1 (scalar only).
The full 2^32 float sweep is `-m slow` (and bench/codecs_exhaustive.py)."""
from __future__ import annotations

import ctypes
import functools
import time

import ml_dtypes as md
import numpy as np
import pytest
import llvmlite.ir as ir

from lazycandle.codegen import codecs, jit
from lazycandle.codegen.llvmutil import F16, F32, F64, I8, I16, I64, VOID, vec

# codec -> (ml_dtypes / numpy type, LLVM storage type, numpy view of the storage bits)
CODECS = {
    "half": (np.float16, F16, np.uint16),
    "bf16": (md.bfloat16, I16, np.uint16),
    "f8e4m3": (md.float8_e4m3fn, I8, np.uint8),
    "f6e2m3": (md.float6_e2m3fn, I8, np.uint8),
    "f6e3m2": (md.float6_e3m2fn, I8, np.uint8),
    "f4e2m1": (md.float4_e2m1fn, I8, np.uint8),
    "f8e8m0": (md.float8_e8m0fnu, I8, np.uint8),
}
NP_OF = {F32: np.uint32, F64: np.uint64}
WIDTHS = (8, 1)


def _size(t):
    return {I8: 1, I16: 2, F16: 2, F32: 4, F64: 8}[t]


@functools.lru_cache(maxsize=None)
def build_kernel(op: str, codec: str, width: int, src_ty, dst_ty, **kw):
    """Compile `dst[i] = op(src[i])` (op: decode / encode / roundtrip) and return a callable
    f(src_array, dst_array)."""
    fn_op = getattr(codecs, op)
    m = ir.Module(name=f"codec_{op}_{codec}_{width}")
    m.triple, m.data_layout = jit.triple_and_layout()
    fn = ir.Function(m, ir.FunctionType(VOID, [src_ty.as_pointer(), dst_ty.as_pointer(), I64]), name="k")
    src, dst, n = fn.args
    entry = fn.append_basic_block("entry")
    vhead, vbody, shead, sbody, done = (fn.append_basic_block(x) for x in ("vhead", "vbody", "shead", "sbody", "done"))
    b = ir.IRBuilder(entry)
    b.branch(vhead)

    def body(block, i, w, nxt):
        b.position_at_end(block)
        st, dt = vec(src_ty, w), vec(dst_ty, w)
        ps = b.bitcast(b.gep(src, [i], inbounds=True), st.as_pointer())
        pd = b.bitcast(b.gep(dst, [i], inbounds=True), dt.as_pointer())
        x = b.load(ps, align=_size(src_ty))
        y = fn_op(b, codec, x, **kw)
        assert y.type == dt, (y.type, dt)
        b.store(y, pd, align=_size(dst_ty))
        i2 = b.add(i, I64(w), flags=["nuw", "nsw"])
        b.branch(nxt)
        return i2

    # vector loop: while i + width <= n
    b.position_at_end(vhead)
    vi = b.phi(I64)
    vi.add_incoming(I64(0), entry)
    b.cbranch(b.icmp_signed("<=", b.add(vi, I64(width)), n), vbody, shead)
    vi.add_incoming(body(vbody, vi, width, vhead), vbody)
    # scalar tail
    b.position_at_end(shead)
    si = b.phi(I64)
    si.add_incoming(vi, vhead)
    b.cbranch(b.icmp_signed("<", si, n), sbody, done)
    si.add_incoming(body(sbody, si, 1, shead), sbody)
    b.position_at_end(done)
    b.ret_void()

    cm = jit.compile_ir(str(m), export=["k"], name=m.name)
    cfn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(cm.address("k"))

    def run(a, out):
        assert a.flags.c_contiguous and out.flags.c_contiguous and a.size == out.size
        cfn(a.ctypes.data, out.ctypes.data, a.size)
        return out
    run.module = cm
    return run


def jit_decode(codec, bits, width, to=F32):
    _, sty, view = CODECS[codec]
    out = np.empty(bits.size, NP_OF[to])
    kw = {} if to is F32 else {"to": to}
    return build_kernel("decode", codec, width, sty, to, **kw)(np.ascontiguousarray(bits, view), out)


def jit_encode(codec, x, width, **kw):
    _, sty, view = CODECS[codec]
    src = F64 if x.dtype == np.float64 else F32
    out = np.empty(x.size, view)
    return build_kernel("encode", codec, width, src, sty, **kw)(np.ascontiguousarray(x), out)


def jit_roundtrip(codec, x, width):
    out = np.empty(x.size, np.uint32)
    return build_kernel("roundtrip", codec, width, F32, F32)(np.ascontiguousarray(x, np.float32), out)


def ref_encode(codec, x):
    t, _, view = CODECS[codec]
    with np.errstate(all="ignore"):
        return x.astype(t).view(view)


def ref_roundtrip(codec, x):
    t, _, _ = CODECS[codec]
    with np.errstate(all="ignore"):
        return x.astype(t).astype(np.float32).view(np.uint32)


def assert_bits_equal(got, want, inputs, what):
    bad = np.nonzero(got != want)[0]
    if bad.size:
        fmt = lambda a: [hex(int(v)) for v in a[bad[:8]]]
        inp = inputs.view(np.uint64 if inputs.dtype == np.float64 else np.uint32) if inputs.dtype.kind == "f" else inputs
        pytest.fail(f"{what}: {bad.size} of {got.size} differ; inputs {fmt(inp)} got {fmt(got)} want {fmt(want)}")


# ------------------------------------------------------------------ inputs

NAN32 = [0x7F800001, 0x7F802000, 0x7F801FFF, 0x7FA00000, 0x7FBFFFFF, 0x7FC00000, 0x7FC00001,
         0x7FC02000, 0x7FE00000, 0x7FFFE000, 0x7FFFFFFF, 0x7F900000, 0x7F810000, 0x7FC10000]


def _around(bits32, k=2):
    """u32 patterns and their neighbours within k ulp (unsigned wrap is harmless)."""
    b = np.asarray(bits32, np.int64)
    return np.concatenate([b + d for d in range(-k, k + 1)])


@functools.lru_cache(maxsize=None)
def special_f32(codec) -> np.ndarray:
    """Every finite target value and midpoint, +-2 ulp around each, thresholds, NaNs, inf,
    zeros, f32 subnormals, both signs."""
    t, _, view = CODECS[codec]
    n = 1 << (8 * np.dtype(view).itemsize)
    with np.errstate(all="ignore"):
        vals = np.unique(np.arange(n, dtype=np.uint32).astype(view).view(t).astype(np.float64))
    vals = vals[np.isfinite(vals) & (vals >= 0)]
    mids = (vals[1:] + vals[:-1]) / 2
    top = vals[-1] + (vals[-1] - vals[-2]) / 2                     # overflow midpoint
    pts = np.concatenate([vals, mids, [top, 2 * top, vals[-1] * 2]]).astype(np.float32).view(np.uint32)
    pos = [_around(pts), NAN32, _around([0, 1, 0x7FFFFF, 0x800000, 0x400000, 0x200000, 0x7F7FFFFF, 0x7F800000]),
           np.arange(0, 1 << 12), np.arange(0x400000 - 2048, 0x400000 + 2048)]
    pos = np.concatenate([np.asarray(p, np.int64) for p in pos]) & 0x7FFFFFFF
    allb = np.concatenate([pos, pos | 0x80000000]).astype(np.uint32)
    return np.unique(allb).view(np.float32)


def strided_f32(stride, offset=0) -> np.ndarray:
    return (np.arange(offset, 1 << 32, stride, dtype=np.uint64)).astype(np.uint32).view(np.float32)


@functools.lru_cache(maxsize=None)
def special_f64(codec) -> np.ndarray:
    """Doubles near target values and midpoints: +-1, 2 double ulp, +-2^-30 relative (the cases
    where rounding through float changes the answer), random doubles, NaN payloads, extremes."""
    x32 = special_f32(codec)
    x32 = x32[np.isfinite(x32)].astype(np.float64)
    x = [x32]
    for k in (1, 2):
        x += [np.nextafter(x32, np.inf) if k == 1 else np.nextafter(np.nextafter(x32, np.inf), np.inf),
              np.nextafter(x32, -np.inf) if k == 1 else np.nextafter(np.nextafter(x32, -np.inf), -np.inf)]
    x += [x32 * (1 + 2.0 ** -30), x32 * (1 - 2.0 ** -30), x32 * (1 + 2.0 ** -25), x32 * (1 - 2.0 ** -25)]
    rng = np.random.default_rng(1234)
    r = rng.integers(0, 1 << 63, size=200_000, dtype=np.uint64)
    e = rng.integers(1023 - 150, 1023 + 140, size=r.size).astype(np.uint64)
    x.append(((r & np.uint64((1 << 52) - 1)) | (e << np.uint64(52))).view(np.float64))
    specials = np.array([0x7FF0000000000001, 0x7FF0000020000000, 0x7FF0000000001000, 0x7FF4000000000000,
                         0x7FF8000000000000, 0x7FF8000000000001, 0x7FFFFFFFFFFFFFFF, 0x7FF0040000000000,
                         0x7FF0000000000000, 0, 1, 0x000FFFFFFFFFFFFF, 0x0010000000000000], np.uint64).view(np.float64)
    extremes = np.array([1e-300, 1e300, 1e-45, 1.401298464324817e-45, 7e-46, 3.4028235677973366e38,
                         3.4028235677973362e38, 3.4028234663852886e38, 2.0 ** -149, 2.0 ** -150,
                         2.0 ** -150 * (1 + 2 ** -40), 2.0 ** -127 * (1 + 2 ** -40), 2.0 ** -127 * (1 - 2 ** -40),
                         1 + 2 ** -4 + 2 ** -40, 1 + 2 ** -8 + 2 ** -40, 1 + 2 ** -11 + 2 ** -40, 1.5 - 2 ** -40])
    x += [specials, extremes]
    x = np.concatenate(x)
    return np.concatenate([x, -x])


def rto_f32(x):
    """Test-side reference: double -> float rounded to odd (then one more rounding is exact)."""
    with np.errstate(all="ignore"):
        t = x.astype(np.float32)
        back = t.astype(np.float64)
        bits = t.view(np.uint32).copy()
        inexact = (back != x) & ~np.isnan(x)
        away = np.abs(back) > np.abs(x)
        bits -= (inexact & away).astype(np.uint32)
        bits |= inexact.astype(np.uint32)
    return bits.view(np.float32)


# ------------------------------------------------------------------ tests

@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("codec", CODECS)
def test_decode_all_patterns(codec, width):
    t, _, view = CODECS[codec]
    n = 1 << (8 * np.dtype(view).itemsize)
    bits = np.concatenate([np.arange(n), np.arange(5)]).astype(view)     # + 5: exercises the tail
    want = bits.view(t).astype(np.float32).view(np.uint32)
    assert_bits_equal(jit_decode(codec, bits, width), want, bits, f"decode {codec} w{width}")


@pytest.mark.parametrize("codec", CODECS)
def test_decode_to_f64(codec):
    t, _, view = CODECS[codec]
    n = 1 << (8 * np.dtype(view).itemsize)
    bits = np.arange(n + 3).astype(view)
    want = bits.view(t).astype(np.float64).view(np.uint64)
    assert_bits_equal(jit_decode(codec, bits, 8, to=F64), want, bits, f"decode->f64 {codec}")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("codec", CODECS)
def test_encode_f32_special(codec, width):
    x = special_f32(codec)
    assert_bits_equal(jit_encode(codec, x, width), ref_encode(codec, x), x, f"encode {codec} w{width}")
    assert_bits_equal(jit_roundtrip(codec, x, width), ref_roundtrip(codec, x), x, f"roundtrip {codec} w{width}")


@pytest.mark.parametrize("codec", CODECS)
def test_encode_f32_strided(codec):
    """A 1-in-251 sample of all 2^32 float patterns (17.1M) through the vector kernel, and a
    1-in-1009 sample with another phase through the scalar one."""
    for width, stride, off in ((8, 251, 0), (1, 1009, 77)):
        x = strided_f32(stride, off)
        want = ref_encode_fast(codec, x)
        assert_bits_equal(jit_encode(codec, x, width), want, x, f"encode {codec} w{width}")
        assert_bits_equal(jit_roundtrip(codec, x, width), decode_table(codec)[want], x, f"roundtrip {codec} w{width}")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("codec", CODECS)
def test_encode_f64_like_ml_dtypes(codec, width):
    x = special_f64(codec)
    assert_bits_equal(jit_encode(codec, x, width), ref_encode(codec, x), x, f"encode f64 {codec} w{width}")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("codec", CODECS)
def test_encode_f64_single_rounding(codec, width):
    x = special_f64(codec)
    want = ref_encode(codec, x) if codec == "half" else ref_encode(codec, rto_f32(x))
    got = jit_encode(codec, x, width, single_rounding=True)
    assert_bits_equal(got, want, x, f"encode f64 single {codec} w{width}")


@pytest.mark.parametrize("codec", CODECS)
def test_other_widths(codec):
    """Odd and wide vectors (<5 x ..>, <32 x ..>: split by the backend) give the same bits."""
    t, _, view = CODECS[codec]
    bits = np.arange(1 << (8 * np.dtype(view).itemsize)).astype(view)
    x = special_f32(codec)
    for width in (5, 32):
        assert_bits_equal(jit_decode(codec, bits, width), bits.view(t).astype(np.float32).view(np.uint32), bits, "decode")
        assert_bits_equal(jit_encode(codec, x, width), ref_encode(codec, x), x, f"encode w{width}")
        assert_bits_equal(jit_roundtrip(codec, x, width), ref_roundtrip(codec, x), x, f"roundtrip w{width}")


@pytest.mark.parametrize("codec", CODECS)
def test_no_calls(codec):
    """No libcalls (a raw `fptrunc double to half` would need __truncdfhf2, which the JIT cannot
    resolve) and vector code in the main loop."""
    _, sty, _ = CODECS[codec]
    for op, src, dst, kw in (("decode", sty, F32, {}), ("encode", F32, sty, {}), ("encode", F64, sty, {}),
                             ("encode", F64, sty, {"single_rounding": True}), ("roundtrip", F32, F32, {})):
        asm = build_kernel(op, codec, 8, src, dst, **kw).module.asm()
        assert "call" not in asm, (op, codec, src)
        assert "ymm" in asm, (op, codec, src)


def test_single_rounding_differs_where_expected():
    """Hand-picked doubles just above a tie of the target: through float they tie and round to
    even, rounded once they go up."""
    cases = {"bf16": (1 + 2 ** -8 + 2 ** -40, 0x3F80, 0x3F81), "f8e4m3": (1 + 2 ** -4 + 2 ** -40, 0x38, 0x39),
             "f6e2m3": (1 + 2 ** -4 + 2 ** -40, 0x08, 0x09), "f4e2m1": (1.25 + 2 ** -40, 0x02, 0x03),
             "f6e3m2": (1.125 + 2 ** -40, 0x0C, 0x0D), "f8e8m0": (1.5 - 2 ** -40, 0x80, 0x7F),
             "half": (1 + 2 ** -11 + 2 ** -40, 0x3C01, 0x3C01)}
    for codec, (v, twice, once) in cases.items():
        x = np.array([v], np.float64)
        assert int(jit_encode(codec, x, 1)[0]) == twice == int(ref_encode(codec, x)[0]), codec
        assert int(jit_encode(codec, x, 1, single_rounding=True)[0]) == once, codec


def test_documented_rules():
    """The ml_dtypes behaviours the module docstring states."""
    f = lambda codec, v: [int(u) for u in jit_encode(codec, np.array(v, np.float32), 1)]
    nan, inf = np.nan, np.inf
    assert f("f8e4m3", [nan, -nan, inf, -inf, 464, 464.00003, 448]) == [0x7F, 0xFF, 0x7F, 0xFF, 0x7E, 0x7F, 0x7E]
    assert f("f6e2m3", [nan, -nan, inf, -inf, 100]) == [0x20, 0x00, 0x1F, 0x3F, 0x1F]
    assert f("f4e2m1", [nan, -nan, -inf, 7]) == [0x08, 0x00, 0x0F, 0x07]
    assert f("f8e8m0", [1.5, 3.0, 6.0, 0.0, -1.0, inf, nan, 2.0 ** -127, 2.0 ** -127 * 1.5, 1e-45]) == \
        [0x80, 0x81, 0x82, 0xFF, 0xFF, 0xFF, 0xFF, 0x00, 0x01, 0x00]
    assert f("bf16", [nan, -nan]) == [0x7FC0, 0xFFC0]
    assert [int(u) for u in jit_encode("bf16", np.array([0x7FFFFFFF], np.uint32).view(np.float32), 1)] == [0x7FC0]


@functools.lru_cache(maxsize=None)
def decode_table(codec) -> np.ndarray:
    t, _, view = CODECS[codec]
    with np.errstate(all="ignore"):
        return np.arange(1 << (8 * np.dtype(view).itemsize)).astype(view).view(t).astype(np.float32).view(np.uint32)


def ref_encode_fast(codec, x):
    """ref_encode, except that for half the ranges |x| <= 2^-25 (-> +-0) and 65520 <= |x| <= inf
    (-> +-inf) take those constants and NumPy only checks every 4096th element there: NumPy's
    float -> half costs ~200 ns per element when the result under- or overflows (it raises the
    FP flag each time) against ~5 ns otherwise."""
    if codec != "half":
        return ref_encode(codec, x)
    u = x.view(np.uint32)
    a, sign = u & 0x7FFFFFFF, (u >> 16) & 0x8000
    tiny, huge = a <= 0x33000000, (a >= 0x477FF000) & (a <= 0x7F800000)
    want = np.where(huge, sign | 0x7C00, sign).astype(np.uint16)
    idx = np.nonzero(~(tiny | huge) | (np.arange(x.size) % 4096 == 0))[0]
    want[idx] = ref_encode(codec, x[idx])
    return want


def check_chunk(codec, start, size):
    """Encode and roundtrip the float patterns start .. start+size-1 with the vector kernel and
    compare with the oracle (the roundtrip oracle is the ml_dtypes decode table applied to the
    encode oracle).  Returns (encode mismatches, roundtrip mismatches, examples, seconds in the
    kernels, seconds in the oracle)."""
    x = np.arange(start, start + size, dtype=np.uint64).astype(np.uint32).view(np.float32)
    t0 = time.perf_counter()
    e, r = jit_encode(codec, x, 8), jit_roundtrip(codec, x, 8)
    t1 = time.perf_counter()
    want = ref_encode_fast(codec, x)
    want_rt = decode_table(codec)[want]
    t2 = time.perf_counter()
    be, br = np.nonzero(e != want)[0], np.nonzero(r != want_rt)[0]
    ex = [(hex(int(x.view(np.uint32)[i])), hex(int(e[i])), hex(int(want[i]))) for i in be[:3]]
    ex += [(hex(int(x.view(np.uint32)[i])), hex(int(r[i])), hex(int(want_rt[i]))) for i in br[:3]]
    return be.size, br.size, ex, t1 - t0, t2 - t1


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
def test_encode_f32_exhaustive(codec):
    """All 2^32 float patterns, encode and roundtrip (bench/codecs_exhaustive.py runs the same
    check on two threads and reports timings)."""
    chunk = 1 << 26
    for start in range(0, 1 << 32, chunk):
        be, br, ex, _, _ = check_chunk(codec, start, chunk)
        assert be == br == 0, (codec, hex(start), be, br, ex)
