"""SPEC "Conveniences (torch / NumPy names)" against NumPy (torch's values written as literals
where NumPy differs): aliases, // % and tensor pow, where / masked_fill, the function forms,
keepdim / no-dim reductions and the statistics, t[ids] / t[mask], negative steps and flip,
eye / linspace / tril / triu, across dtypes and layouts, rank 0 and zero-size."""
from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import lazycandle as lc
from lazycandle.ir.ops import ELEMENTWISE, OPS

rng = np.random.default_rng(12)
INT_NP = [np.int64, np.int32, np.int16, np.uint8, np.uint32]
FLOAT_NP = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]


def name(dt):
    return np.dtype(dt).name


def data(shape, dt, lo=-9, hi=9):
    if np.dtype(dt).kind in "iu":
        lo = 0 if np.dtype(dt).kind == "u" else lo
        return rng.integers(lo, hi, shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def layouts(x, full=False):
    """(name, tensor) holding x's values with different strides: contiguous and transposed
    (all dims reversed; flipped for rank 1), and with `full` also narrowed out of a bigger
    buffer and flipped (negative strides).  Kept short: each stride pattern compiles kernels."""
    if not full:
        t = lc.tensor(np.ascontiguousarray(x.T)).T if x.ndim >= 2 else \
            lc.tensor(np.ascontiguousarray(x[::-1])).flip(0) if x.ndim else lc.tensor(x)
        return [("contiguous", lc.tensor(x)), ("strided", t)]
    out = [("contiguous", lc.tensor(x))]
    if x.ndim >= 2:
        out.append(("transposed", lc.tensor(np.ascontiguousarray(x.T)).T))
    if x.ndim >= 1:
        pad = np.concatenate([x[:1], x, x[:1]], axis=0) if x.shape[0] else np.zeros((2,) + x.shape[1:], x.dtype)
        out.append(("narrowed", lc.tensor(pad).narrow(0, 1, x.shape[0])))
        out.append(("flipped", lc.tensor(np.ascontiguousarray(x[::-1])).flip(0)))
    return out


def bcast(small, shape):
    """A broadcast tensor and the same NumPy values."""
    return lc.tensor(small).broadcast_as(shape), np.broadcast_to(small, shape)


def same(got, want):
    """Exact equality including NaN positions and the sign of zeros."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind == "f" or want.dtype == ml_dtypes.bfloat16:
        g, w = got.astype(np.float64), want.astype(np.float64)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        ok = ~np.isnan(w)
        np.testing.assert_array_equal(g[ok], w[ok])
        np.testing.assert_array_equal(np.signbit(g[ok]), np.signbit(w[ok]))
    else:
        np.testing.assert_array_equal(got, want)


def close(got, want, dt, rtol=None):
    tol = rtol or {np.float32: 1e-5, np.float64: 1e-12}.get(np.dtype(dt).type, 2e-2)
    got = np.asarray(got).astype(np.float64)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, np.asarray(want, np.float64), rtol=tol, atol=tol, equal_nan=True)


# ---- aliases -------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [np.float32, np.int32, ml_dtypes.bfloat16], ids=name)
def test_aliases_match_numpy_across_layouts(dt):
    x = data((3, 4, 5), dt)
    for lay, t in layouts(x):
        same(t.T.numpy(), x.T)
        same(t.mT.numpy(), np.swapaxes(x, -1, -2))
        same(t.swapaxes(0, -1).numpy(), np.swapaxes(x, 0, -1))
        same(t.view(12, 5).numpy(), x.reshape(12, 5))
        same(t.view((5, -1)).numpy(), x.reshape(5, -1))
        assert t.size() == (3, 4, 5) and t.size(-1) == 5 and t.size(0) == 3
        same(t.astype(lc.f64).numpy(), x.astype(np.float64))
        same(t.clip(-2, 3).numpy(), np.clip(x, dt(-2), dt(3)).astype(dt))
        same(t.clip(min=0).numpy(), np.maximum(x, dt(0)).astype(dt))
        same(t.clip(max=1).numpy(), np.minimum(x, dt(1)).astype(dt))


def test_alias_edge_cases():
    s = lc.tensor(np.float32(2.0))
    assert s.T.shape == () and s.size() == ()
    v = lc.tensor(np.arange(3.0, dtype=np.float32))
    assert v.T.shape == (3,)
    with pytest.raises(lc.DimOutOfRange):
        v.mT
    with pytest.raises(lc.DimOutOfRange):
        v.size(1)
    with pytest.raises(ValueError):
        v.clip()
    lo, hi = lc.tensor(np.float32([0, 1, 2])), lc.tensor(np.float32(1.5))
    same(v.clip(lo, hi).numpy(), np.clip(np.arange(3.0, dtype=np.float32), [0, 1, 2], 1.5).astype(np.float32))


def test_softmax_methods_and_masked_fill():
    x = data((4, 6), np.float32)
    t = lc.tensor(x)
    e = np.exp(x - x.max(1, keepdims=True))
    close(t.softmax(1).numpy(), e / e.sum(1, keepdims=True), np.float32)
    close(t.softmax(-1).numpy(), e / e.sum(1, keepdims=True), np.float32)
    close(t.log_softmax(-1).numpy(), np.log(e / e.sum(1, keepdims=True)), np.float32)
    m = x > 0
    same(t.masked_fill(t > 0, 0.0).numpy(), np.where(m, np.float32(0), x))
    same(t.masked_fill(lc.tensor(m[0]), -np.inf).numpy(), np.where(m[0], np.float32(-np.inf), x))
    same(t.masked_fill(lc.tensor(m[:, :1].astype(np.int64)), 7).numpy(), np.where(m[:, :1], np.float32(7), x))
    causal = lc.triu(lc.ones((4, 6), lc.u8), 1)
    same(t.masked_fill(causal, -np.inf).numpy(), np.where(np.triu(np.ones((4, 6), bool), 1), np.float32(-np.inf), x))
    same(t.masked_fill(m, lc.tensor(np.float32(5))).numpy(), np.where(m, np.float32(5), x))
    with pytest.raises(lc.BroadcastIncompatibleShapes):
        t.masked_fill(lc.ones((5,), lc.u8), 0.0)
    with pytest.raises(lc.UnsupportedDTypeForOp):
        t.masked_fill(t, 0.0)


# ---- // and % ------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", INT_NP, ids=name)
def test_int_floordiv_and_mod_like_numpy_with_zero_divisors(dt):
    x, y = data((60,), dt, -50, 50), data((60,), dt, -6, 6)
    y[:5] = 0
    tx, ty = lc.tensor(x), lc.tensor(y)
    with np.errstate(all="ignore"):
        same((tx // ty).numpy(), x // y)
        same((tx % ty).numpy(), x % y)
        same((tx // 4).numpy(), x // dt(4))
        same((tx % 4).numpy(), x % dt(4))
        same((17 // ty).numpy(), dt(17) // y)
        same((17 % ty).numpy(), dt(17) % y)
        same(tx.floor_divide(ty).numpy(), x // y)
        same(tx.remainder(ty).numpy(), x % y)


def test_int_floordiv_extremes_wrap_and_never_crash():
    lo = np.iinfo(np.int64).min
    x = lc.tensor(np.array([lo, lo, 7, -7, 0], np.int64))
    y = lc.tensor(np.array([-1, 0, 0, 0, 0], np.int64))
    assert (x // y).to_list() == [lo, 0, 0, 0, 0]
    assert (x % y).to_list() == [0, 0, 0, 0, 0]
    assert (lc.tensor(np.int32([-7, 7, -7])) // lc.tensor(np.int32([2, -2, -2]))).to_list() == [-4, -4, 3]
    assert (lc.tensor(np.int32([-7, 7, -7])) % lc.tensor(np.int32([2, -2, -2]))).to_list() == [1, -1, -1]


SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 0.1, 7.0, -7.0, 1e-30, 3e38, np.inf, -np.inf, np.nan])


@pytest.mark.parametrize("dt", FLOAT_NP, ids=name)
def test_float_floordiv_and_mod_exactly_numpy_on_special_values(dt):
    a, b = (g.ravel().astype(dt) for g in np.meshgrid(SPECIAL, SPECIAL))
    ta, tb = lc.tensor(a), lc.tensor(b)
    with np.errstate(all="ignore"):
        same((ta // tb).numpy(), a // b)
        same((ta % tb).numpy(), a % b)
        same((ta % 1.5).numpy(), a % dt(1.5))
        same((1.5 // tb).numpy(), dt(1.5) // b)


def test_float_mod_random_values_exact_across_layouts():
    x = (rng.standard_normal((5, 7)) * 100).astype(np.float64)
    y = rng.standard_normal((5, 7))
    for (_, tx), (_, ty) in zip(layouts(x), layouts(y)):
        same((tx % ty).numpy(), x % y)
        same((tx // ty).numpy(), x // y)
    tb, yb = bcast(y[:1], (5, 7))
    same((lc.tensor(x) % tb).numpy(), x % yb)


# ---- powers --------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", FLOAT_NP, ids=name)
def test_tensor_exponent_pow_matches_numpy_specials(dt):
    pv = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, 1e-3, 40.0, np.inf, -np.inf, np.nan])
    a, b = (g.ravel().astype(dt) for g in np.meshgrid(pv, pv))
    with np.errstate(all="ignore"):
        want = np.power(a.astype(np.float64), b.astype(np.float64)).astype(dt)
    got = (lc.tensor(a) ** lc.tensor(b)).numpy()
    close(got, want, dt, rtol=1e-6 if dt in (np.float32, np.float64) else 1e-2)
    num = ~np.isnan(want.astype(np.float64))        # a NaN's sign bit is not specified
    np.testing.assert_array_equal(np.signbit(got.astype(np.float64))[num], np.signbit(want.astype(np.float64))[num])


def test_pow_accuracy_broadcasting_and_scalar_base():
    x = rng.uniform(0.01, 4, (6, 1)).astype(np.float64)
    e = rng.uniform(-6, 6, (1, 9))
    close((lc.tensor(x) ** lc.tensor(e)).numpy(), x ** e, np.float64, rtol=4e-16)
    close(lc.tensor(x).pow(lc.tensor(e)).numpy(), x ** e, np.float64, rtol=4e-16)
    f = e.astype(np.float32)
    close((2 ** lc.tensor(f)).numpy(), np.float32(2) ** f, np.float32, rtol=2e-7)
    close((np.float32(0.5) ** lc.tensor(f)).numpy(), np.float32(0.5) ** f, np.float32, rtol=2e-7)


@pytest.mark.parametrize("dt", INT_NP, ids=name)
def test_integer_powers_wrap_like_numpy(dt):
    a, e = data((80,), dt, -9, 9), data((80,), dt, 0, 70)
    ta, te = lc.tensor(a), lc.tensor(e)
    with np.errstate(all="ignore"):
        same((ta ** te).numpy(), np.power(a, e))
        same((ta ** lc.tensor(dt(3))).numpy(), np.power(a, dt(3)))
        same((3 ** te).numpy(), np.power(dt(3), e))


@pytest.mark.parametrize("dt", INT_NP, ids=name)
@pytest.mark.parametrize("e", [2, 2.0, 0.5])
def test_scalar_exponent_is_powf_and_refuses_integers(dt, e):
    # SPEC: `t ** s` is powf, and powf raises UnsupportedDTypeForOp on integer dtypes
    with pytest.raises(lc.UnsupportedDTypeForOp, match="powf"):
        lc.tensor(data((4,), dt, 0, 5)) ** e


def test_negative_integer_exponent_truncates_never_crashes():
    # NumPy and torch refuse these; our integer rule truncates 1 / x^-e toward zero
    a = lc.tensor(np.int64([1, -1, -1, 0, 2, -3, 5]))
    e = lc.tensor(np.int64([-3, -3, -2, -1, -1, -2, 0]))
    assert (a ** e).to_list() == [1, -1, 1, 0, 0, 0, 1]


# ---- function forms ------------------------------------------------------------------------
def test_every_unary_op_has_a_function_form():
    from lazycandle.functions import UNARY_FUNCTIONS
    wanted = {n for n, k in OPS.items() if k.category == ELEMENTWISE and k.arity == 1 and hasattr(lc.Tensor, n)}
    assert wanted - {"copy"} == set(UNARY_FUNCTIONS)
    for n in ("exp", "log", "sqrt", "tanh", "abs", "neg", "floor", "relu", "sigmoid"):
        assert getattr(lc, n) is UNARY_FUNCTIONS[n]


@pytest.mark.parametrize("fname", sorted(n for n, k in OPS.items() if k.category == ELEMENTWISE and k.arity == 1
                                         and n not in ("copy", "cast", "affine", "clamp", "powf", "elu")))
def test_function_form_equals_method(fname):
    x = rng.uniform(0.1, 2, (3, 5)).astype(np.float32)
    t = lc.tensor(x)
    same(getattr(lc, fname)(t).numpy(), getattr(t, fname)().numpy())
    same(getattr(lc, fname)(x).numpy(), getattr(t, fname)().numpy())


def test_function_forms_with_arguments_and_matmul_concatenate():
    x = data((3, 4), np.float32)
    t = lc.tensor(x)
    same(lc.clamp(t, -1, 1).numpy(), np.clip(x, -1, 1))
    same(lc.affine(t, 2, 1).numpy(), t.affine(2, 1).numpy())
    y = data((4, 2), np.float32)
    close(lc.matmul(t, lc.tensor(y)).numpy(), x @ y, np.float32)
    v = data((4,), np.float32)
    close(lc.matmul(t, lc.tensor(v)).numpy(), x @ v, np.float32)
    close(lc.matmul(lc.tensor(x[0]), lc.tensor(y)).numpy(), x[0] @ y, np.float32)
    close(lc.matmul(lc.tensor(v), lc.tensor(v)).numpy(), v @ v, np.float32)
    b = data((2, 4, 2), np.float32)
    close(lc.matmul(t, lc.tensor(b)).numpy(), np.matmul(x, b), np.float32)
    close(lc.matmul(lc.tensor(x[0]), lc.tensor(b)).numpy(), np.matmul(x[0], b), np.float32)
    with pytest.raises(lc.ShapeMismatchBinaryOp):
        lc.matmul(lc.tensor(np.float32(1)), t)
    same(lc.concatenate([t, t], 1).numpy(), np.concatenate([x, x], 1))
    same(lc.concatenate([t, t], axis=0).numpy(), np.concatenate([x, x], 0))


# ---- where ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cdt", [np.uint8, np.uint32, np.int64, np.bool_], ids=name)
def test_where_broadcasts_all_three(cdt):
    c = rng.integers(0, 2, (3, 1)).astype(cdt)
    c[0] = 5 if cdt != np.bool_ else True
    a, b = data((1, 4), np.float32), data((2, 3, 4), np.float32)
    want = np.where(c.astype(bool), a, b)
    cond = c if cdt == np.bool_ else lc.tensor(c)
    same(lc.where(cond, lc.tensor(a), lc.tensor(b)).numpy(), want)
    same(lc.where(cond, 1.5, lc.tensor(b)).numpy(), np.where(c.astype(bool), np.float32(1.5), b))
    same(lc.where(cond, lc.tensor(a), 0).numpy(), np.where(c.astype(bool), a, np.float32(0)))


def test_where_scalars_dtypes_and_errors():
    c = lc.tensor(np.array([1, 0, 1], np.uint8))
    r = lc.where(c, 1.0, 0.0)
    assert r.dtype is lc.f32 and r.to_list() == [1.0, 0.0, 1.0]
    r = lc.where(c, 2, 3)
    assert r.dtype is lc.i64 and r.to_list() == [2, 3, 2]
    t = lc.tensor(np.arange(3, dtype=np.int32))
    assert lc.where(c, t, -1).to_list() == [0, -1, 2] and lc.where(c, t, -1).dtype is lc.i32
    with pytest.raises(lc.DTypeMismatchBinaryOp):
        lc.where(c, t, lc.tensor(np.arange(3.0)))
    with pytest.raises(lc.BroadcastIncompatibleShapes):
        lc.where(c, lc.zeros((4,)), 0.0)
    with pytest.raises(lc.UnsupportedDTypeForOp):
        lc.where(lc.zeros((3,)), 1.0, 0.0)


def test_no_implicit_promotion_in_new_binary_ops():
    a, b = lc.zeros((3,), lc.f32), lc.zeros((3,), lc.f64)
    for f in (lambda: a // b, lambda: a % b, lambda: a ** b, lambda: lc.zeros((3,), lc.i32) // lc.zeros((3,), lc.i64)):
        with pytest.raises(lc.DTypeMismatchBinaryOp):
            f()
    with pytest.raises(lc.UnsupportedDTypeForOp):
        lc.zeros((3,), lc.f4) // 2


# ---- reductions ----------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int32, np.uint8, np.float16], ids=name)
def test_reductions_without_dims_and_with_keepdim(dt):
    x = data((3, 4, 5), dt)
    x64 = x.astype(np.float64)
    for lay, t in layouts(x):
        if x.dtype.kind in "iu":
            same(t.sum().numpy(), x.sum(dtype=dt))
            same(t.sum(dim=-1, keepdim=True).numpy(), x.sum(-1, keepdims=True, dtype=dt))
            same(t.sum((0, 2)).numpy(), x.sum((0, 2), dtype=dt))
        else:
            close(t.sum().numpy(), x64.sum().astype(dt), dt)
            close(t.mean().numpy(), x64.mean().astype(dt), dt)
            close(t.mean(dim=(-1, 0), keepdim=True).numpy(), x64.mean((0, 2), keepdims=True).astype(dt), dt)
        same(t.max().numpy(), x.max())
        same(t.min().numpy(), x.min())
        same(t.max(-1, keepdim=True).numpy(), x.max(-1, keepdims=True))
        same(t.min(dim=1).numpy(), x.min(1))
        same(t.argmax(-2, keepdim=True).numpy(), x.argmax(-2, keepdims=True).astype(np.uint32))
        same(t.argmax().numpy(), np.uint32(x.argmax()))
        same(t.argmin().numpy(), np.uint32(x.argmin()))
        assert t.argmax(keepdim=True).shape == (1, 1, 1)


def test_candle_positional_forms_still_work():
    x = data((3, 4), np.float32)
    t = lc.tensor(x)
    close(t.sum(1).numpy(), x.sum(1), np.float32)
    close(t.sum((0, 1)).numpy(), x.sum(), np.float32)
    close(t.sum_keepdim(1).numpy(), x.sum(1, keepdims=True), np.float32)
    same(t.max(0).numpy(), x.max(0))
    same(t.argmax_keepdim(1).numpy(), x.argmax(1, keepdims=True).astype(np.uint32))
    close(t.sum(axis=0).numpy(), x.sum(0), np.float32)
    with pytest.raises(TypeError):
        t.sum(0, dim=1)


def test_reductions_rank0_and_zero_size():
    s = lc.tensor(np.float32(3.0))
    assert s.sum().item() == 3.0 and s.sum().shape == () and s.max().item() == 3.0
    assert s.prod().item() == 3.0 and s.argmax().item() == 0
    z = lc.zeros((0, 3))
    assert z.sum().item() == 0.0 and z.prod().item() == 1.0 and z.sum(0, keepdim=True).shape == (1, 3)
    same(z.prod(0).numpy(), np.ones(3, np.float32))
    assert math.isnan(z.mean().item())
    with pytest.raises(lc.EmptyReduction):
        z.max()
    with pytest.raises(lc.EmptyReduction):
        z.argmax()


@pytest.mark.parametrize("dt", INT_NP + [np.float32, np.float64, np.float16], ids=name)
def test_prod_keeps_integer_dtype_and_wraps(dt):
    x = data((4, 37), dt, -5, 6)
    if x.dtype.kind == "f":
        x = rng.uniform(0.5, 1.5, (4, 37)).astype(dt)
    for lay, t in layouts(x):
        if x.dtype.kind in "iu":
            same(t.prod(1).numpy(), x.prod(1, dtype=dt))
            same(t.prod(0, keepdim=True).numpy(), x.prod(0, keepdims=True, dtype=dt))
            same(t.prod().numpy(), x.prod(dtype=dt))
        else:
            close(t.prod(1).numpy(), x.astype(np.float64).prod(1).astype(dt), dt)
            close(t.prod(dim=0).numpy(), x.astype(np.float64).prod(0).astype(dt), dt)


def test_prod_fuses_its_producer():
    x = rng.uniform(0.9, 1.1, (8, 16)).astype(np.float32)
    t = lc.tensor(x)
    close((t * 2).prod_keepdim(1).numpy(), (x.astype(np.float64) * 2).prod(1, keepdims=True), np.float32)


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16], ids=name)
def test_var_std_like_torch(dt):
    x = data((4, 6, 3), dt)
    x64 = x.astype(np.float64)
    for lay, t in layouts(x):
        close(t.var(1).numpy(), x64.var(1, ddof=1).astype(dt), dt)
        close(t.var(dim=-1, keepdim=True, unbiased=False).numpy(), x64.var(-1, keepdims=True).astype(dt), dt)
        close(t.var().numpy(), x64.var(ddof=1).astype(dt), dt)
        close(t.std((0, 2)).numpy(), x64.std((0, 2), ddof=1).astype(dt), dt)
        close(t.std(unbiased=False).numpy(), x64.std().astype(dt), dt)


def test_var_of_one_element_is_nan_and_ints_raise():
    assert math.isnan(lc.tensor(np.float32([2.0])).var().item())
    assert lc.tensor(np.float32([2.0])).var(unbiased=False).item() == 0.0
    with pytest.raises(lc.UnsupportedDTypeForOp, match="^var"):
        lc.tensor(np.int32([1, 2])).var()
    # a correction past the count divides by max(0, n - correction), as torch and NumPy: inf here
    assert lc.tensor(np.float32([1.0, 2.0])).var(correction=2).item() == math.inf


@pytest.mark.parametrize("call, op", [
    (lambda a: a.var(3), "var"), (lambda a: a.std(3), "std"), (lambda a: a.logsumexp(3), "logsumexp"),
    (lambda a: a.norm(dim=3), "norm"), (lambda a: a.all(3), "all"), (lambda a: a.any(3), "any"),
    (lambda a: lc.nn.layer_norm(a, lc.ones((4,)), None), "layer_norm"),
    (lambda a: lc.nn.rms_norm(a, lc.ones((3,), lc.f64)), "rms_norm"),
    (lambda a: lc.nn.linear(a, lc.ones((4, 5))), "linear"),
    (lambda a: lc.nn.mse_loss(a, lc.ones((4,))), "mse_loss"),
    (lambda a: lc.nn.scaled_dot_product_attention(a[None], a[None], a[None], mask=lc.ones((5, 5))),
     "scaled_dot_product_attention")])
def test_errors_inside_composite_ops_name_the_op_called(call, op):
    with pytest.raises(lc.Error, match=f"^{op}: "):
        call(lc.ones((2, 3)))


def _logsumexp(x, axis, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    r = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return r if keepdims else (np.squeeze(r, axis) if axis is not None else r.reshape(()))


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16], ids=name)
def test_logsumexp_stable(dt):
    x = (data((5, 7), np.float64) * 30).astype(dt)
    x64 = x.astype(np.float64)
    for lay, t in layouts(x):
        close(t.logsumexp(1).numpy(), _logsumexp(x64, 1).astype(dt), dt)
        close(t.logsumexp(0, keepdim=True).numpy(), _logsumexp(x64, 0, True).astype(dt), dt)
        close(t.logsumexp().numpy(), _logsumexp(x64, None).astype(dt), dt)
    big = lc.tensor(np.float32([[1000.0, 1000.0]]))
    close(big.logsumexp(1).numpy(), np.float32([1000 + math.log(2)]), np.float32)


def test_logsumexp_infinities_and_nan_like_torch():
    x = lc.tensor(np.float32([[-np.inf, -np.inf], [np.inf, 1.0], [np.nan, 1.0], [np.inf, -np.inf]]))
    got = x.logsumexp(1).to_list()
    # torch.logsumexp gives [-inf, inf, nan, inf] for these rows
    assert got[0] == -math.inf and got[1] == math.inf and math.isnan(got[2]) and got[3] == math.inf
    assert lc.zeros((3, 0)).logsumexp(1).to_list() == [-math.inf] * 3
    with pytest.raises(lc.UnsupportedDTypeForOp):
        lc.tensor(np.int64([1])).logsumexp(0)


@pytest.mark.parametrize("dt", [np.float32, np.float64, ml_dtypes.bfloat16], ids=name)
def test_norm_frobenius(dt):
    x = data((3, 4, 5), dt)
    x64 = x.astype(np.float64)
    for lay, t in layouts(x):
        close(t.norm().numpy(), np.float64(np.linalg.norm(x64.ravel())).astype(dt), dt)
        close(t.norm(-1).numpy(), np.linalg.norm(x64, axis=-1).astype(dt), dt)
        close(t.norm(dim=(0, 1), keepdim=True).numpy(), np.sqrt((x64 ** 2).sum((0, 1), keepdims=True)).astype(dt), dt)


@pytest.mark.parametrize("dt", [np.float32, np.int64, np.uint8], ids=name)
def test_all_any(dt):
    x = rng.integers(0, 2, (4, 5)).astype(dt)
    x[0] = 1
    for lay, t in layouts(x):
        same(t.all().numpy(), np.uint8(x.all()))
        same(t.any().numpy(), np.uint8(x.any()))
        same(t.all(1).numpy(), x.all(1).astype(np.uint8))
        same(t.any(dim=0, keepdim=True).numpy(), x.any(0, keepdims=True).astype(np.uint8))
        same((t > 0).all(-1).numpy(), (x > 0).all(-1).astype(np.uint8))
    empty = lc.zeros((0, 2))
    # torch: all of nothing is True, any of nothing is False; NaN counts as nonzero
    assert empty.all().item() == 1 and empty.any().item() == 0 and empty.all(0).to_list() == [1, 1]
    assert lc.tensor(np.float32([np.nan, 1])).all().item() == 1


# ---- indexing ------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [np.float32, np.int16, ml_dtypes.bfloat16], ids=name)
def test_index_by_ids(dt):
    x = data((5, 3, 2), dt)
    for lay, t in layouts(x):
        same(t[[4, 0, 0, 2]].numpy(), x[[4, 0, 0, 2]])
        same(t[[-1, -5]].numpy(), x[[-1, -5]])
        same(t[lc.tensor(np.int64([3, -2]))].numpy(), x[[3, -2]])
        same(t[lc.tensor(np.uint32([1, 2]))].numpy(), x[[1, 2]])
        same(t[np.array([[0, 1], [4, 4]])].numpy(), x[[[0, 1], [4, 4]]])
        same(t[lc.tensor(np.int64(2))].numpy(), x[2])
        assert t[[]].shape == (0, 3, 2)


def test_index_ids_out_of_range_and_bad_dtypes():
    t = lc.zeros((3, 2))
    with pytest.raises(lc.IndexOutOfBounds):
        t[[3]].numpy()
    with pytest.raises(lc.IndexOutOfBounds):
        t[[-4]].numpy()
    with pytest.raises(lc.UnsupportedDTypeForOp):
        t[lc.zeros((2,))]
    with pytest.raises(lc.IndexOutOfBounds):
        lc.tensor(np.float32(1))[[0]]


@pytest.mark.parametrize("dt", [np.float32, np.int64, ml_dtypes.bfloat16], ids=name)
def test_boolean_mask_index(dt):
    x = data((4, 5, 3), dt)
    for lay, t in layouts(x):
        same(t[t > 0].numpy(), x[x > 0])
        same(t[lc.tensor(x[:, :, 0] > 0)].numpy(), x[x[:, :, 0] > 0])
        same(t[x[:, 0, 0] > 0].numpy(), x[x[:, 0, 0] > 0])
        same(t[[True, False, True, True]].numpy(), x[[True, False, True, True]])
        assert t[t > 100].shape == (0,)


def test_boolean_mask_ids_come_from_the_nonzero_kernel():
    x = data((6, 4), np.float32)
    t = lc.tensor(x)
    r = t[t.narrow(1, 0, 1).squeeze(1) > 0]
    srcs, seen = [r._node], set()
    while srcs:
        n = srcs.pop()
        seen.add(n.op.name)
        srcs.extend(n.srcs)
    assert "nonzero" in seen
    same(r.numpy(), x[x[:, 0] > 0])
    with pytest.raises(lc.IndexOutOfBounds):
        t[np.ones(4, bool)]
    mask = lc.tensor(np.uint8([0, 2, 0, 1, 1, 0]))      # any nonzero u8 counts
    same(t[mask].numpy(), x[[1, 3, 4]])


NEG_SLICES = [
    (slice(None, None, -1),),
    (slice(5, 1, -2),),
    (slice(None), slice(None, None, -1)),
    (slice(-1, None, -3), slice(3, None, -1)),
    (slice(1, 6, 2), slice(None, 0, -2)),
    (slice(2, 2, -1),),
    (slice(None, None, -1), 2),
    (Ellipsis, slice(None, None, -1)),
]


@pytest.mark.parametrize("idx", NEG_SLICES, ids=repr)
def test_negative_slice_steps_are_views(idx):
    x = data((7, 6, 3), np.float32)
    for lay, t in layouts(x, full=True):
        v = t[idx]
        assert v._node.op.name in ("view", "buffer")
        same(v.numpy(), x[idx])
        same((v * 2 + 1).numpy(), x[idx] * 2 + 1)
        if v.rank:
            close(v.sum(-1).numpy(), x[idx].astype(np.float64).sum(-1), np.float32)
            same(v.contiguous().numpy(), np.ascontiguousarray(x[idx]))
            same(v.reshape(-1).numpy(), x[idx].reshape(-1))


def test_zero_slice_step_raises():
    with pytest.raises(ValueError):
        lc.zeros((3,))[::0]


def test_flip_views_feed_every_kernel_kind():
    x = data((4, 5, 6), np.float32)
    t = lc.tensor(x)
    f = t.flip((0, -1))
    want = x[::-1, :, ::-1]
    assert f._node.op.name == "view"
    same(f.numpy(), want)
    same(t.flip(1).numpy(), x[:, ::-1])
    same(t.flip([]).numpy(), x)
    same(t.flip(0).flip(0).numpy(), x)
    close(f.matmul(f.mT).numpy(), np.matmul(want, np.swapaxes(want, 1, 2)), np.float32)
    close(f.max(0).numpy(), want.max(0), np.float32)
    same(f.argmax(-1).numpy(), want.argmax(-1).astype(np.uint32))
    same(f.index_select(lc.tensor([2, 0]), 1).numpy(), want[:, [2, 0]])
    same(f.gather(lc.tensor(np.zeros((4, 5, 2), np.int64)), 2).numpy(), np.take_along_axis(want, np.zeros((4, 5, 2), np.int64), 2))
    same(lc.cat([f, t], 1).numpy(), np.concatenate([want, x], 1))
    k = data((2, 5, 3), np.float32)
    close(f.conv1d(lc.tensor(k)).numpy(), lc.tensor(np.ascontiguousarray(want)).conv1d(lc.tensor(k)).numpy(), np.float32)
    same(lc.zeros((0, 3)).flip(0).numpy(), np.zeros((0, 3), np.float32))
    with pytest.raises(lc.DimOutOfRange):
        t.flip((0, 0))
    with pytest.raises(lc.DimOutOfRange):
        t.flip(3)


# ---- creation ------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [lc.f32, lc.f64, lc.bf16, lc.i64, lc.u8], ids=lambda d: d.name)
def test_eye(dt):
    same(lc.eye(3, dtype=dt).numpy(), np.eye(3, dtype=dt.numpy))
    same(lc.eye(2, 5, dt).numpy(), np.eye(2, 5, dtype=dt.numpy))
    same(lc.eye(4, 1, dtype=dt).numpy(), np.eye(4, 1, dtype=dt.numpy))
    assert lc.eye(0).shape == (0, 0) and lc.eye(3).dtype is lc.f32


@pytest.mark.parametrize("dt", [lc.f32, lc.f64, lc.f16, lc.i64, lc.i32], ids=lambda d: d.name)
def test_linspace(dt):
    for args in ((0, 1, 5), (-3, 10, 7), (2, 2, 1), (1, 0, 0), (5, -5, 4)):
        want = np.linspace(*args, dtype=dt.numpy) if dt.is_int else np.linspace(*args).astype(dt.numpy)
        same(lc.linspace(*args, dtype=dt).numpy(), want)
    assert lc.linspace(0, 1, 3).dtype is lc.f32
    with pytest.raises(ValueError):
        lc.linspace(0, 1, -1)


@pytest.mark.parametrize("dt", [np.float32, np.int32, ml_dtypes.bfloat16], ids=name)
@pytest.mark.parametrize("k", [-2, -1, 0, 1, 3])
def test_tril_triu(dt, k):
    x = data((2, 4, 5), dt)
    for lay, t in layouts(x):
        same(t.tril(k).numpy(), np.tril(x, k))
        same(t.triu(k).numpy(), np.triu(x, k))
        same(lc.tril(t, k).numpy(), np.tril(x, k))
        same(lc.triu(t, k=k).numpy(), np.triu(x, k))


def test_tril_rank_errors_and_full_orders():
    with pytest.raises(lc.DimOutOfRange):
        lc.zeros((3,)).tril()
    same(lc.tril(lc.ones((3, 3), lc.u8)).numpy(), np.tril(np.ones((3, 3), np.uint8)))
    same(lc.full((2, 3), 1.5).numpy(), np.full((2, 3), 1.5, np.float32))
    same(lc.full([4], 7, lc.i32).numpy(), np.full(4, 7, np.int32))
    same(lc.full(2.5, (2,)).numpy(), np.full(2, 2.5, np.float32))
    same(lc.full((), 3.0).numpy(), np.float32(3.0))


# ---- shapes by hypothesis ------------------------------------------------------------------
_shapes = st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple)


@settings(max_examples=25, deadline=None)
@given(shape=_shapes, data=st.data())
def test_hypothesis_reductions_flip_and_steps(shape, data):
    x = rng.standard_normal(shape).astype(np.float64)
    t = lc.tensor(x)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    keep = data.draw(st.booleans())
    close(t.sum(dim=dim, keepdim=keep).numpy(), x.sum(dim, keepdims=keep), np.float64)
    close(t.prod(dim, keepdim=keep).numpy(), x.prod(dim, keepdims=keep), np.float64)
    if x.size:
        same(t.max(dim, keep).numpy(), x.max(dim, keepdims=keep))
        close(t.logsumexp(dim).numpy(), _logsumexp(x, dim), np.float64)
    same(t.flip(dim).numpy(), np.flip(x, dim))
    start = data.draw(st.none() | st.integers(-5, 5))
    stop = data.draw(st.none() | st.integers(-5, 5))
    step = data.draw(st.sampled_from([-3, -2, -1, 1, 2]))
    idx = (slice(start, stop, step),)
    same(t[idx].numpy(), x[idx])
    same(t[x > 0].numpy(), x[x > 0])
