"""slice_set_ (buffer donation, issue 12): writes only the new rows into the tensor's own buffer
when its old value is dead, else rebinds it to the fused copy; either way equal to NumPy, and a
value someone else still holds never changes."""
import numpy as np
import pytest

import lazycandle as lc


def _ref(x, src, dim, start):
    want = x.copy()
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, start + src.shape[dim])
    want[tuple(idx)] = src
    return want


def _addr(t):
    return t._node.buffer.ctypes.data


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("where", ["start", "mid", "end"])
def test_slice_set_inplace_writes_rows_into_the_same_buffer(dim, where):
    rng = np.random.default_rng(dim)
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    n = 2
    start = {"start": 0, "mid": 1, "end": x.shape[dim] - n}[where]
    shape = list(x.shape)
    shape[dim] = n
    src = rng.standard_normal(shape).astype(np.float32)
    t = lc.tensor(x)
    before = _addr(t)
    out = t.slice_set_(lc.tensor(src), dim, start)
    assert out is t and _addr(t) == before
    np.testing.assert_array_equal(t.numpy(), _ref(x, src, dim, start))
    np.testing.assert_array_equal(t.numpy(), lc.tensor(x).slice_set(lc.tensor(src), dim, start).numpy())


def test_slice_set_inplace_large_buffer_in_place():
    x = np.zeros((2, 4, 256, 64), np.float32)          # > 1 MiB: a recycled mapped block
    t = lc.tensor(x)
    before = _addr(t)
    for pos in range(3):
        t.slice_set_(lc.full(pos + 1.0, (2, 4, 1, 64)), 2, pos)
    assert _addr(t) == before
    want = x.copy()
    for pos in range(3):
        want[:, :, pos] = pos + 1.0
    np.testing.assert_array_equal(t.numpy(), want)


@pytest.mark.parametrize("dt", [lc.f64, lc.f16, lc.bf16, lc.u8, lc.u32, lc.i64])
def test_slice_set_inplace_every_dtype_exactly(dt):
    x = (np.arange(24).reshape(2, 3, 4) % 7).astype(dt.numpy)
    src = np.full((2, 1, 4), 5).astype(dt.numpy)
    t = lc.tensor(x, dt)
    t.slice_set_(lc.tensor(src, dt), 1, 2)
    np.testing.assert_array_equal(t.numpy(), _ref(x, src, 1, 2))


def test_slice_set_inplace_strided_src():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 6, 5)).astype(np.float32)
    s = rng.standard_normal((5, 2, 3)).astype(np.float32)
    src = lc.tensor(s).permute((2, 1, 0))              # (3, 2, 5), not contiguous
    t = lc.tensor(x)
    before = _addr(t)
    t.slice_set_(src, 1, 3)
    assert _addr(t) == before
    np.testing.assert_array_equal(t.numpy(), _ref(x, s.transpose(2, 1, 0), 1, 3))


def test_slice_set_inplace_src_read_from_the_tensor_itself():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    t = lc.tensor(x)
    t.slice_set_(t.narrow(0, 0, 2) * 10, 0, 2)
    np.testing.assert_array_equal(t.numpy(), _ref(x, x[:2] * 10, 0, 2))


@pytest.mark.parametrize("holder", ["lazy consumer", "other handle", "realized view", "numpy view"])
def test_slice_set_inplace_never_changes_a_value_still_held(holder):
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    t = lc.tensor(x)
    before = _addr(t)
    kept, old = {"lazy consumer": lambda: (t * 1, x),
                 "other handle": lambda: (lc.Tensor(t._node), x),
                 "realized view": lambda: (t.narrow(0, 1, 2).realize(), x[1:3]),
                 "numpy view": lambda: (t.numpy(), x)}[holder]()
    t.slice_set_(lc.ones((1, 5)), 0, 1)
    np.testing.assert_array_equal(t.numpy(), _ref(x, np.ones((1, 5), np.float32), 0, 1))
    assert _addr(t) != before                       # the copy path: t got a buffer of its own
    np.testing.assert_array_equal(kept.numpy() if hasattr(kept, "numpy") else kept, old)


def test_slice_set_does_not_change_the_tensor_it_is_called_on():
    x = np.zeros((3, 4), np.float32)
    t = lc.tensor(x)
    u = t.slice_set(lc.ones((1, 4)), 0, 1)
    np.testing.assert_array_equal(u.numpy(), _ref(x, np.ones((1, 4), np.float32), 0, 1))
    np.testing.assert_array_equal(t.numpy(), x)


def test_slice_set_inplace_on_a_lazy_tensor_rebinds_it():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = lc.tensor(x) + 1
    t.slice_set_(lc.zeros((2, 1)), 1, 2)
    np.testing.assert_array_equal(t.numpy(), _ref(x + 1, np.zeros((2, 1), np.float32), 1, 2))


def test_slice_set_inplace_tensor_start():
    x = np.zeros((2, 5), np.float32)
    t = lc.tensor(x)
    t.slice_set_(lc.ones((2, 1)), 1, lc.tensor([3]))
    np.testing.assert_array_equal(t.numpy(), _ref(x, np.ones((2, 1), np.float32), 1, 3))


def test_slice_set_inplace_bad_arguments_raise_like_slice_set():
    t = lc.zeros((2, 4)).realize()
    before = t.numpy().copy()
    with pytest.raises(lc.NarrowInvalidArgs, match="slice_set"):
        t.slice_set_(lc.ones((2, 2)), 1, 3)
    with pytest.raises(lc.NarrowInvalidArgs, match="slice_set"):
        t.slice_set_(lc.ones((2, 1)), 1, -1)
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="slice_set"):
        t.slice_set_(lc.ones((3, 1)), 1, 0)
    with pytest.raises(lc.DTypeMismatchBinaryOp, match="slice_set"):
        t.slice_set_(lc.ones((2, 1), dtype=lc.f64), 1, 0)
    np.testing.assert_array_equal(t.numpy(), before)
