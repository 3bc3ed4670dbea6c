"""Reductions against NumPy: every kind, dims, keepdim, layouts, dtypes, NaN, empty, fusion."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import lazycandle as lc
from lazycandle.ir.graph import capture
from lazycandle.compiler import schedule_capture

rng = np.random.default_rng(0)
FLOATS = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]
INTS = [np.int32, np.int64, np.uint8, np.uint32, np.int16]


def _data(shape, dt):
    if np.dtype(dt).kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def _ref(kind, x, dims, keep):
    dt = x.dtype
    if kind in ("argmax", "argmin"):
        r = getattr(np, kind)(x, axis=dims[0], keepdims=keep)
        return r.astype(np.uint32)
    if kind == "sum":
        if dt.kind in "iu":
            return np.sum(x, axis=dims, dtype=dt, keepdims=keep)
        return np.sum(x.astype(np.float64), axis=dims, keepdims=keep)
    if kind == "mean":
        return np.mean(x.astype(np.float64), axis=dims, keepdims=keep)
    return getattr(np, kind)(x, axis=dims, keepdims=keep)


def _check(got, want, dt):
    assert got.shape == want.shape
    if np.dtype(dt).kind in "iu" or want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)
    else:
        tol = {np.float32: 1e-5, np.float64: 1e-12}.get(np.dtype(dt).type, 1e-2)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min", "argmax", "argmin"])
@pytest.mark.parametrize("dt", FLOATS + INTS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape,dim", [((37,), 0), ((5, 33), 1), ((33, 5), 0), ((3, 4, 17), 1), ((2, 3, 4, 5), 3)])
def test_reduce_kinds(kind, dt, shape, dim):
    if kind == "mean" and np.dtype(dt).kind in "iu":
        pytest.skip("mean of integers raises (tested below)")
    x = _data(shape, dt)
    t = lc.tensor(x)
    for keep in (False, True):
        got = getattr(t, f"{kind}_keepdim" if keep else kind)(dim).numpy()
        want = _ref(kind, x, (dim,), keep)
        if np.dtype(dt) in (np.float16, ml_dtypes.bfloat16) and kind in ("sum", "mean"):
            want = want.astype(dt)
        _check(got, want, dt)


@pytest.mark.parametrize("dims", [(0,), (1,), (2,), (0, 2), (1, 2), (0, 1, 2)])
def test_sum_mean_multi_dims(dims):
    x = rng.standard_normal((6, 7, 9)).astype(np.float32)
    t = lc.tensor(x)
    _check(t.sum(dims).numpy(), x.astype(np.float64).sum(dims), np.float32)
    _check(t.mean_keepdim(dims).numpy(), x.astype(np.float64).mean(dims, keepdims=True), np.float32)


@pytest.mark.parametrize("view", ["t", "narrow", "broadcast", "permute", "step"])
def test_reduce_strided_inputs(view):
    x = rng.standard_normal((24, 40)).astype(np.float32)
    t = lc.tensor(x)
    views = {
        "t": (t.t(), x.T),
        "narrow": (t.narrow(1, 3, 30), x[:, 3:33]),
        "broadcast": (lc.tensor(x[0]).broadcast_as((24, 40)), np.broadcast_to(x[0], (24, 40))),
        "permute": (lc.tensor(x.reshape(4, 6, 40)).permute(2, 0, 1), x.reshape(4, 6, 40).transpose(2, 0, 1)),
        "step": (t[::3, 1::2], x[::3, 1::2]),
    }
    tv, xv = views[view]
    for d in range(xv.ndim):
        _check(tv.sum(d).numpy(), xv.astype(np.float64).sum(d), np.float32)
        np.testing.assert_array_equal(tv.max(d).numpy(), xv.max(d))
        np.testing.assert_array_equal(tv.argmin(d).numpy(), xv.argmin(d).astype(np.uint32))


def test_all_forms_and_rank0():
    x = rng.standard_normal((5, 6)).astype(np.float64)
    t = lc.tensor(x)
    assert t.sum_all().shape == ()
    _check(t.sum_all().numpy(), x.sum(), np.float64)
    _check(t.mean_all().numpy(), x.mean(), np.float64)
    assert t.max_all().item() == x.max()
    assert t.min_all().item() == x.min()
    s = lc.tensor(np.float32(3.5))
    assert s.sum_all().item() == 3.5
    assert s.max_all().item() == 3.5


def test_nan_propagation_and_ties():
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 5.0, 5.0, 1.0], [np.inf, -np.inf, 0, 0]], np.float32)
    t = lc.tensor(x)
    np.testing.assert_array_equal(t.max(1).numpy(), np.max(x, 1))
    np.testing.assert_array_equal(t.min(1).numpy(), np.min(x, 1))
    np.testing.assert_array_equal(t.argmax(1).numpy(), np.argmax(x, 1).astype(np.uint32))
    np.testing.assert_array_equal(t.argmin(1).numpy(), np.argmin(x, 1).astype(np.uint32))
    big = np.zeros((3, 100), np.float32)
    big[:, 40] = 7
    big[:, 77] = 7
    big[1, 60] = np.nan
    np.testing.assert_array_equal(lc.tensor(big).argmax(1).numpy(), np.argmax(big, 1).astype(np.uint32))


def test_integer_sum_wraps():
    x = np.full(1000, 250, np.uint8)
    assert lc.tensor(x).sum(0).item() == np.sum(x, dtype=np.uint8)
    y = np.full((3, 7), 2**31 - 5, np.int32)
    np.testing.assert_array_equal(lc.tensor(y).sum(1).numpy(), np.sum(y, 1, dtype=np.int32))


def test_empty_reductions():
    z = np.zeros((0, 4), np.float32)
    np.testing.assert_array_equal(lc.tensor(z).sum(0).numpy(), np.zeros(4, np.float32))
    for op in ("max", "min", "argmax", "argmin"):
        with pytest.raises(lc.EmptyReduction) as e:
            getattr(lc.tensor(z), op)(0)
        assert op in str(e.value)
    with pytest.raises(lc.EmptyReduction):
        lc.tensor(z).max_all()
    assert lc.tensor(z).sum(1).shape == (0,)


def test_reduce_errors():
    t = lc.tensor(np.ones((2, 3), np.int32))
    with pytest.raises(lc.UnsupportedDTypeForOp):
        t.mean(0)
    with pytest.raises(lc.DimOutOfRange):
        t.sum(2)
    with pytest.raises(lc.UnsupportedDTypeForOp):
        lc.tensor(np.ones(3, np.float32)).to_dtype(lc.f4).sum(0)


def test_one_int_dim_negative_and_out_of_range():
    """The single-int-dim path: negative dims count from the end, dims one past either end
    raise DimOutOfRange, a rank-0 tensor takes 0 and -1, and the result is a contiguous view."""
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    t = lc.tensor(x)
    for d in range(-3, 3):
        y = t.sum(d)
        assert y.shape == x.sum(d).shape and y._node.layout.is_contiguous()
        _check(y.numpy(), x.astype(np.float64).sum(d), np.float32)
    for d in (3, -4):
        with pytest.raises(lc.DimOutOfRange):
            t.sum(d)
    s = lc.tensor(np.float32(2.5))
    assert s.sum(0).numpy() == 2.5 and s.sum(-1).numpy() == 2.5
    for d in (1, -2):
        with pytest.raises(lc.DimOutOfRange):
            s.sum(d)


def test_producers_fuse_into_reduction():
    x = rng.standard_normal((64, 128)).astype(np.float32)
    t = lc.tensor(x)
    y = (t * 2 + 1).exp().sum(-1)
    kernels, _, _ = schedule_capture(capture([y._node.base]))
    assert len(kernels) == 1 and kernels[0].kind == "reduce"
    _check(y.numpy(), np.exp(x.astype(np.float64) * 2 + 1).sum(-1), np.float32)


def test_shared_producer_is_materialised_once():
    """A producer too costly to recompute (passes.RECOMPUTE_BUDGET) is written once and read by
    the reduction and by the division (both in one row kernel, which reads it from a buffer)."""
    x = lc.tensor(rng.standard_normal((16, 32)).astype(np.float32))
    e = (x * 3).exp().sin().cos().tanh().gelu()
    s = e.sum_keepdim(-1)
    out = e.broadcast_div(s)
    kernels, mat, _ = schedule_capture(capture([out._node]))
    assert [k.kind for k in kernels] == ["elementwise", "row"]
    assert kernels[0].outputs[0] in mat and ("node", kernels[0].outputs[0], 0) in kernels[1].inputs
    e64 = e.numpy().astype(np.float64)
    np.testing.assert_allclose(out.numpy(), e64 / e64.sum(-1, keepdims=True), rtol=1e-6, atol=1e-7)


def test_big_sums_accurate():
    x = rng.standard_normal((512, 4096)).astype(np.float32)
    t = lc.tensor(x)
    _check(t.sum(-1).numpy(), x.astype(np.float64).sum(-1), np.float32)
    np.testing.assert_allclose(t.sum(0).numpy(), x.astype(np.float64).sum(0), rtol=1e-5, atol=1e-4)


def test_threads_give_identical_results():
    x = lc.tensor(rng.standard_normal((1024, 513)).astype(np.float32))
    with lc.num_threads(1):
        a = [x.sum(1).numpy(), x.max(0).numpy(), x.argmax(1).numpy()]
    with lc.num_threads(2):
        b = [x.sum(1).numpy(), x.max(0).numpy(), x.argmax(1).numpy()]
    for p, q in zip(a, b):
        np.testing.assert_array_equal(p, q)


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=4), data=st.data())
def test_hypothesis_sum_max(shape, data):
    x = rng.standard_normal(shape).astype(np.float32)
    perm = data.draw(st.permutations(range(len(shape))))
    xv = x.transpose(perm)
    tv = lc.tensor(x).permute(perm)
    dims = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
    _check(tv.sum_keepdim(dims).numpy(), xv.astype(np.float64).sum(tuple(dims), keepdims=True), np.float32)
    d = dims[0]
    np.testing.assert_array_equal(tv.max(d).numpy(), xv.max(d))
    np.testing.assert_array_equal(tv.argmax(d).numpy(), xv.argmax(d).astype(np.uint32))


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min", "prod", "argmax"])
@pytest.mark.parametrize("shape,dim", [((37, 1100), 0), ((5, 3, 1547), 1), ((6, 2, 1030), (0, 1)),
                                       ((9, 517), 0), ((3, 4500), 0), ((3, 7), 0)])
def test_leading_dim_reductions_split_into_strips_cover_every_output(kind, shape, dim):
    """Inner-output reductions run one unit per strip of the kept last dim (odd widths, several
    strips, a last strip shorter than the others): every output is right at 1 and 2 threads."""
    dt = np.int32 if kind == "prod" else np.float32
    x = (rng.integers(1, 3, shape) if kind == "prod" else rng.standard_normal(shape)).astype(dt)
    dims = dim if isinstance(dim, tuple) else (dim,)
    if kind not in ("sum", "mean") and len(dims) > 1:
        pytest.skip("only sum and mean take several dims")
    want = _ref(kind, x, dims, False)
    for n in (1, 2):
        with lc.num_threads(n):
            t = lc.tensor(x)
            got = getattr(t, kind)(dims[0] if len(dims) == 1 else dims).numpy()
        _check(got, want, dt)


def test_leading_dim_sum_of_an_expression_with_scalars():
    """An inner-output f32 sum evaluates its producers at twice the vector width: runtime
    scalars (the constants of a plan) must be available at that width too."""
    x = rng.standard_normal((40, 600)).astype(np.float32)
    for c in (2.5, -1.25):
        got = (lc.tensor(x) * c + 1.0).sum(0).numpy()
        want = (x.astype(np.float64) * c + 1.0).sum(0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
