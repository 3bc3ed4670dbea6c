"""Model ops of issue 12 (nn activations/norms/losses, repeat, meshgrid, slice_set /
slice_assign, rope, sdpa) against NumPy references written here."""
import math

import numpy as np
import pytest

import lazycandle as lc

RNG = np.random.default_rng(0)


def rnd(*shape, dt=np.float32):
    return RNG.standard_normal(shape).astype(dt)


def close(a, b, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(a.numpy() if isinstance(a, lc.Tensor) else a, b, rtol=rtol, atol=atol)


# ---- activations ------------------------------------------------------------------------
def test_gelu_default_is_erf_and_tanh_is_the_approximation():
    x = rnd(5, 7).astype(np.float64)
    erf = np.vectorize(math.erf)
    close(lc.nn.gelu(lc.tensor(x)), 0.5 * x * (1 + erf(x / math.sqrt(2))), 1e-12, 1e-13)
    tanh = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    close(lc.nn.gelu(lc.tensor(x), approximate="tanh"), tanh, 1e-12, 1e-13)
    with pytest.raises(ValueError):
        lc.nn.gelu(lc.tensor(x), approximate="fast")


def test_relu_silu_sigmoid():
    x = rnd(4, 6)
    close(lc.nn.relu(lc.tensor(x)), np.maximum(x, 0))
    close(lc.nn.sigmoid(lc.tensor(x)), 1 / (1 + np.exp(-x)))
    close(lc.nn.silu(lc.tensor(x)), x / (1 + np.exp(-x)))


def test_dropout_is_identity_unless_training_and_seeded_scaled_when_training():
    x = np.ones((64, 64), np.float32)
    t = lc.tensor(x)
    close(lc.nn.dropout(t, 0.5), x)
    a = lc.nn.dropout(t, 0.25, train=True, seed=3).numpy()
    b = lc.nn.dropout(t, 0.25, train=True, seed=3).numpy()
    np.testing.assert_array_equal(a, b)
    assert set(np.unique(a)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.15 < (a == 0).mean() < 0.35
    np.testing.assert_array_equal(lc.nn.dropout(t, 1.0, train=True).numpy(), 0 * x)
    with pytest.raises(ValueError):
        lc.nn.dropout(t, 1.5)


# ---- normalisation ----------------------------------------------------------------------
def test_layer_norm_and_rms_norm_default_eps():
    x, g, b = rnd(3, 8), rnd(8), rnd(8)
    m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    close(lc.nn.layer_norm(lc.tensor(x), lc.tensor(g), lc.tensor(b)), (x - m) / np.sqrt(v + 1e-5) * g + b)
    r = np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5)
    close(lc.nn.rms_norm(lc.tensor(x), lc.tensor(g)), x / r * g)


def test_group_norm_matches_numpy_per_group():
    x, w, b = rnd(2, 6, 5), rnd(6), rnd(6)
    g = x.reshape(2, 3, -1)
    y = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    close(lc.nn.group_norm(lc.tensor(x), 3, lc.tensor(w), lc.tensor(b)), y * w[:, None] + b[:, None])
    close(lc.nn.group_norm(lc.tensor(x), 2), _gn(x, 2))
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="group_norm"):
        lc.nn.group_norm(lc.tensor(x), 4)


def _gn(x, groups):
    g = x.reshape(x.shape[0], groups, -1)
    return ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)


def test_batch_norm_inference_uses_running_stats():
    x, rm, rv, w, b = rnd(4, 3, 2, 2), rnd(3), np.abs(rnd(3)) + 0.5, rnd(3), rnd(3)
    sh = (1, 3, 1, 1)
    want = (x - rm.reshape(sh)) / np.sqrt(rv.reshape(sh) + 1e-5) * w.reshape(sh) + b.reshape(sh)
    close(lc.nn.batch_norm(lc.tensor(x), lc.tensor(rm), lc.tensor(rv), lc.tensor(w), lc.tensor(b)), want)
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="running_var"):
        lc.nn.batch_norm(lc.tensor(x), lc.tensor(rm), lc.tensor(rv[:2]))


# ---- lookups and losses -----------------------------------------------------------------
def test_embedding_of_2d_ids_and_out_of_range():
    table = rnd(10, 4)
    ids = np.array([[1, 9], [0, 3]], np.int64)
    close(lc.nn.embedding(lc.tensor(ids), lc.tensor(table)), table[ids], 0, 0)
    with pytest.raises(lc.IndexOutOfBounds):
        lc.nn.embedding(lc.tensor(np.array([10], np.int64)), lc.tensor(table)).numpy()


def test_cross_entropy_nll_and_mse_match_numpy():
    logits, targets = rnd(5, 7).astype(np.float64), np.array([0, 6, 3, 3, 1], np.int64)
    m = logits.max(1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(1, keepdims=True))
    want = -logp[np.arange(5), targets].mean()
    close(lc.nn.cross_entropy(lc.tensor(logits), lc.tensor(targets)), want, 1e-12, 1e-12)
    close(lc.nn.nll(lc.tensor(logp), lc.tensor(targets.astype(np.uint32))), want, 1e-12, 1e-12)
    a, b = rnd(3, 4), rnd(3, 4)
    close(lc.nn.mse_loss(lc.tensor(a), lc.tensor(b)), ((a - b) ** 2).mean())
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="cross_entropy"):
        lc.nn.cross_entropy(lc.tensor(logits), lc.tensor(targets[:3]))


def test_cross_entropy_torch_documented_value():
    # uniform logits over C classes: the loss is log(C) whatever the target
    close(lc.nn.cross_entropy(lc.zeros((2, 4)), [1, 3]), math.log(4))


# ---- repeat, meshgrid, slice_set / slice_assign ----------------------------------------------
@pytest.mark.parametrize("reps", [(2, 3), (1, 1), (2, 1, 3), (0, 2)])
def test_repeat_is_numpy_tile(reps):
    x = rnd(2, 3)
    close(lc.tensor(x).repeat(reps), np.tile(x, reps), 0, 0)


def test_repeat_of_a_transposed_view():
    x = rnd(3, 2)
    close(lc.tensor(x).t().repeat(2, 2), np.tile(x.T, (2, 2)), 0, 0)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid_matches_numpy(indexing):
    a, b, c = np.arange(3), np.arange(4) * 10, np.arange(2) * 100
    got = lc.meshgrid(lc.tensor(a), lc.tensor(b), lc.tensor(c), indexing=indexing)
    for g, w in zip(got, np.meshgrid(a, b, c, indexing=indexing)):
        np.testing.assert_array_equal(g.numpy(), w)
    for cand in (lc.meshgrid([lc.tensor(a), lc.tensor(b)], indexing == "xy"),
                 lc.meshgrid([lc.tensor(a), lc.tensor(b)], xy_indexing=indexing == "xy")):
        for g, w in zip(cand, np.meshgrid(a, b, indexing=indexing)):
            np.testing.assert_array_equal(g.numpy(), w)


@pytest.mark.parametrize("dim,start,n", [(1, 0, 1), (1, 2, 3), (1, 4, 1), (0, 1, 1), (2, 0, 2), (1, 0, 5)])
def test_slice_set_writes_src_along_dim(dim, start, n):
    x = rnd(2, 5, 3)
    shape = list(x.shape)
    shape[dim] = n
    src = rnd(*shape)
    want = x.copy()
    idx = [slice(None)] * 3
    idx[dim] = slice(start, start + n)
    want[tuple(idx)] = src
    t = lc.tensor(x)
    close(t.slice_set(lc.tensor(src), dim, start), want, 0, 0)
    np.testing.assert_array_equal(t.numpy(), x)      # the old value is untouched


def test_slice_set_kv_cache_loop_on_integers():
    cache = lc.zeros((1, 6, 2), dtype=lc.i64)
    want = np.zeros((1, 6, 2), np.int64)
    for step in range(6):
        cache = cache.slice_set(lc.full(step + 1, (1, 1, 2), lc.i64), 1, step)
        want[:, step] = step + 1
    np.testing.assert_array_equal(cache.numpy(), want)


def test_slice_set_out_of_range_raises_at_the_call():
    t = lc.zeros((2, 4))
    with pytest.raises(lc.NarrowInvalidArgs, match="slice_set"):
        t.slice_set(lc.zeros((2, 2)), 1, 3)
    with pytest.raises(lc.NarrowInvalidArgs):
        t.slice_set(lc.zeros((2, 1)), 1, -1)
    with pytest.raises(lc.ShapeMismatchBinaryOp):
        t.slice_set(lc.zeros((3, 1)), 1, 0)
    with pytest.raises(lc.DTypeMismatchBinaryOp):
        t.slice_set(lc.zeros((2, 1), dtype=lc.f64), 1, 0)


@pytest.mark.parametrize("ranges", [[slice(1, 3)], [(0, 2), (1, 4)], [slice(1, 2), slice(0, 5), (2, 3)],
                                    [slice(0, 4), slice(0, 5)]])
def test_slice_assign_matches_numpy(ranges):
    x = rnd(4, 5, 3)
    sl = tuple(r if isinstance(r, slice) else slice(*r) for r in ranges)
    src = rnd(*x[sl].shape)
    want = x.copy()
    want[sl] = src
    close(lc.tensor(x).slice_assign(ranges, lc.tensor(src)), want, 0, 0)


def test_slice_assign_bad_ranges_raise():
    t = lc.zeros((3, 3))
    with pytest.raises(lc.NarrowInvalidArgs, match="slice_assign"):
        t.slice_assign([slice(2, 4)], lc.zeros((2, 3)))
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="slice_assign"):
        t.slice_assign([slice(0, 2)], lc.zeros((1, 3)))


# ---- rotary embeddings --------------------------------------------------------------------
def _cos_sin(t, d):
    ang = np.arange(t)[:, None] * (1.0 / 10000 ** (np.arange(d // 2) * 2 / d))[None]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _rope_ref(x, cos, sin):          # x (b, h, t, d), halves rotated
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _rope_i_ref(x, cos, sin):        # interleaved pairs
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    return out


def test_rope_variants_match_references():
    x = rnd(2, 3, 5, 8)
    cos, sin = _cos_sin(5, 8)
    c, s = lc.tensor(cos), lc.tensor(sin)
    close(lc.nn.rope(lc.tensor(x), c, s), _rope_ref(x, cos, sin))
    close(lc.nn.rope_i(lc.tensor(x), c, s), _rope_i_ref(x, cos, sin))
    xt = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    close(lc.nn.rope_thd(lc.tensor(xt), c, s), _rope_ref(x, cos, sin).transpose(0, 2, 1, 3))
    # a transposed (non-contiguous) input is read through its strides
    close(lc.nn.rope(lc.tensor(xt).transpose(1, 2), c, s), _rope_ref(x, cos, sin))


@pytest.mark.parametrize("batched", [False, True])
def test_rope_tables_longer_than_the_sequence_use_their_first_rows(batched):
    """candle-nn: a table precomputed for max_position_embeddings is passed whole (issue 37)."""
    r = np.random.default_rng(7)
    x = r.standard_normal((2, 3, 5, 8))
    cos, sin = np.cos(r.standard_normal((12, 4))), np.sin(r.standard_normal((12, 4)))
    if batched:
        cos, sin = np.stack([cos, cos[::-1]]), np.stack([sin, sin[::-1]])
    c, s = lc.tensor(cos), lc.tensor(sin)
    want_c, want_s = cos[..., :5, :], sin[..., :5, :]
    if batched:
        want = np.stack([_rope_ref(x[i:i + 1], want_c[i], want_s[i])[0] for i in range(2)])
        want_i = np.stack([_rope_i_ref(x[i:i + 1], want_c[i], want_s[i])[0] for i in range(2)])
    else:
        want, want_i = _rope_ref(x, want_c, want_s), _rope_i_ref(x, want_c, want_s)
    close(lc.nn.rope(lc.tensor(x), c, s), want)
    close(lc.nn.rope_i(lc.tensor(x), c, s), want_i)
    xt = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    close(lc.nn.rope_thd(lc.tensor(xt), c, s), want.transpose(0, 2, 1, 3))


def test_rope_bad_shapes_raise():
    x = lc.zeros((1, 2, 5, 8))
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="rope"):
        lc.nn.rope(x, lc.zeros((5, 8)), lc.zeros((5, 8)))
    for op in (lc.nn.rope, lc.nn.rope_i, lc.nn.rope_thd):   # a table shorter than the sequence
        xx = x if op is not lc.nn.rope_thd else lc.zeros((1, 5, 2, 8))
        with pytest.raises(lc.ShapeMismatchBinaryOp, match=r"\(4, 4\).*\(1, (2, 5|5, 2), 8\)"):
            op(xx, lc.zeros((4, 4)), lc.zeros((4, 4)))
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="rope"):     # a batch that is not x's
        lc.nn.rope(x, lc.zeros((3, 5, 4)), lc.zeros((3, 5, 4)))
    with pytest.raises(lc.DTypeMismatchBinaryOp):
        lc.nn.rope_i(x, lc.zeros((5, 4), dtype=lc.f64), lc.zeros((5, 4), dtype=lc.f64))


# ---- scaled dot-product attention ----------------------------------------------------------
def _sdpa_ref(q, k, v, add=None, scale=None):
    s = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if add is not None:
        s = s + add
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("L,S", [(4, 4), (3, 6), (6, 3)])
def test_sdpa_causal_is_top_left_tril(L, S):
    q, k, v = rnd(2, 2, L, 8).astype(np.float64), rnd(2, 2, S, 8).astype(np.float64), rnd(2, 2, S, 5).astype(np.float64)
    add = np.where(np.tril(np.ones((L, S))) > 0, 0.0, -np.inf)
    got = lc.nn.scaled_dot_product_attention(lc.tensor(q), lc.tensor(k), lc.tensor(v), is_causal=True)
    close(got, _sdpa_ref(q, k, v, add), 1e-10, 1e-12)


def test_sdpa_bool_and_float_masks_and_scale():
    q, k, v = rnd(1, 3, 4, 8), rnd(1, 3, 6, 8), rnd(1, 3, 6, 8)
    keep = RNG.random((4, 6)) > 0.3
    keep[:, 0] = True
    want = _sdpa_ref(q, k, v, np.where(keep, 0.0, -np.inf))
    close(lc.nn.scaled_dot_product_attention(lc.tensor(q), lc.tensor(k), lc.tensor(v), mask=keep), want)
    fmask = rnd(4, 6)
    close(lc.nn.scaled_dot_product_attention(lc.tensor(q), lc.tensor(k), lc.tensor(v), mask=lc.tensor(fmask),
                                             scale=0.3), _sdpa_ref(q, k, v, fmask, 0.3))
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="scaled_dot_product_attention"):
        lc.nn.scaled_dot_product_attention(lc.tensor(q), lc.tensor(k[..., :4]), lc.tensor(v))


@pytest.mark.parametrize("dt", [lc.bf16, lc.f16, lc.u8, lc.i64, lc.f64])
def test_repeat_and_slice_set_copy_every_dtype_exactly(dt):
    x = lc.tensor(np.arange(12).reshape(3, 4)).to_dtype(dt)
    ref = x.numpy()
    np.testing.assert_array_equal(x.repeat(2, 1).numpy(), np.tile(ref, (2, 1)))
    src = lc.tensor(np.full((3, 2), 7)).to_dtype(dt)
    want = ref.copy()
    want[:, 1:3] = src.numpy()
    np.testing.assert_array_equal(x.slice_set(src, 1, 1).numpy(), want)


def test_rope_bf16_is_the_f32_result_rounded():
    import ml_dtypes
    x = rnd(1, 2, 3, 4).astype(ml_dtypes.bfloat16)
    cos, sin = (a.astype(ml_dtypes.bfloat16) for a in _cos_sin(3, 4))
    got = lc.nn.rope(lc.tensor(x), lc.tensor(cos), lc.tensor(sin)).numpy().astype(np.float32)
    want = _rope_ref(x.astype(np.float32), cos.astype(np.float32), sin.astype(np.float32))
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=2 ** -7)
