"""The bf16 pair (dot-product instruction) form of the tiled GEMM (codegen/gemm_pairs.py):
chosen where the host has AVX512-BF16, and against NumPy's f32 product on every packing path
(row-major, transposed and strided operands, odd k, partial panels, zero sizes), special
values, epilogue fusion, shared-B at two threads, and the f32 form on the same inputs (with the
AMX form, which would take the tiled bf16 GEMM on an AMX host, off)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import lazycandle as lc
from lazycandle import dtype as D
from lazycandle.codegen import gemm, gemm_pairs, jit
from lazycandle.runtime import matmul as MM

BF = ml_dtypes.bfloat16
HAS_PAIRS = gemm_pairs.usable(D.bf16, gemm.choose_tile(D.bf16)[2])


@pytest.fixture(autouse=True)
def no_amx(monkeypatch):
    """These are the pair form's tests: on an AMX host the tiled bf16 GEMM runs on tiles
    (tests/test_matmul_amx.py) unless told not to."""
    monkeypatch.setenv("LAZYCANDLE_AMX", "off")
    lc.clear_caches()
    yield
    monkeypatch.delenv("LAZYCANDLE_AMX")
    lc.clear_caches()


@pytest.fixture
def tiled():
    before = lc.get_matmul_backend()
    lc.set_matmul_backend("tiled")
    yield
    lc.set_matmul_backend(before)


def bf16_data(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(BF)


def expect(a, b):
    """NumPy's f32 product of the bf16 operands, in f64 (what the result rounds once from)."""
    return a.astype(np.float64) @ b.astype(np.float64)


def assert_rounded_once(got, want):
    """Each element within one bf16 unit in the last place of the f64 product."""
    got = got.astype(np.float64)
    unit = np.maximum(np.abs(want), 1e-30) * 2.0 ** -7
    rms = np.sqrt(np.mean(want ** 2)) if want.size else 0.0
    np.testing.assert_array_less(np.abs(got - want), unit + 1e-6 * rms)


def test_pair_form_follows_the_host():
    spec = gemm.tiled_spec(D.bf16)
    assert spec.pairs == (jit.has_feature("avx512bf16") and spec.vw == 16)
    assert not gemm.tiled_spec(D.f32).pairs and not gemm.tiled_spec(D.f16).pairs
    if spec.pairs:
        assert "pair" in spec.describe() and "pairs" in spec.key


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 70), (14, 4, 32), (15, 257, 31), (129, 200, 65),
                                   (64, 33, 64), (3, 64, 100), (40, 1, 40), (5, 0, 7), (0, 6, 5)])
@pytest.mark.parametrize("layout", ["rows", "a_t", "b_t", "strided"])
def test_bf16_tiled_matches_numpy(tiled, m, k, n, layout):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a, b = bf16_data(rng, (m, k)), bf16_data(rng, (k, n))
    ta, tb = lc.tensor(a), lc.tensor(b)
    if layout == "a_t":
        ta = lc.tensor(np.ascontiguousarray(a.T)).t()
    elif layout == "b_t":
        tb = lc.tensor(np.ascontiguousarray(b.T)).t()
    elif layout == "strided":       # neither stride of A or B is 1: the guarded pair loop
        big_a, big_b = bf16_data(rng, (2 * m + 1, 3 * k + 1)), bf16_data(rng, (2 * k + 1, 3 * n + 1))
        a, b = big_a[::2, ::3][:m, :k], big_b[::2, ::3][:k, :n]
        ta, tb = lc.tensor(big_a)[::2, ::3][:m, :k], lc.tensor(big_b)[::2, ::3][:k, :n]
    got = (ta @ tb).numpy()
    assert got.dtype == BF and got.shape == (m, n)
    assert_rounded_once(got, expect(a, b))


def test_bf16_special_values(tiled):
    a = np.ones((16, 6), BF)
    b = np.ones((6, 40), BF)
    a[0, 0], b[0, 1] = np.inf, 0.0                 # inf * 0: NaN in column 1 of row 0
    a[1, 3] = np.nan                               # a NaN row
    b[5, 7] = -np.inf                              # -inf in column 7 of every other row
    a[2, 5] = 0.0                                  # ... but row 2 multiplies it by 0: NaN
    got = (lc.tensor(a) @ lc.tensor(b)).numpy().astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])


def test_bf16_large_values_and_cancellation(tiled):
    rng = np.random.default_rng(3)
    a = bf16_data(rng, (33, 130), 1e18)
    b = bf16_data(rng, (130, 47), 1e18)
    assert_rounded_once((lc.tensor(a) @ lc.tensor(b)).numpy(), expect(a, b))
    x = bf16_data(rng, (20, 64))
    c = np.concatenate([x, -x], axis=1)            # every row cancels to 0 exactly
    ones = np.ones((128, 33), BF)
    np.testing.assert_array_equal((lc.tensor(c) @ lc.tensor(ones)).numpy().astype(np.float32), 0.0)


def test_bf16_epilogue_and_batches(tiled):
    rng = np.random.default_rng(4)
    x, w, bias = bf16_data(rng, (3, 37, 70)), bf16_data(rng, (70, 45)), bf16_data(rng, (45,))
    got = (lc.tensor(x) @ lc.tensor(w) + lc.tensor(bias)).relu().numpy()
    prod = (x.astype(np.float64) @ w.astype(np.float64)).astype(BF).astype(np.float64)
    want = np.maximum(prod + bias.astype(np.float64), 0)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2 ** -6, atol=2 ** -6)


@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_shared_b_and_threads(tiled, threads):
    rng = np.random.default_rng(5)
    a, b = bf16_data(rng, (512, 300)), bf16_data(rng, (300, 260))
    before = lc.get_num_threads()
    lc.set_num_threads(threads)
    try:
        got = (lc.tensor(a) @ lc.tensor(b)).numpy()
    finally:
        lc.set_num_threads(before)
    assert_rounded_once(got, expect(a, b))


@pytest.mark.skipif(not HAS_PAIRS, reason="host without AVX512-BF16: the f32 form is the only one")
def test_pair_and_f32_forms_agree(tiled, monkeypatch):
    rng = np.random.default_rng(6)
    a, b = bf16_data(rng, (70, 515)), bf16_data(rng, (515, 90))
    pairs = (lc.tensor(a) @ lc.tensor(b)).numpy().astype(np.float64)
    monkeypatch.setattr(gemm_pairs, "usable", lambda dt, vw: False)
    monkeypatch.setattr(MM, "_tile_kernels", {})
    monkeypatch.setattr(MM, "_plans", {})
    assert not MM._tile_kernel(D.bf16)[0].pairs
    plain = (lc.tensor(a) @ lc.tensor(b)).numpy().astype(np.float64)
    want = expect(a, b)
    assert_rounded_once(pairs, want)
    assert_rounded_once(plain, want)
    assert np.mean(pairs != plain) < 0.05           # the two round the same f32 sums but for ties


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 70), n=st.integers(1, 70), ta=st.booleans(), tb=st.booleans())
def test_bf16_random_shapes(m, k, n, ta, tb):
    rng = np.random.default_rng(m * 7 + k * 11 + n)
    a, b = bf16_data(rng, (m, k)), bf16_data(rng, (k, n))
    la = lc.tensor(np.ascontiguousarray(a.T)).t() if ta else lc.tensor(a)
    lb = lc.tensor(np.ascontiguousarray(b.T)).t() if tb else lc.tensor(b)
    before = lc.get_matmul_backend()
    lc.set_matmul_backend("tiled")
    try:
        got = (la @ lb).numpy()
    finally:
        lc.set_matmul_backend(before)
    assert_rounded_once(got, expect(a, b))


# ---- the small-m kernel's x @ w.T form (codegen/gemm_skinny.py "t") on the same instruction ----
def weight(w_kn, form):
    """The (k, n) weight as the form stores it: "t" w (n, k) row-major used as w.T, "n" w itself."""
    return lc.tensor(np.ascontiguousarray(w_kn.T)).t() if form == "t" else lc.tensor(w_kn)


def skinny_plan(m, k, n, form):
    from lazycandle.runtime import matmul_skinny as SK
    x = lc.tensor(np.zeros((m, k), BF))
    return SK.SkinnyPlan(MM.geometry(x._node.layout, weight(np.zeros((k, n), BF), form)._node.layout, D.bf16), 1)


@pytest.mark.parametrize("form", ["t", "n"])
def test_skinny_pair_form_follows_the_host(form):
    spec = skinny_plan(4, 64, 32, form).spec
    assert spec.layout == form and spec.pairs == HAS_PAIRS
    if HAS_PAIRS:
        assert "pair" in spec.describe()


@pytest.mark.parametrize("form", ["t", "n"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 31, 7), (1, 32, 5), (2, 33, 9), (8, 768, 96), (16, 100, 31),
                                   (5, 1000, 40), (3, 65, 70), (4, 0, 6), (7, 2, 33)])
def test_skinny_bf16_matches_numpy(form, m, k, n):
    rng = np.random.default_rng(m * 100 + k + n)
    x, w, bias = bf16_data(rng, (m, k)), bf16_data(rng, (k, n)), bf16_data(rng, (n,))
    before = lc.get_matmul_backend()
    lc.set_matmul_backend("auto")
    try:
        got = (lc.tensor(x) @ weight(w, form)).numpy()
        fused = (lc.tensor(x) @ weight(w, form) + lc.tensor(bias)).numpy()
    finally:
        lc.set_matmul_backend(before)
    want = x.astype(np.float64) @ w.astype(np.float64)
    assert_rounded_once(got, want)
    with_bias = want.astype(BF).astype(np.float64) + bias.astype(np.float64)
    np.testing.assert_allclose(fused.astype(np.float64), with_bias, rtol=2 ** -6, atol=2 ** -6)


@pytest.mark.parametrize("form", ["t", "n"])
def test_skinny_bf16_special_values(form):
    x = np.ones((3, 41), BF)
    w = np.ones((41, 5), BF)
    x[0, 39] = np.nan                  # "t": in the masked k tail of the second 32-wide step
    w[0, 1], x[1, 0] = np.inf, 0.0     # inf * 0
    w[17, 2] = -np.inf
    w[40, 4] = np.nan                  # "n": the odd k's last row, paired with zeros
    got = (lc.tensor(x) @ weight(w, form)).numpy().astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = x.astype(np.float32) @ w.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])


@pytest.mark.parametrize("form", ["t", "n"])
def test_skinny_widening_form_still_serves_hosts_without_the_instruction(form, monkeypatch):
    # what a host without AVX512-BF16 runs: the same shapes through the f32-widening kernel
    rng = np.random.default_rng(9)
    x, w = bf16_data(rng, (5, 67)), bf16_data(rng, (67, 40))
    monkeypatch.setattr(gemm_pairs, "usable", lambda dt, vw: False)
    monkeypatch.setattr(MM, "_plans", {})
    assert not skinny_plan(5, 67, 40, form).spec.pairs
    prog = lc.compile([lc.placeholder("x", x.shape, lc.bf16) @ (
        lc.placeholder("w", (40, 67), lc.bf16).t() if form == "t" else lc.placeholder("w", w.shape, lc.bf16))])
    got = prog.run(x=x, w=np.ascontiguousarray(w.T) if form == "t" else w)[0]
    assert "small-m" in prog.dump("schedule")
    specs = [p.spec for p in MM._plans.values() if hasattr(p, "spec")]
    assert specs and not any(sp.pairs for sp in specs)
    assert_rounded_once(got, expect(x, w))
