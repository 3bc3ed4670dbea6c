"""Compile once, run many: a new scalar value (and, for elementwise and reduce kernels, a new
size of the same structure) reuses the compiled kernels; values stay bit-exact."""
import numpy as np
import pytest

import lazycandle as lc
from lazycandle import dtype as D
from lazycandle.codegen import jit


def compiled():
    return jit.stats["compiled"]


def _arange(n, dt):
    return lc.tensor((np.arange(n) % 97 - 40).astype(np.float64).astype(D.as_dtype(dt).numpy), dtype=dt)


def _same_bits(x, y):
    assert x.dtype == y.dtype and x.shape == y.shape
    assert np.array_equal(x.view(np.uint8), y.view(np.uint8))


def test_new_float_scalar_compiles_nothing():
    a = lc.tensor(np.linspace(-5, 5, 1000).astype(np.float32))
    (a * 0.37).numpy()
    before = compiled()
    for i in range(300):
        v = float(i) * 0.731
        np.testing.assert_array_equal((a * v).numpy(), a.numpy() * np.float32(v))
    assert compiled() == before


@pytest.mark.parametrize("dt", ["u8", "u32", "i16", "i32", "i64"])
def test_new_int_scalar_compiles_nothing(dt):
    a = _arange(300, dt)
    ref = a.numpy()
    (a + 3).numpy()
    (a * 3).numpy()
    before = compiled()
    for v in (5, 7, 100, 2 ** 20 + 3, -9):
        npv = np.asarray(v).astype(np.int64).astype(ref.dtype)
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal((a + v).numpy(), ref + npv)
            np.testing.assert_array_equal((a * v).numpy(), ref * npv)
    assert compiled() == before


@pytest.mark.parametrize("dt", ["f16", "bf16", "f64"])
def test_scalar_is_rounded_to_the_dtype_like_a_tensor_operand(dt):
    a = _arange(200, dt) * 0.01
    a.realize()
    counts = []
    for v in (1.2345, 0.1, 1.0 / 3.0, 12345.678, -2.5e-3):
        other = lc.tensor(np.full(a.shape, v), dtype=dt)
        _same_bits((a * v).numpy(), (a * other).numpy())
        _same_bits((v - a).numpy(), (other - a).numpy())
        counts.append(compiled())
    assert len(set(counts)) == 1


def test_u64_scale_bits_survive_packing():
    a = lc.tensor(np.arange(10, dtype=np.int64))
    v = -(2 ** 62) - 12345
    np.testing.assert_array_equal((a + v).numpy(), np.arange(10, dtype=np.int64) + np.int64(v))


def test_full_value_is_a_runtime_scalar():
    lc.full(1.5, (64,)).numpy()
    before = compiled()
    for v in (2.5, -3.25, 1e30):
        np.testing.assert_array_equal(lc.full(v, (64,)).numpy(), np.full(64, v, np.float32))
    assert compiled() == before


def test_where_cond_scalar_branches_are_runtime():
    x = lc.tensor(np.linspace(-1, 1, 100).astype(np.float32))
    m = x > 0.0
    m.where_cond(1.0, x).numpy(), m.where_cond(x, 2.0).numpy()
    before = compiled()
    for t in (3.0, -4.0, 0.5):
        np.testing.assert_array_equal(m.where_cond(t, x).numpy(), np.where(x.numpy() > 0, np.float32(t), x.numpy()))
        np.testing.assert_array_equal(m.where_cond(x, t).numpy(), np.where(x.numpy() > 0, x.numpy(), np.float32(t)))
    assert compiled() == before


def test_clamp_affine_elu_args_are_runtime():
    x = lc.tensor(np.linspace(-3, 3, 101).astype(np.float32))
    xn = x.numpy()
    x.clamp(-1, 1).numpy(), x.affine(2.0, 0.5).numpy(), x.elu(1.0).numpy()
    before = compiled()
    for lo, hi in ((-2.0, 0.5), (0.0, 0.25)):
        np.testing.assert_array_equal(x.clamp(lo, hi).numpy(), np.clip(xn, np.float32(lo), np.float32(hi)))
    for mul, add in ((3.0, -1.0), (0.25, 7.0)):
        fused = (xn.astype(np.float64) * np.float32(mul) + np.float32(add)).astype(np.float32)   # one rounding (fma)
        np.testing.assert_allclose(x.affine(mul, add).numpy(), fused, rtol=1.2e-7)
    ref = x.elu(1.0).numpy()
    for alpha in (0.5, 2.0):
        got = x.elu(alpha).numpy()
        np.testing.assert_array_equal(got[xn >= 0], xn[xn >= 0])
        np.testing.assert_allclose(got[xn < 0], alpha * ref[xn < 0], rtol=1e-6)
    assert compiled() == before


def test_powf_exponent_is_runtime_within_its_class():
    x = lc.tensor(np.concatenate([np.linspace(-3, 3, 61), [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan]])
                  .astype(np.float32))
    xn = x.numpy()
    with np.errstate(all="ignore"):
        for group in ((2.5, 3.7, -1.3), (3.0, 5.0, -7.0), (4.0, -2.0, 6.0), (np.inf, -np.inf, np.nan)):
            (x ** group[0]).numpy()
            before = compiled()
            for e in group:
                got, ref = (x ** e).numpy(), np.power(xn, np.float32(e))
                np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
                np.testing.assert_allclose(got[~np.isnan(ref)], ref[~np.isnan(ref)], rtol=4e-7)
            assert compiled() == before, group


def test_powf_special_exponents_keep_their_exact_code():
    x = lc.tensor(np.array([-2.0, -0.0, 0.0, 3.0, np.inf, -np.inf, np.nan], np.float32))
    xn = x.numpy()
    with np.errstate(all="ignore"):
        for e in (0.0, 1.0, 2.0, -1.0, 0.5):
            _same_bits((x ** e).numpy(), np.power(xn, np.float32(e)))


def test_rewrites_key_on_the_value_class_of_zero():
    """x + (-0.0) is x, x + 0.0 is not (for x = -0.0): the two must not share a plan."""
    x = lc.tensor(np.array([-0.0, 1.0], np.float32))
    _same_bits((x + -0.0).numpy(), np.array([-0.0, 1.0], np.float32))
    _same_bits((x + 0.0).numpy(), np.array([0.0, 1.0], np.float32))
    _same_bits((x - 0.0).numpy(), np.array([-0.0, 1.0], np.float32))
    _same_bits((x * 1.0).numpy(), np.array([-0.0, 1.0], np.float32))
    _same_bits((x * 2.0).numpy(), np.array([-0.0, 2.0], np.float32))


def test_equal_and_different_scalars_in_one_graph():
    a = lc.tensor(np.arange(50, dtype=np.float32))
    an = a.numpy()
    np.testing.assert_array_equal((a * 3.0 + a * 3.0).numpy(), an * 3 + an * 3)
    np.testing.assert_array_equal((a * 3.0 + a * 4.0).numpy(), an * 3 + an * 4)
    np.testing.assert_array_equal((a * 4.0 + a * 4.0).numpy(), an * 4 + an * 4)


def test_reduction_of_a_scaled_input_takes_the_scalar_at_run_time():
    a = lc.tensor(np.arange(64, dtype=np.float32).reshape(4, 16))
    a.affine(2.0, 1.0).sum(-1).numpy()
    before = compiled()
    for mul in (3.0, -0.5):
        np.testing.assert_allclose(a.affine(mul, 1.0).sum(-1).numpy(), (a.numpy() * mul + 1).sum(-1), rtol=1e-6)
        np.testing.assert_allclose((a * mul).max(-1).numpy(), (a.numpy() * mul).max(-1))
    assert compiled() <= before + 1      # max's kernel is new; the values are not


def test_program_keeps_its_scalars():
    x = lc.placeholder("x", (8,), lc.f32)
    p1, p2 = lc.compile(x * 2.0 + 1.0), lc.compile(x * 5.0 + 1.0)
    v = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(p1.run(x=v)[0], v * 2 + 1)
    np.testing.assert_array_equal(p2.run(x=v)[0], v * 5 + 1)


def test_unknown_reduction_kind_raises():
    from lazycandle.ir.ops import reduction
    with pytest.raises(KeyError, match="unknown reduction"):
        reduction("median")


# ---- symbolic sizes -------------------------------------------------------------------------
W = jit.vector_bits() // 32          # f32 lanes of this host
ODD_SIZES = [0, 1, W - 1, W, W + 1, 4 * W - 1, 4 * W + 1, 1000, 4099]


def _chain(x, y):
    return ((x * y + 1.5).exp() - y).maximum(x)


def test_symbolic_size_elementwise_equals_the_same_lanes_of_a_long_run():
    """Lane-wise math does not depend on where a lane sits (body or masked tail), so every
    size must give exactly the first n lanes of a long run's result."""
    rng = np.random.default_rng(3)
    xs, ys = rng.standard_normal(5000).astype(np.float32), rng.standard_normal(5000).astype(np.float32)
    full = _chain(lc.tensor(xs), lc.tensor(ys)).numpy()
    for n in ODD_SIZES:
        got = _chain(lc.tensor(xs[:n]), lc.tensor(ys[:n])).numpy()
        _same_bits(got, full[:n])
        np.testing.assert_array_equal((lc.tensor(xs[:n]) + lc.tensor(ys[:n])).numpy(), xs[:n] + ys[:n])


def test_new_sizes_compile_no_new_kernels():
    rng = np.random.default_rng(4)
    for n in (2, 3):
        _chain(lc.tensor(rng.standard_normal(n).astype(np.float32)), lc.tensor(np.ones(n, np.float32))).numpy()
        lc.tensor(rng.standard_normal((n, 3)).astype(np.float32)).sum(-1).numpy()
        lc.tensor(rng.standard_normal((3, n)).astype(np.float32)).t().exp().numpy()
        lc.tensor(rng.standard_normal((3, n)).astype(np.float32)).exp().numpy()
    before = compiled()
    for n in ODD_SIZES[2:]:
        x = rng.standard_normal(n).astype(np.float32)
        _chain(lc.tensor(x), lc.tensor(np.ones(n, np.float32))).numpy()
        m = rng.standard_normal((n, 7)).astype(np.float32)
        np.testing.assert_allclose(lc.tensor(m).sum(-1).numpy(), m.sum(-1), rtol=1e-5, atol=1e-5)
        t = rng.standard_normal((5, n)).astype(np.float32)
        _same_bits(lc.tensor(t).t().exp().numpy(), lc.tensor(np.ascontiguousarray(t.T)).exp().numpy())
    assert compiled() == before


@pytest.mark.parametrize("n", ODD_SIZES)
def test_reductions_at_odd_sizes(n):
    rng = np.random.default_rng(n)
    m = rng.standard_normal((3, n)).astype(np.float32)
    t = lc.tensor(m)
    if n:
        np.testing.assert_array_equal(t.max(-1).numpy().reshape(-1), m.max(-1))
        np.testing.assert_array_equal(t.argmax(-1).numpy().reshape(-1), m.argmax(-1))
        np.testing.assert_array_equal(lc.tensor(m.T.copy()).max(0).numpy().reshape(-1), m.max(-1))
    np.testing.assert_allclose(t.sum(-1).numpy().reshape(-1), m.sum(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lc.tensor(m.T.copy()).sum(0).numpy().reshape(-1), m.sum(-1), rtol=1e-5, atol=1e-5)


def test_transposed_add_at_odd_sizes_is_exact():
    rng = np.random.default_rng(5)
    for r, c in ((1, 1), (W - 1, W + 1), (W, 3), (3 * W + 5, 2 * W - 1), (200, 130)):
        a = rng.standard_normal((c, r)).astype(np.float32)
        b = rng.standard_normal((r, c)).astype(np.float32)
        np.testing.assert_array_equal((lc.tensor(a).t() + lc.tensor(b)).numpy(), a.T + b)


def test_sizes_past_two_to_the_31_through_broadcast_views():
    """Offsets are i64: a broadcast view of 2**31 + 5 elements reduces without wrapping."""
    n = 2 ** 31 + 5
    x = lc.tensor(np.array([[1.0], [2.0]], np.float32)).broadcast_as((2, n))
    np.testing.assert_array_equal(x.max(-1).numpy().reshape(-1), [1.0, 2.0])
    assert lc.tensor(np.array([3], np.int64)).broadcast_as((n,)).sum(0).item() == 3 * n


def test_growing_kv_cache_decode_compiles_a_bounded_number_of_kernels():
    """Attention over a cache of length L = 1..40: every new L replays the plan template of its
    size class and takes its kernels from the cache."""
    rng = np.random.default_rng(6)
    kc, vc = rng.standard_normal((40, 64)).astype(np.float32), rng.standard_normal((40, 64)).astype(np.float32)
    q = rng.standard_normal((1, 64)).astype(np.float32)
    before = compiled()
    for L in range(1, 41):
        s = lc.tensor(q) @ lc.tensor(kc[:L]).transpose(0, 1)
        got = (lc.nn.softmax_last_dim(s * 0.125) @ lc.tensor(vc[:L])).numpy()
        logits = (q.astype(np.float64) @ kc[:L].T) * 0.125
        p = np.exp(logits - logits.max(-1, keepdims=True))
        np.testing.assert_allclose(got, (p / p.sum(-1, keepdims=True)) @ vc[:L], rtol=2e-5, atol=2e-6)
    assert compiled() - before <= 8


def test_size_class_replay_keeps_fusion_decisions_per_size():
    """Sizes 1 and 0 are their own size class: a broadcast read of a size-1 dim and an empty
    tensor still give NumPy's results after other sizes of the same graph ran."""
    for n in (5, 1, 0, 7, 1):
        a = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        b = np.arange(3, dtype=np.float32).reshape(1, 3) + 1
        t = lc.tensor(a)
        got = (t.broadcast_add(lc.tensor(b)).exp() / (t + 1.0).sum_keepdim(-1)).numpy()
        np.testing.assert_allclose(got, np.exp(a + b) / (a + 1).sum(-1, keepdims=True), rtol=1e-6)
