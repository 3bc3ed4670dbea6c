"""View ops (layout changes, no data copied), compared exactly with the same NumPy views."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from conftest import ALL_DTYPES, STORAGE_ONLY, assert_same, ids

def C(a):
    """A C-contiguous copy that keeps rank 0 (np.ascontiguousarray makes 0-d arrays 1-d)."""
    return np.array(a, order="C", copy=True)


A = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)


def base(dt=lc.f32, arr=A):
    a = arr.astype(np.float32).astype(dt.numpy) if dt is not lc.f32 else arr
    return lc.tensor(a), a


# (name, lazycandle view, numpy view)
VIEW_CASES = [
    ("reshape", lambda t: t.reshape((6, 20)), lambda a: a.reshape(6, 20)),
    ("reshape_varargs", lambda t: t.reshape(4, 30), lambda a: a.reshape(4, 30)),
    ("reshape_-1", lambda t: t.reshape((-1, 5)), lambda a: a.reshape(-1, 5)),
    ("reshape_-1_mid", lambda t: t.reshape((2, -1, 10)), lambda a: a.reshape(2, -1, 10)),
    ("reshape_rank0", lambda t: t[1, 2, 3, 4].reshape(()), lambda a: a[1, 2, 3, 4].reshape(())),
    ("reshape_to_1s", lambda t: t[0, 0, 0, :1].reshape((1, 1, 1)), lambda a: a[0, 0, 0, :1].reshape(1, 1, 1)),
    ("reshape_of_transposed_copy", lambda t: t.t().reshape((-1,)), lambda a: np.swapaxes(a, -1, -2).reshape(-1)),
    ("reshape_of_transposed_2d", lambda t: t.reshape((24, 5)).t().reshape((10, 12)),
     lambda a: a.reshape(24, 5).T.reshape(10, 12)),
    ("reshape_of_transposed_no_copy", lambda t: t.transpose(0, 1).reshape((3, 2, 2, 10)),
     lambda a: a.transpose(1, 0, 2, 3).reshape(3, 2, 2, 10)),
    ("reshape_of_narrowed", lambda t: t.narrow(3, 1, 3).reshape((24, 3)), lambda a: a[..., 1:4].reshape(24, 3)),
    ("reshape_of_stepped", lambda t: t[:, :, ::2].reshape((-1,)), lambda a: a[:, :, ::2].reshape(-1)),
    ("reshape_of_broadcast", lambda t: t[:, :1].broadcast_as((2, 3, 4, 5)).reshape((6, 20)),
     lambda a: np.broadcast_to(a[:, :1], (2, 3, 4, 5)).reshape(6, 20)),
    ("transpose", lambda t: t.transpose(1, 3), lambda a: np.swapaxes(a, 1, 3)),
    ("transpose_neg", lambda t: t.transpose(-1, 0), lambda a: np.swapaxes(a, -1, 0)),
    ("transpose_same", lambda t: t.transpose(2, 2), lambda a: a),
    ("t", lambda t: t.t(), lambda a: np.swapaxes(a, -1, -2)),
    ("t_2d", lambda t: t[0, 0].t(), lambda a: a[0, 0].T),
    ("permute", lambda t: t.permute((2, 0, 3, 1)), lambda a: a.transpose(2, 0, 3, 1)),
    ("permute_varargs", lambda t: t.permute(3, 2, 1, 0), lambda a: a.transpose(3, 2, 1, 0)),
    ("permute_neg", lambda t: t.permute((-1, 0, 1, 2)), lambda a: a.transpose(3, 0, 1, 2)),
    ("narrow", lambda t: t.narrow(2, 1, 2), lambda a: a[:, :, 1:3]),
    ("narrow_neg", lambda t: t.narrow(-1, 2, 3), lambda a: a[..., 2:5]),
    ("narrow_empty", lambda t: t.narrow(1, 3, 0), lambda a: a[:, 3:3]),
    ("narrow_full", lambda t: t.narrow(0, 0, 2), lambda a: a),
    ("broadcast_as", lambda t: t[:, :1, :, 2:3].broadcast_as((2, 3, 4, 7)),
     lambda a: np.broadcast_to(a[:, :1, :, 2:3], (2, 3, 4, 7))),
    ("broadcast_as_new_dims", lambda t: t[0, 0, 0].broadcast_as((3, 2, 5)),
     lambda a: np.broadcast_to(a[0, 0, 0], (3, 2, 5))),
    ("broadcast_as_varargs", lambda t: t[0, 0, 0].broadcast_as(2, 5), lambda a: np.broadcast_to(a[0, 0, 0], (2, 5))),
    ("broadcast_rank0", lambda t: t[1, 1, 1, 1].broadcast_as((3, 4)), lambda a: np.broadcast_to(a[1, 1, 1, 1], (3, 4))),
    ("expand", lambda t: t[:1, 1].expand((4, 4, 5)), lambda a: np.broadcast_to(a[:1, 1], (4, 4, 5))),
    ("broadcast_left", lambda t: t[0, 0].broadcast_left((2, 3)), lambda a: np.broadcast_to(a[0, 0], (2, 3, 4, 5))),
    ("broadcast_left_varargs", lambda t: t[0, 0].broadcast_left(3), lambda a: np.broadcast_to(a[0, 0], (3, 4, 5))),
    ("unsqueeze0", lambda t: t.unsqueeze(0), lambda a: a[None]),
    ("unsqueeze_mid", lambda t: t.unsqueeze(2), lambda a: np.expand_dims(a, 2)),
    ("unsqueeze_end", lambda t: t.unsqueeze(4), lambda a: np.expand_dims(a, 4)),
    ("unsqueeze_neg", lambda t: t.unsqueeze(-1), lambda a: np.expand_dims(a, -1)),
    ("unsqueeze_neg2", lambda t: t.unsqueeze(-2), lambda a: np.expand_dims(a, -2)),
    ("squeeze", lambda t: t[:, :1].squeeze(1), lambda a: a[:, :1].squeeze(1)),
    ("squeeze_neg", lambda t: t[..., :1].squeeze(-1), lambda a: a[..., :1].squeeze(-1)),
    ("squeeze_not_one", lambda t: t.squeeze(1), lambda a: a),
    ("flatten", lambda t: t.flatten(), lambda a: a.reshape(-1)),
    ("flatten_range", lambda t: t.flatten(1, 2), lambda a: a.reshape(2, 12, 5)),
    ("flatten_neg", lambda t: t.flatten(-3, -1), lambda a: a.reshape(2, 60)),
    ("flatten_transposed", lambda t: t.t().flatten(1), lambda a: np.swapaxes(a, -1, -2).reshape(2, -1)),
    ("flatten_all", lambda t: t.flatten_all(), lambda a: a.reshape(-1)),
    ("flatten_all_permuted", lambda t: t.permute((3, 1, 0, 2)).flatten_all(), lambda a: a.transpose(3, 1, 0, 2).reshape(-1)),
    ("contiguous", lambda t: t.contiguous(), lambda a: a),
    ("contiguous_of_t", lambda t: t.t().contiguous(), lambda a: np.swapaxes(a, -1, -2)),
    ("idx_int", lambda t: t[1], lambda a: a[1]),
    ("idx_neg_int", lambda t: t[-1, -2], lambda a: a[-1, -2]),
    ("idx_all_ints", lambda t: t[1, 2, 3, 4], lambda a: a[1, 2, 3, 4]),
    ("idx_slices", lambda t: t[:, 1:3, ::2, 1::3], lambda a: a[:, 1:3, ::2, 1::3]),
    ("idx_neg_slice", lambda t: t[:, -2:, :-1], lambda a: a[:, -2:, :-1]),
    ("idx_empty_slice", lambda t: t[:, 2:1], lambda a: a[:, 2:1]),
    ("idx_big_slice", lambda t: t[:, 1:100], lambda a: a[:, 1:100]),
    ("idx_none", lambda t: t[None, :, None], lambda a: a[None, :, None]),
    ("idx_none_end", lambda t: t[1, :, 2, None], lambda a: a[1, :, 2, None]),
    ("idx_ellipsis", lambda t: t[..., 1], lambda a: a[..., 1]),
    ("idx_mixed", lambda t: t[1, None, 1:, -1, ::2], lambda a: a[1, None, 1:, -1, ::2]),
    ("view_of_view", lambda t: t.t()[1:, ::2].permute((2, 0, 1, 3)).narrow(3, 1, 1).squeeze(3).unsqueeze(0),
     lambda a: np.expand_dims(np.swapaxes(a, -1, -2)[1:, ::2].transpose(2, 0, 1, 3)[..., 1:2].squeeze(3), 0)),
    ("transpose_of_transpose", lambda t: t.t().t(), lambda a: a),
    ("chain_stepped", lambda t: t[:, :, 1::2][:, :, ::1, 1::2].t(), lambda a: np.swapaxes(a[:, :, 1::2][:, :, ::1, 1::2], -1, -2)),
]


@pytest.mark.parametrize("name,f,g", VIEW_CASES, ids=[c[0] for c in VIEW_CASES])
def test_view(name, f, g):
    t, a = base()
    v = f(t)
    expected = g(a)
    assert v.shape == expected.shape
    assert v.dtype is lc.f32
    assert_same(v.numpy(), C(expected), name)


@pytest.mark.parametrize("name,f,g", VIEW_CASES, ids=[c[0] for c in VIEW_CASES])
def test_view_of_lazy_computed_tensor(name, f, g):
    t, a = base()
    lazy = t * 2.0 + 1.0
    v = f(lazy)
    assert v.shape == g(a).shape
    assert lazy.is_lazy
    assert v.is_lazy or v is lazy
    expected = g(a * np.float32(2) + np.float32(1))
    assert_same(v.numpy(), C(expected), name)


@pytest.mark.parametrize("name,f,g", VIEW_CASES[::3], ids=[c[0] for c in VIEW_CASES[::3]])
def test_view_feeds_elementwise(name, f, g):
    t, a = base()
    v = f(t)
    y = v * 3.0 - 1.0
    assert_same(y.numpy(), C(g(a) * np.float32(3) - np.float32(1)), name)


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=ids(ALL_DTYPES))
def test_views_every_dtype(dt):
    arr = (np.arange(24, dtype=np.float32).reshape(2, 3, 4) % 6)
    t, a = base(dt, arr)
    cases = [
        (t.t(), np.swapaxes(a, -1, -2)),
        (t.permute((2, 0, 1)), a.transpose(2, 0, 1)),
        (t.narrow(2, 1, 2), a[:, :, 1:3]),
        (t[1, ::2, None], a[1, ::2, None]),
        (t[:, :1].broadcast_as((2, 5, 4)), np.broadcast_to(a[:, :1], (2, 5, 4))),
        (t.t().reshape((-1,)), np.swapaxes(a, -1, -2).reshape(-1)),
        (t.t().contiguous(), np.swapaxes(a, -1, -2)),
        (t.flatten_all(), a.reshape(-1)),
    ]
    for i, (v, e) in enumerate(cases):
        assert v.dtype is dt
        assert_same(v.numpy(), C(e), f"{dt.name} case {i}", bits=True)


@pytest.mark.parametrize("dt", STORAGE_ONLY, ids=ids(STORAGE_ONLY))
def test_storage_only_copy(dt):
    a = np.array([[0.5, 1, 2, 4], [1, 2, 0.5, 1]], np.float32).astype(dt.numpy)
    t = lc.tensor(a)
    c = t.copy() if hasattr(t, "copy") else t.t().t().contiguous()
    assert_same(c.numpy(), a, bits=True)
    assert_same(lc.tensor(t).numpy(), a, bits=True)


def test_views_never_realize(compiled_counter):
    t = lc.tensor(A)
    y = (t * 0.01 + 1.0).exp()
    before = compiled_counter()
    views = [y.t(), y.reshape((6, 20)), y[1:, None, ::2], y.narrow(1, 1, 1), y.permute((3, 2, 1, 0)),
             y[0, 0, 0].broadcast_as((3, 5)), y.unsqueeze(1).squeeze(1), y.flatten(1, 2), y.t().reshape((-1,)),
             y.t().contiguous(), *y.chunk(2, 1)]
    for v in views:
        assert v.is_lazy
    assert y.is_lazy
    assert compiled_counter() == before
    for v in views:
        _ = v.shape, v.dtype, v.rank, v.elem_count, repr(v)
        assert v.is_lazy
    out = views[0].numpy()
    assert not views[0].is_lazy
    np.testing.assert_allclose(out, np.swapaxes(np.exp(A * np.float32(0.01) + np.float32(1)), -1, -2), rtol=1e-6)


def test_view_of_realized_buffer_is_lazy_until_numpy():
    t = lc.tensor(A)
    v = t.t()
    assert v.is_lazy
    v.numpy()
    assert not v.is_lazy


def test_views_do_not_copy_source():
    """A view reads the source buffer: realizing the source later still gives the view's data."""
    t = lc.tensor(A)
    y = t * 2.0
    v = y[1, :, 1:3]
    y.realize()
    assert_same(v.numpy(), C((A * 2)[1, :, 1:3]))


# ---- chunk ---------------------------------------------------------------------------------
def test_chunk_even():
    t, a = base()
    parts = t.chunk(2, 0)
    assert len(parts) == 2
    for p, e in zip(parts, np.split(a, 2, axis=0)):
        assert_same(p.numpy(), e)
    parts = t.chunk(5, -1)
    assert len(parts) == 5
    for p, e in zip(parts, np.split(a, 5, axis=-1)):
        assert_same(p.numpy(), C(e))


@pytest.mark.parametrize("size,n", [(7, 3), (5, 2), (6, 4), (3, 5), (1, 1), (10, 3)])
def test_chunk_uneven_covers_dim(size, n):
    a = np.arange(size * 2, dtype=np.int32).reshape(2, size)
    parts = lc.tensor(a).chunk(n, 1)
    assert 1 <= len(parts) <= n
    sizes = [p.shape[1] for p in parts]
    assert all(s >= 1 for s in sizes)
    assert max(sizes) - min(sizes) <= max(1, -(-size // n))
    assert_same(np.concatenate([p.numpy() for p in parts], axis=1), a)
    # candle's split: larger pieces first, sizes differ by at most one
    if size >= n:
        assert sizes == [size // n + (1 if i < size % n else 0) for i in range(n)]
    else:
        assert sizes == [1] * size


# ---- zero-size and rank-0 ------------------------------------------------------------------
def test_zero_size_views():
    z = lc.tensor(np.zeros((0, 3, 4), np.float32))
    assert z.t().shape == (0, 4, 3)
    assert z.reshape((3, 0, 4)).shape == (3, 0, 4)
    assert z.narrow(1, 1, 2).shape == (0, 2, 4)
    assert z[:, 1].shape == (0, 4)
    assert z.flatten_all().shape == (0,)
    assert z.t().numpy().shape == (0, 4, 3)
    assert z.unsqueeze(0).broadcast_as((2, 0, 3, 4)).numpy().shape == (2, 0, 3, 4)


def test_rank0_views():
    s = lc.tensor(np.float32(3.5))
    assert s.unsqueeze(0).shape == (1,)
    assert s.reshape((1, 1)).numpy().tolist() == [[3.5]]
    assert s.broadcast_as((2, 2)).numpy().tolist() == [[3.5, 3.5], [3.5, 3.5]]
    assert s[None].shape == (1,)
    assert s.flatten_all().shape == (1,)
    assert s.unsqueeze(0).squeeze(0).shape == ()
    assert (s.unsqueeze(-1)).shape == (1,)


def test_reshape_copy_of_lazy_transpose_stays_lazy(compiled_counter):
    t = lc.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    y = t.exp().t()
    r = y.reshape((12,))
    before = compiled_counter()
    assert r.is_lazy and y.is_lazy
    assert compiled_counter() == before
    np.testing.assert_allclose(r.numpy(), np.exp(np.arange(12, dtype=np.float32).reshape(3, 4)).T.reshape(-1),
                               rtol=1e-6)
