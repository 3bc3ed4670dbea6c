"""The AMX form of the bf16 tiled GEMM (codegen/gemm_amx.py): chosen from the host's features
(and Linux's permission) unless LAZYCANDLE_AMX says otherwise, and, with AMX on and forced off,
against NumPy's product of the bf16 operands: odd sizes (m, n, k not multiples of 16 / 32, odd
k), transposed, narrowed and strided operands, batches (broadcast either side), 1 and 2 threads
(the shared-B plan and the split ones), K past one KC block (partial sums in W), epilogues,
special values."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lazycandle as lc
from lazycandle import dtype as D
from lazycandle.codegen import gemm, gemm_amx, jit
from lazycandle.runtime import matmul as MM

BF = ml_dtypes.bfloat16
HAS_AMX = all(jit.has_feature(f) for f in gemm_amx.FEATURES) and gemm_amx.permission() is None


def _use(monkeypatch, mode: str) -> None:
    monkeypatch.setenv("LAZYCANDLE_AMX", mode)
    lc.clear_caches()           # plans and kernels were made under the previous mode


@pytest.fixture(params=["auto", "off"])
def mode(request, monkeypatch):
    """Every test below runs with the host's choice (AMX where it can) and with AMX forced off."""
    before = lc.get_matmul_backend()
    lc.set_matmul_backend("tiled")
    _use(monkeypatch, request.param)
    assert MM._tile_kernel(D.bf16)[0].amx == (HAS_AMX and request.param == "auto")
    yield request.param
    lc.set_matmul_backend(before)
    monkeypatch.delenv("LAZYCANDLE_AMX")
    lc.clear_caches()


def bf16(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(BF)


def assert_rounded_once(got, a, b):
    """Each element within one bf16 unit in the last place of the f64 product (SPEC's bf16
    matmul: f32 accumulation of the exact products, rounded to bf16 once)."""
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = got.astype(np.float64)
    assert got.shape == want.shape
    unit = np.maximum(np.abs(want), 1e-30) * 2.0 ** -7
    rms = np.sqrt(np.mean(want ** 2)) if want.size else 0.0
    np.testing.assert_array_less(np.abs(got - want), unit + 1e-6 * rms)


def with_threads(n, fn):
    before = lc.get_num_threads()
    lc.set_num_threads(n)
    try:
        return fn()
    finally:
        lc.set_num_threads(before)


def test_amx_follows_the_host_and_the_override(monkeypatch):
    _use(monkeypatch, "auto")
    spec = gemm.tiled_spec(D.bf16)
    assert spec.amx == HAS_AMX
    assert not gemm.tiled_spec(D.f32).amx and not gemm.tiled_spec(D.f16).amx
    if spec.amx:
        assert (spec.mr, spec.nr, spec.unroll) == (gemm_amx.MR, gemm_amx.NR, gemm_amx.KSTEP)
        assert "AMX" in spec.describe() and "amx" in spec.key and gemm_amx.status().startswith("on")
    _use(monkeypatch, "off")
    assert not gemm.tiled_spec(D.bf16).amx and "off" in gemm_amx.status()
    _use(monkeypatch, "on")
    if HAS_AMX:
        assert gemm.tiled_spec(D.bf16).amx
    else:
        with pytest.raises(gemm_amx.AMXUnavailable):
            gemm.tiled_spec(D.bf16)
    monkeypatch.setenv("LAZYCANDLE_AMX", "sometimes")
    with pytest.raises(ValueError, match="LAZYCANDLE_AMX"):
        gemm.tiled_spec(D.bf16)
    monkeypatch.delenv("LAZYCANDLE_AMX")
    lc.clear_caches()


def test_info_says_whether_amx_runs(capsys):
    from lazycandle import cli
    cli.main(["info"])
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("amx:")]
    assert line and line[0].split(":", 1)[1].strip() == gemm_amx.status()


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 70), (17, 31, 33), (33, 33, 17), (31, 64, 32), (48, 95, 47),
                                   (65, 200, 100), (100, 1, 3), (5, 0, 7), (0, 6, 5), (3, 6, 0),
                                   (64, 96, 40), (70, 128, 33)])     # k in whole tile steps: A read in place
@pytest.mark.parametrize("layout", ["rows", "a_t", "b_t", "both_t", "strided", "narrowed"])
def test_bf16_matches_numpy(mode, m, k, n, layout):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a, b = bf16(rng, (m, k)), bf16(rng, (k, n))
    ta, tb = lc.tensor(a), lc.tensor(b)
    if layout in ("a_t", "both_t"):
        ta = lc.tensor(np.ascontiguousarray(a.T)).t()
    if layout in ("b_t", "both_t"):
        tb = lc.tensor(np.ascontiguousarray(b.T)).t()
    if layout == "strided":             # no unit stride on either side: the element-wise packing
        big_a, big_b = bf16(rng, (2 * m + 1, 3 * k + 1)), bf16(rng, (2 * k + 1, 3 * n + 1))
        a, b = big_a[::2, ::3][:m, :k], big_b[::2, ::3][:k, :n]
        ta, tb = lc.tensor(big_a)[::2, ::3][:m, :k], lc.tensor(big_b)[::2, ::3][:k, :n]
    if layout == "narrowed":            # windows of wider matrices: row strides past the row
        big_a, big_b = bf16(rng, (m + 3, k + 5)), bf16(rng, (k + 2, n + 9))
        a, b = big_a[2:2 + m, 3:3 + k], big_b[1:1 + k, 4:4 + n]
        ta = lc.tensor(big_a).narrow(0, 2, m).narrow(1, 3, k)
        tb = lc.tensor(big_b).narrow(0, 1, k).narrow(1, 4, n)
    got = (ta @ tb).numpy()
    assert got.dtype == BF
    assert_rounded_once(got, a, b)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", [(520, 301, 400), (300, 130, 700), (96, 3001, 80), (40, 3001, 70), (70, 3072, 50),
                                   (520, 320, 400)])
def test_bf16_threads_and_k_blocks(mode, threads, m, k, n):
    # 520 x 400: the 2-thread shared-B plan; 300 x 700: the split plans; k = 3001: past one KC
    # block (partial sums through W, then rounded once); k = 3072, 320: A read in place (AMX)
    rng = np.random.default_rng(m + k + n + threads)
    a, b = bf16(rng, (m, k)), bf16(rng, (k, n))
    got = with_threads(threads, lambda: (lc.tensor(a) @ lc.tensor(b)).numpy())
    assert_rounded_once(got, a, b)
    plans = [p for p in MM._plans.values() if isinstance(p, MM.TiledPlan) and p.g.m == m]
    assert plans and bool(plans[0].shared_rows) == (threads == 2 and m == 520)
    assert (plans[0].params[gemm.param_index("kc")] < k) == (k > 3000)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("form", ["both", "lhs_broadcast", "rhs_broadcast", "transposed"])
def test_bf16_batched(mode, threads, form):
    rng = np.random.default_rng(7 + threads)
    a, b = bf16(rng, (3, 45, 67)), bf16(rng, (3, 67, 50))
    if form == "lhs_broadcast":
        a = a[:1]
    if form == "rhs_broadcast":
        b = b[:1]
    ta, tb = lc.tensor(a), lc.tensor(b)
    if form == "transposed":
        ta = lc.tensor(np.ascontiguousarray(a.transpose(0, 2, 1))).transpose(1, 2)
        tb = lc.tensor(np.ascontiguousarray(b.transpose(0, 2, 1))).transpose(1, 2)
    got = with_threads(threads, lambda: (ta @ tb).numpy())
    assert_rounded_once(got, a, b)


@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_epilogues(mode, threads):
    rng = np.random.default_rng(11)
    x, w, bias, res = bf16(rng, (2, 70, 90)), bf16(rng, (90, 45)), bf16(rng, (45,)), bf16(rng, (2, 70, 45))
    got = with_threads(threads, lambda: ((lc.tensor(x) @ lc.tensor(w) + lc.tensor(bias)).relu()
                                         + lc.tensor(res)).numpy())
    prod = np.matmul(x.astype(np.float64), w.astype(np.float64)).astype(BF).astype(np.float64)
    act = np.maximum((prod + bias.astype(np.float64)).astype(BF).astype(np.float64), 0)
    want = act + res.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2 ** -6, atol=2 ** -6)


def test_bf16_special_values(mode):
    a = np.ones((40, 70), BF)
    b = np.ones((70, 40), BF)
    a[0, 0], b[0, 1] = np.inf, 0.0                 # inf * 0: NaN in column 1 of row 0
    a[1, 3] = np.nan                               # a NaN row
    b[69, 7] = -np.inf                             # -inf down column 7 (the odd k's last row)
    a[2, 69] = 0.0                                 # ... but row 2 multiplies it by 0: NaN
    a[35, 10] = 1e38                               # overflows to inf in the f32 sum of row 35
    a[35, 11] = 1e38
    got = (lc.tensor(a) @ lc.tensor(b)).numpy().astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = (a.astype(np.float32) @ b.astype(np.float32)).astype(BF).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])


def test_bf16_subnormal_inputs_flush_or_not(mode):
    # AMX (and AVX512-BF16's dot product) treat bf16 subnormals as 0: either way the products
    # of subnormals with 1 stay far under the result's unit, so only the normal terms show
    tiny = np.full((20, 40), 1e-39, np.float32).astype(BF)      # bf16 subnormal
    assert 0 < float(tiny[0, 0]) < 1.2e-38
    a = np.concatenate([tiny, np.ones((20, 1), BF)], axis=1)
    b = np.ones((41, 33), BF)
    got = (lc.tensor(a) @ lc.tensor(b)).numpy().astype(np.float64)
    np.testing.assert_array_equal(got, 1.0)


@pytest.mark.parametrize("m", [1, 5, 17, 40])
@pytest.mark.parametrize("form", ["t", "n"])
def test_bf16_auto_backend_small_m_and_decode_forms(mode, monkeypatch, m, form):
    # under "auto" a small m may run the small-m kernel or the tiled one (measured): both right
    lc.set_matmul_backend("auto")
    rng = np.random.default_rng(m + len(form))
    x, w, bias = bf16(rng, (m, 300)), bf16(rng, (300, 200)), bf16(rng, (200,))
    tw = lc.tensor(np.ascontiguousarray(w.T)).t() if form == "t" else lc.tensor(w)
    got = (lc.tensor(x) @ tw).numpy()
    assert_rounded_once(got, x, w)
    fused = (lc.tensor(x) @ tw + lc.tensor(bias)).numpy().astype(np.float64)
    want = np.matmul(x.astype(np.float64), w.astype(np.float64)).astype(BF).astype(np.float64) + bias.astype(np.float64)
    np.testing.assert_allclose(fused, want, rtol=2 ** -6, atol=2 ** -6)


def test_refused_permission_falls_back(monkeypatch):
    # a kernel that refuses the tile state (or a host without it): the AVX-512 forms, said by info
    monkeypatch.setattr(gemm_amx, "_perm", {"why": "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) refused (errno 22)"})
    real = jit.has_feature
    monkeypatch.setattr(jit, "has_feature", lambda f: f in gemm_amx.FEATURES or real(f))
    _use(monkeypatch, "auto")
    assert not gemm.tiled_spec(D.bf16).amx and "refused" in gemm_amx.status()
    rng = np.random.default_rng(3)
    a, b = bf16(rng, (40, 70)), bf16(rng, (70, 50))
    before = lc.get_matmul_backend()
    lc.set_matmul_backend("tiled")
    try:
        assert_rounded_once((lc.tensor(a) @ lc.tensor(b)).numpy(), a, b)
    finally:
        lc.set_matmul_backend(before)
    _use(monkeypatch, "on")
    with pytest.raises(gemm_amx.AMXUnavailable, match="refused"):
        gemm.tiled_spec(D.bf16)
    monkeypatch.delenv("LAZYCANDLE_AMX")
    lc.clear_caches()
