"""GGML block formats: lc.quantize / QTensor.dequantize / lc.qmatmul against a NumPy reference
of llama.cpp's reference quantizers (written here from ggml-quants.c's definitions, in f32 and
sequential order), and against the `gguf` package's quants when it is installed."""
import numpy as np
import pytest

import lazycandle as lc
from lazycandle import qtensor as Q

f32 = np.float32
KINDS = ["q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k"]
BLOCK = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q4_k": 256, "q6_k": 256}


# ---- NumPy reference (ggml-quants.c, quantize_row_*_ref) ------------------------------------
def _half(v):
    return np.array([v], np.float32).astype(np.float16).view(np.uint8).tobytes()


def _h2f(v):
    return f32(np.float16(v))


def _nearest_int(v):
    v = np.asarray(v, f32) + f32(12582912.0)
    return (v.view(np.int32) & 0x7FFFFF) - 0x400000


def _seqsum(a):
    a = np.asarray(a, f32)
    return np.add.accumulate(a)[-1] if a.size else f32(0)


def _first_absmax(x):
    amax, mx = f32(0), f32(0)
    for v in x:
        if amax < abs(v):
            amax, mx = abs(v), v
    return amax, mx


def _ref_block32(x, kind):
    if kind == "q8_0":
        d = f32(np.abs(x).max()) / f32(127)
        idv = f32(1) / d if d else f32(0)
        v = x * idv
        t = np.trunc(v)
        q = t + np.sign(v) * (np.abs(v - t) >= f32(0.5))          # roundf: halves away from zero
        return _half(d) + q.astype(np.int8).tobytes()
    if kind in ("q4_0", "q5_0"):
        bits = 4 if kind == "q4_0" else 5
        _, mx = _first_absmax(x)
        d = mx / f32(-(1 << (bits - 1)))
        idv = f32(1) / d if d else f32(0)
        q = np.minimum((1 << bits) - 1, np.trunc(x * idv + f32((1 << (bits - 1)) + 0.5)).astype(np.int8)).astype(np.uint8)
        qs = (q[:16] & 0xF) | ((q[16:] & 0xF) << 4)
        if bits == 4:
            return _half(d) + qs.tobytes()
        qh = 0
        for j in range(16):
            qh |= ((int(q[j]) >> 4) & 1) << j
            qh |= ((int(q[j + 16]) >> 4) & 1) << (j + 16)
        return _half(d) + qh.to_bytes(4, "little") + qs.tobytes()
    lo, hi = f32(x.min()), f32(x.max())
    d = (hi - lo) / f32(15)
    idv = f32(1) / d if d else f32(0)
    q = np.minimum(15, np.trunc((x - lo) * idv + f32(0.5)).astype(np.int8)).astype(np.uint8)
    return _half(d) + _half(lo) + ((q[:16] & 0xF) | (q[16:] << 4)).tobytes()


def _make_qkx2(x, w, nmax=15, rmin=-1.0, rdelta=0.1, nstep=20):
    mn, mx = f32(x.min()), f32(x.max())
    sum_w, sum_x = _seqsum(w), _seqsum(w * x)
    if mn > 0:
        mn = f32(0)
    if mx == mn:
        return f32(0), np.zeros(32, np.int64), -mn
    iscale = f32(nmax) / (mx - mn)
    scale = f32(1) / iscale
    L = np.clip(_nearest_int(iscale * (x - mn)), 0, nmax)
    diff = scale * L.astype(f32) + mn - x
    best = _seqsum(w * (diff * diff))
    for k in range(nstep + 1):
        iscale = (f32(rmin) + f32(rdelta) * f32(k) + f32(nmax)) / (mx - mn)
        l = np.clip(_nearest_int(iscale * (x - mn)), 0, nmax)
        lf = l.astype(f32)
        sl, sl2, sxl = _seqsum(w * lf), _seqsum(w * lf * lf), _seqsum(w * lf * x)
        D = sum_w * sl2 - sl * sl
        if D > 0:
            ts = (sum_w * sxl - sum_x * sl) / D
            tm = (sl2 * sum_x - sl * sxl) / D
            if tm > 0:
                tm, ts = f32(0), sxl / sl2
            diff = ts * lf + tm - x
            mad = _seqsum(w * (diff * diff))
            if mad < best:
                L, best, scale, mn = l, mad, ts, tm
    return scale, L, -mn


def _ref_q4_k(x):
    L = np.zeros(256, np.int64)
    scales, mins = np.zeros(8, f32), np.zeros(8, f32)
    for j in range(8):
        xj = x[32 * j:32 * j + 32]
        av_x = np.sqrt(_seqsum(xj * xj) / f32(32))
        scales[j], L[32 * j:32 * j + 32], mins[j] = _make_qkx2(xj, av_x + np.abs(xj))
    ms, mm = f32(max(f32(0), scales.max())), f32(max(f32(0), mins.max()))
    inv_s = f32(63) / ms if ms > 0 else f32(0)
    inv_m = f32(63) / mm if mm > 0 else f32(0)
    ls = np.minimum(63, _nearest_int(inv_s * scales) & 0xFF)
    lm = np.minimum(63, _nearest_int(inv_m * mins) & 0xFF)
    sc = np.zeros(12, np.int64)
    for j in range(8):
        if j < 4:
            sc[j], sc[j + 4] = ls[j], lm[j]
        else:
            sc[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4)
            sc[j - 4] |= (ls[j] >> 4) << 6
            sc[j] |= (lm[j] >> 4) << 6
    d, dmin = ms / f32(63), mm / f32(63)
    for j in range(8):
        dj = _h2f(d) * f32(ls[j])
        if dj:
            dm = _h2f(dmin) * f32(lm[j])
            L[32 * j:32 * j + 32] = np.clip(_nearest_int((x[32 * j:32 * j + 32] + dm) / dj), 0, 15)
    qs = np.concatenate([L[64 * p:64 * p + 32] | (L[64 * p + 32:64 * p + 64] << 4) for p in range(4)])
    return _half(d) + _half(dmin) + sc.astype(np.uint8).tobytes() + qs.astype(np.uint8).tobytes()


def _make_qx(x, nmax=32):
    amax, mx = f32(0), f32(0)
    for v in x:
        if abs(v) > amax:
            amax, mx = abs(v), v
    if amax < f32(1e-15):
        return f32(0), np.zeros(16, np.int64)

    def sums(iscale):
        l = np.clip(_nearest_int(iscale * x), -nmax, nmax - 1)
        lf, w = l.astype(f32), x * x
        return l, _seqsum(w * x * lf), _seqsum(w * lf * lf)
    l, slx, sl2 = sums(f32(-nmax) / mx)
    L = l + nmax
    scale = slx / sl2 if sl2 != 0 else f32(0)
    best = scale * slx
    for k in range(-9, 10):
        if k:
            l, slx, sl2 = sums(-(f32(nmax) + f32(0.1) * f32(k)) / mx)
            if sl2 > 0 and slx * slx > best * sl2:
                L, scale = l + nmax, slx / sl2
                best = scale * slx
    return scale, L


def _ref_q6_k(x):
    L = np.zeros(256, np.int64)
    scales = np.zeros(16, f32)
    for ib in range(16):
        scales[ib], L[16 * ib:16 * ib + 16] = _make_qx(x[16 * ib:16 * ib + 16])
    i = int(np.argmax(np.abs(scales)))        # first of the largest magnitude
    max_scale = scales[i]
    if abs(max_scale) < f32(1e-15):
        return bytes(210)
    iscale = f32(-128) / max_scale
    d = f32(1) / iscale
    sc = np.minimum(127, _nearest_int(iscale * scales)).astype(np.int8)
    for j in range(16):
        dj = _h2f(d) * f32(sc[j])
        if dj:
            L[16 * j:16 * j + 16] = np.clip(_nearest_int(x[16 * j:16 * j + 16] / dj), -32, 31) + 32
    ql, qh = np.zeros(128, np.int64), np.zeros(64, np.int64)
    for h in range(2):
        q = [L[128 * h + 32 * k:128 * h + 32 * k + 32] for k in range(4)]
        ql[64 * h:64 * h + 32] = (q[0] & 0xF) | ((q[2] & 0xF) << 4)
        ql[64 * h + 32:64 * h + 64] = (q[1] & 0xF) | ((q[3] & 0xF) << 4)
        qh[32 * h:32 * h + 32] = sum((q[k] >> 4) << (2 * k) for k in range(4))
    return ql.astype(np.uint8).tobytes() + qh.astype(np.uint8).tobytes() + sc.tobytes() + _half(d)


def reference_bytes(x, kind):
    x = np.asarray(x, f32).reshape(-1, BLOCK[kind])
    fn = {"q4_k": _ref_q4_k, "q6_k": _ref_q6_k}.get(kind, lambda b: _ref_block32(b, kind))
    return b"".join(fn(b) for b in x)


def _data(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 4.0, shape[:-1] + (1,))).astype(f32)
    flat = x.reshape(-1)
    flat[:32] = 0                                    # an all-zero block
    flat[32:64] = 1.5                                # a constant block
    flat[64:96] = rng.integers(-3, 4, 32) * f32(0.5)   # ties (x.5 after scaling) and repeated maxima
    return x


# ---- quantize / dequantize --------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_bytes_match_reference(kind):
    x = _data((3, 512), seed=KINDS.index(kind))
    q = lc.quantize(lc.tensor(x), kind)
    assert isinstance(q, lc.QTensor) and q.shape == (3, 512) and q.kind == kind
    ref = reference_bytes(x, kind)
    assert q.nbytes == len(ref)
    got = np.frombuffer(q.data(), np.uint8)
    bad = np.flatnonzero(got != np.frombuffer(ref, np.uint8))
    assert bad.size == 0, f"{kind}: {bad.size} bytes differ, first at {bad[:8]}"


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_matches_definition_and_gguf(kind):
    x = _data((2, 3, 256), seed=7)
    q = lc.quantize(lc.tensor(x), kind)
    y = q.dequantize()
    assert y.dtype == lc.f32 and y.shape == (2, 3, 256)
    bound = {"q8_0": 0.01, "q6_k": 0.04, "q5_0": 0.07, "q4_0": 0.15, "q4_1": 0.1, "q4_k": 0.1}[kind]
    scale = np.abs(x).max(axis=-1, keepdims=True) + 1e-30
    assert (np.abs(y.numpy() - x) / scale).max() < bound
    gguf = pytest.importorskip("gguf")
    from gguf import quants
    qt = getattr(gguf.GGMLQuantizationType, kind.upper())
    raw = np.frombuffer(q.data(), np.uint8).reshape(6, -1)
    np.testing.assert_array_equal(y.numpy().reshape(6, 256), quants.dequantize(raw, qt))


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1", "q5_0"])
def test_bytes_match_gguf_package(kind):
    gguf = pytest.importorskip("gguf")
    from gguf import quants
    x = _data((4, 1024), seed=3)
    qt = getattr(gguf.GGMLQuantizationType, kind.upper())
    got = np.frombuffer(lc.quantize(lc.tensor(x), kind).data(), np.uint8)
    np.testing.assert_array_equal(got, quants.quantize(x, qt).reshape(-1))


def test_quantize_dtypes_and_shapes():
    x = _data((2, 64))
    for dt in (lc.f16, lc.bf16, lc.f64):
        t = lc.tensor(x).to_dtype(dt)
        want = lc.quantize(t.to_dtype(lc.f32), "q8_0").data()
        assert lc.quantize(t, "q8_0").data() == want
    assert lc.quantize(lc.tensor(x)[:, :32], "q4_0").shape == (2, 32)          # a strided view
    empty = lc.quantize(lc.zeros((0, 64)), "q4_0")
    assert empty.nbytes == 0 and empty.dequantize().shape == (0, 64)


def test_bad_inputs():
    with pytest.raises(lc.UnsupportedDTypeForOp):
        lc.quantize(lc.tensor(np.ones((2, 32), np.int32)), "q8_0")
    with pytest.raises(lc.ShapeMismatch, match=r"\(4, 100\)"):
        lc.quantize(lc.zeros((4, 100)), "q4_0")
    with pytest.raises(lc.ShapeMismatch, match="256"):
        lc.quantize(lc.zeros((4, 32)), "q4_k")
    with pytest.raises(ValueError, match="q3_x"):
        lc.quantize(lc.zeros((4, 32)), "q3_x")
    q = lc.quantize(lc.zeros((4, 64)), "q8_0")
    with pytest.raises(lc.ShapeMismatch):
        lc.qmatmul(lc.zeros((2, 32)), q)
    with pytest.raises(lc.UnsupportedDTypeForOp):
        lc.qmatmul(lc.tensor(np.ones((2, 64), np.int32)), q)


# ---- qmatmul --------------------------------------------------------------------------------
PATHS = ["int8", "int8-avx2", "int8-generic", "f32"]


@pytest.fixture
def path():
    old = Q.get_qmatmul_path()
    yield Q.set_qmatmul_path
    Q.set_qmatmul_path(old)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("p", PATHS)
def test_qmatmul_close_to_dequantized(kind, p, path):
    path(p)
    rng = np.random.default_rng(1)
    K = 512
    w = _data((37, K), seed=5)
    q = lc.quantize(lc.tensor(w), kind)
    wd = q.dequantize().numpy()
    for lead in [(1,), (5,), (2, 3)]:
        x = rng.standard_normal(lead + (K,)).astype(f32)
        y = lc.qmatmul(lc.tensor(x), q)
        assert y.shape == lead + (37,) and y.dtype == lc.f32
        ref = x @ wd.T
        err = np.abs(y.numpy() - ref).max() / np.abs(ref).max()
        assert err < (2e-2 if p.startswith("int8") else 1e-5), (lead, err)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("p", PATHS)
def test_qmatmul_nan_spreads_only_where_it_touches(kind, p, path):
    path(p)
    bs = BLOCK[kind]
    w = _data((8, 2 * bs), seed=2)
    w[3, bs + 7] = np.nan                               # weight row 3, its 2nd block
    q = lc.quantize(lc.tensor(w), kind)
    d = q.dequantize().numpy()
    assert np.isnan(d[3, bs:]).all() and not np.isnan(np.delete(d, 3, 0)).any() and not np.isnan(d[3, :bs]).any()
    x = np.ones((3, 2 * bs), f32)
    x[1, 5] = np.nan                                    # activation row 1
    y = lc.qmatmul(lc.tensor(x), q).numpy()
    expect = np.zeros((3, 8), bool)
    expect[:, 3] = True
    expect[1, :] = True
    np.testing.assert_array_equal(np.isnan(y), expect)


def test_qmatmul_bf16_input_and_path_switch(path):
    w = _data((16, 64), seed=4)
    q = lc.quantize(lc.tensor(w), "q8_0")
    x = lc.tensor(np.random.default_rng(0).standard_normal((2, 64)).astype(f32))
    y = lc.qmatmul(x.to_dtype(lc.bf16), q)
    assert y.dtype == lc.bf16
    with pytest.raises(ValueError):
        path("avx9")


def test_qmatmul_is_a_lazy_graph_node():
    rng = np.random.default_rng(6)
    w = _data((24, 64), seed=6)
    q = lc.quantize(lc.tensor(w), "q4_0")
    x = rng.standard_normal((3, 64)).astype(f32)
    bias = rng.standard_normal(24).astype(f32)
    y = lc.qmatmul(lc.tensor(x), q)
    assert y.is_lazy
    z = (y + lc.tensor(bias)).relu()                    # elementwise after it, in the same graph
    ref = np.maximum(lc.qmatmul(lc.tensor(x), q).numpy() + bias, 0)
    np.testing.assert_allclose(z.numpy(), ref, rtol=1e-6, atol=1e-6)
    xt = lc.tensor(x.T.copy()).T                        # a strided view: made contiguous first
    np.testing.assert_allclose(lc.qmatmul(xt, q).numpy(), y.numpy(), rtol=1e-6, atol=1e-6)

    f = lc.jit(lambda a: lc.qmatmul(a, q).relu())
    for s in (0, 1):
        xs = rng.standard_normal((2, 64)).astype(f32) + s
        np.testing.assert_allclose(f(xs), np.maximum(lc.qmatmul(lc.tensor(xs), q).numpy(), 0), rtol=1e-6, atol=1e-6)
    assert lc.qmatmul(lc.zeros((0, 64)), q).shape == (0, 24)


@pytest.mark.parametrize("p", PATHS)
def test_qlinear_chain_runs_inside_the_native_program_at_every_row_count(p, path, monkeypatch):
    """qmatmul (and its int8 activation blocks) are kernel calls of the native program: no
    Python step, one program for every bound row count, results equal the per-kernel path's."""
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    path(p)
    rng = np.random.default_rng(9)
    q1 = lc.quantize(lc.tensor(_data((96, 64), seed=1)), "q4_0")
    q2 = lc.quantize(lc.tensor(_data((64, 96), seed=2)), "q8_0")
    x = lc.placeholder("x", ("n", 64))
    prog = lc.compile([lc.qmatmul(lc.qmatmul(x, q1).silu(), q2) + x])
    for n in (3, 1, 7, 0, 3):
        xv = rng.standard_normal((n, 64)).astype(f32)
        got = prog.run(x=xv)[0]
        ref = lc.qmatmul(lc.qmatmul(lc.tensor(xv), q1).silu(), q2).numpy() + xv
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert "native program" in prog.dump("schedule") and "python step" not in prog.dump("schedule")


@pytest.mark.parametrize("kind", ["q4_0", "q6_k"])
def test_embedding_rows(kind):
    w = _data((10, 256), seed=8)
    q = lc.quantize(lc.tensor(w), kind)
    d = q.dequantize().numpy()
    ids = np.array([[3, 0, 9], [3, 3, 1]])
    e = q.embedding(lc.tensor(ids))
    assert e.shape == (2, 3, 256) and e.dtype == lc.f32
    np.testing.assert_array_equal(e.numpy(), d[ids])
    with pytest.raises(lc.IndexOutOfBounds):
        q.embedding([10])
    with pytest.raises(lc.UnsupportedDTypeForOp):
        q.embedding(np.array([0.5]))


@pytest.mark.parametrize("tile", [(1, 2), (3, 2), (2, 3)])
@pytest.mark.parametrize("kind", ["q4_1", "q6_k"])
def test_qmatmul_other_tiles(kind, tile, monkeypatch):
    """Kernels tiling several weight rows x activation rows (remainders recomputed, not stored)."""
    monkeypatch.setattr(Q, "_TILES", {(True, False): tile, (False, False): tile, (True, True): tile, (False, True): tile})
    rng = np.random.default_rng(9)
    w = _data((37, 256), seed=9)
    q = lc.quantize(lc.tensor(w), kind)
    for m in (1, 5):
        x = rng.standard_normal((m, 256)).astype(f32)
        ref = x @ q.dequantize().numpy().T
        err = np.abs(lc.qmatmul(lc.tensor(x), q).numpy() - ref).max() / np.abs(ref).max()
        assert err < 2e-2


def test_qtensor_from_bytes_and_pickle():
    import pickle
    q = lc.quantize(lc.tensor(_data((4, 64))), "q5_0")
    again = pickle.loads(pickle.dumps(q))
    assert (again.kind, again.shape, again.data()) == (q.kind, q.shape, q.data())
    assert lc.QTensor(q.data(), (4, 64), "q5_0").data() == q.data()
    with pytest.raises(lc.ShapeMismatch):
        lc.QTensor(q.data()[:-1], (4, 64), "q5_0")


def test_take_rows():
    w = _data((6, 64), seed=10)
    q = lc.quantize(lc.tensor(w), "q8_0")
    perm = [5, 0, 3, 3, 1]
    p = q.take_rows(perm)
    assert p.shape == (5, 64) and p.kind == "q8_0"
    np.testing.assert_array_equal(p.dequantize().numpy(), q.dequantize().numpy()[perm])
    with pytest.raises(lc.IndexOutOfBounds):
        q.take_rows([6]).dequantize()


def test_path_choice_follows_cpu_features(path):
    from lazycandle.codegen import jit
    path("auto")
    vnni = jit.has_feature("avxvnni") or (jit.has_feature("avx512vnni") and jit.has_feature("avx512vl"))
    isa = "generic" if not jit.has_feature("avx2") else "vnni" if vnni else "avx2"
    assert Q._choose(1) == ("int8", isa)
    path("int8-avx2")
    assert Q._choose(1) == ("int8", "avx2" if jit.has_feature("avx2") else "generic")
    path("int8-generic")
    assert Q._choose(32) == ("int8", "generic")
    path("f32")
    assert Q._choose(1)[0] == "f32"
    q = lc.quantize(lc.tensor(_data((8, 64))), "q4_0")
    path("auto")
    text = lc.dump(lc.qmatmul(lc.tensor(np.ones((1, 64), f32)), q), stage="schedule")
    assert "qmatmul q4_0 (int8" in text


@pytest.mark.parametrize("kind", KINDS)
def test_int8_dot_paths_give_the_same_bits(kind, path):
    """vpdpbusd (VNNI hosts), pmaddubsw + pmaddwd (AVX2) and plain vector code sum the same
    integers (no pmaddubsw pair can saturate): the outputs are equal bit for bit."""
    rng = np.random.default_rng(4)
    q = lc.quantize(lc.tensor(_data((19, 2 * BLOCK[kind]), seed=8)), kind)
    x = lc.tensor(rng.standard_normal((5, 2 * BLOCK[kind])).astype(f32) * 3)
    got = {}
    for p in ("int8", "int8-avx2", "int8-generic"):
        path(p)
        got[p] = lc.qmatmul(x, q).numpy()
    assert all(np.array_equal(got["int8-generic"], g) for g in got.values())
