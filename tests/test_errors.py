"""Typed errors: every SPEC error class, raised at the op call (not at realize), deriving from
lc.Error and the matching built-in, with the op, shapes and dtypes in the message."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from conftest import STORAGE_ONLY, ids

HIERARCHY = {
    "DTypeMismatchBinaryOp": TypeError,
    "UnsupportedDTypeForOp": TypeError,
    "UnsupportedDType": TypeError,
    "ShapeMismatchBinaryOp": ValueError,
    "BroadcastIncompatibleShapes": ValueError,
    "ShapeMismatch": ValueError,
    "DimOutOfRange": IndexError,
    "NarrowInvalidArgs": ValueError,
    "IndexOutOfBounds": IndexError,
    "EmptyReduction": ValueError,
    "UnboundPlaceholder": None,
    "FeedError": ValueError,
}


@pytest.mark.parametrize("name", sorted(HIERARCHY))
def test_error_class_hierarchy(name):
    cls = getattr(lc, name)
    assert issubclass(cls, lc.Error)
    assert issubclass(lc.Error, Exception)
    builtin = HIERARCHY[name]
    if builtin is not None:
        assert issubclass(cls, builtin)


def f32(*shape):
    return lc.tensor(np.zeros(shape, np.float32))


def t_of(dt, *shape):
    return lc.tensor(np.zeros(shape, np.float32).astype(dt.numpy))


def _lazy(*shape, dt=lc.f32):
    """A lazy (unrealized) tensor: errors must come before anything is computed."""
    return t_of(dt, *shape) + t_of(dt, *shape)


def check_msg(excinfo, *needles):
    msg = str(excinfo.value)
    for n in needles:
        assert str(n) in msg, f"message {msg!r} does not mention {n!r}"


# ---- DTypeMismatchBinaryOp -----------------------------------------------------------------
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum", "eq", "lt", "ge",
                                "broadcast_add", "broadcast_mul", "broadcast_maximum", "broadcast_ne"])
def test_dtype_mismatch_binary(op):
    a, b = _lazy(2, 3), _lazy(2, 3, dt=lc.f64)
    with pytest.raises(lc.DTypeMismatchBinaryOp) as ei:
        getattr(a, op)(b)
    check_msg(ei, op.replace("broadcast_", ""), "f32", "f64", "(2, 3)")
    assert a.is_lazy and b.is_lazy


def test_dtype_mismatch_operators_and_where():
    a, b = _lazy(4), _lazy(4, dt=lc.i32)
    for f in (lambda: a + b, lambda: a - b, lambda: b * a, lambda: a / b, lambda: a < b):
        with pytest.raises(lc.DTypeMismatchBinaryOp) as ei:
            f()
        check_msg(ei, "f32", "i32")
    m = t_of(lc.u8, 4)
    with pytest.raises(lc.DTypeMismatchBinaryOp) as ei:
        m.where_cond(a, b)
    check_msg(ei, "where", "f32", "i32", "(4,)")
    with pytest.raises(TypeError):
        a + t_of(lc.bf16, 4)


# ---- UnsupportedDTypeForOp -----------------------------------------------------------------
FLOAT_ONLY = ["exp", "log", "sin", "cos", "tanh", "erf", "gelu", "gelu_erf", "silu", "sigmoid", "sqrt", "recip"]


@pytest.mark.parametrize("dt", [lc.u8, lc.u32, lc.i16, lc.i32, lc.i64], ids=["u8", "u32", "i16", "i32", "i64"])
@pytest.mark.parametrize("op", FLOAT_ONLY + ["powf", "elu", "pow_operator"])
def test_float_only_op_on_int(op, dt):
    t = _lazy(3, 2, dt=dt)
    with pytest.raises(lc.UnsupportedDTypeForOp) as ei:
        if op == "powf":
            t.powf(2.0)
        elif op == "elu":
            t.elu(1.0)
        elif op == "pow_operator":
            t ** 2.0
        else:
            getattr(t, op)()
    check_msg(ei, dt.name, "(3, 2)")
    if op != "pow_operator":
        check_msg(ei, op)
    assert t.is_lazy


STORAGE_OPS = {
    "neg": lambda t, o: t.neg(), "exp": lambda t, o: t.exp(), "abs": lambda t, o: t.abs(),
    "relu": lambda t, o: t.relu(), "round": lambda t, o: t.round(), "sqr": lambda t, o: t.sqr(),
    "affine": lambda t, o: t.affine(2.0, 1.0), "clamp": lambda t, o: t.clamp(0.0, 1.0),
    "add": lambda t, o: t.add(o), "mul": lambda t, o: t * o, "div": lambda t, o: t / o,
    "maximum": lambda t, o: t.maximum(o), "scalar_add": lambda t, o: t + 1.0, "rsub": lambda t, o: 1.0 - t,
    "broadcast_sub": lambda t, o: t.broadcast_sub(o),
}


@pytest.mark.parametrize("dt", STORAGE_ONLY, ids=ids(STORAGE_ONLY))
@pytest.mark.parametrize("op", list(STORAGE_OPS))
def test_storage_only_arithmetic_raises(op, dt):
    t = t_of(dt, 2, 3)
    o = t_of(dt, 2, 3)
    with pytest.raises(lc.UnsupportedDTypeForOp) as ei:
        STORAGE_OPS[op](t, o)
    check_msg(ei, dt.name, "(2, 3)")


@pytest.mark.parametrize("dt", STORAGE_ONLY, ids=ids(STORAGE_ONLY))
def test_storage_only_reductions_raise(dt):
    t = t_of(dt, 2, 3)
    if not hasattr(t, "sum"):
        pytest.skip("reductions not implemented yet")
    for f in (lambda: t.sum(0), lambda: t.max(1), lambda: t.sum_all()):
        with pytest.raises(lc.UnsupportedDTypeForOp):
            f()


def test_mean_of_int_raises():
    t = t_of(lc.i32, 3, 4)
    if not hasattr(t, "mean"):
        pytest.skip("reductions not implemented yet")
    with pytest.raises(lc.UnsupportedDTypeForOp) as ei:
        t.mean(0)
    check_msg(ei, "mean", "i32")


# ---- UnsupportedDType ----------------------------------------------------------------------
def test_unsupported_dtype():
    with pytest.raises(lc.UnsupportedDType) as ei:
        lc.DType.from_name("f128")
    check_msg(ei, "f128")
    with pytest.raises(lc.UnsupportedDType):
        lc.tensor(np.array([1 + 1j]))
    with pytest.raises(lc.UnsupportedDType):
        lc.DType.from_numpy(np.complex64)
    with pytest.raises(TypeError):
        lc.tensor(np.array(["x"]))


# ---- ShapeMismatchBinaryOp -----------------------------------------------------------------
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"])
def test_shape_mismatch_binary(op):
    a, b = _lazy(2, 3), _lazy(3, 2)
    with pytest.raises(lc.ShapeMismatchBinaryOp) as ei:
        getattr(a, op)(b)
    check_msg(ei, op, "(2, 3)", "(3, 2)")
    assert a.is_lazy and b.is_lazy
    # same-shape ops do not broadcast either
    with pytest.raises(lc.ShapeMismatchBinaryOp):
        getattr(_lazy(2, 3), op)(_lazy(1, 3))
    with pytest.raises(ValueError):
        getattr(_lazy(4), op)(_lazy(4, 1))


def test_where_cond_shape_mismatch():
    m = t_of(lc.u8, 2, 3)
    with pytest.raises(lc.ShapeMismatchBinaryOp) as ei:
        m.where_cond(_lazy(2, 3), _lazy(3, 2))
    check_msg(ei, "where", "(2, 3)", "(3, 2)")
    with pytest.raises(lc.ShapeMismatchBinaryOp):
        t_of(lc.u8, 3).where_cond(_lazy(2, 3), _lazy(2, 3))


def test_matmul_batch_shape_mismatch():
    a = _lazy(2, 3, 4)
    if not hasattr(a, "matmul"):
        pytest.skip("matmul not implemented yet")
    with pytest.raises(lc.ShapeMismatchBinaryOp) as ei:
        a.matmul(_lazy(3, 4, 5))
    check_msg(ei, "matmul")


# ---- BroadcastIncompatibleShapes -----------------------------------------------------------
@pytest.mark.parametrize("op", ["broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_div",
                                "broadcast_maximum", "broadcast_minimum", "broadcast_eq", "broadcast_lt"])
def test_broadcast_incompatible(op):
    a, b = _lazy(2, 3), _lazy(4,)
    with pytest.raises(lc.BroadcastIncompatibleShapes) as ei:
        getattr(a, op)(b)
    check_msg(ei, "(2, 3)", "(4,)")
    check_msg(ei, op.replace("broadcast_", ""))


def test_broadcast_incompatible_operators_and_views():
    a, b = _lazy(3, 2), _lazy(3,)
    for f in (lambda: a + b, lambda: a * b, lambda: b - a, lambda: a / b, lambda: a < b):
        with pytest.raises(lc.BroadcastIncompatibleShapes) as ei:
            f()
        check_msg(ei, "(3, 2)", "(3,)")
    with pytest.raises(lc.BroadcastIncompatibleShapes) as ei:
        _lazy(3).broadcast_as((4,))
    check_msg(ei, "broadcast_as", "(3,)", "(4,)")
    with pytest.raises(lc.BroadcastIncompatibleShapes):
        _lazy(2, 3).broadcast_as((3,))
    with pytest.raises(lc.BroadcastIncompatibleShapes):
        _lazy(2, 3).expand((2, 4))
    with pytest.raises(ValueError):
        _lazy(2, 3).broadcast_left((5,)).broadcast_as((5, 3, 3))


# ---- ShapeMismatch -------------------------------------------------------------------------
def test_reshape_shape_mismatch():
    a = _lazy(2, 3)
    with pytest.raises(lc.ShapeMismatch) as ei:
        a.reshape((4, 2))
    check_msg(ei, "reshape", "(2, 3)", "(4, 2)")
    with pytest.raises(lc.ShapeMismatch):
        a.reshape((-1, 4))
    with pytest.raises(lc.ShapeMismatch):
        a.reshape((-1, -1))
    with pytest.raises(ValueError):
        a.t().reshape((7,))
    assert a.is_lazy


# ---- DimOutOfRange -------------------------------------------------------------------------
@pytest.mark.parametrize("name,f", [
    ("transpose", lambda t: t.transpose(0, 3)),
    ("transpose", lambda t: t.transpose(-4, 0)),
    ("narrow", lambda t: t.narrow(3, 0, 1)),
    ("narrow", lambda t: t.narrow(-4, 0, 1)),
    ("unsqueeze", lambda t: t.unsqueeze(4)),
    ("unsqueeze", lambda t: t.unsqueeze(-5)),
    ("squeeze", lambda t: t.squeeze(3)),
    ("permute", lambda t: t.permute((0, 1, 3))),
    ("permute", lambda t: t.permute((0, 1))),
    ("permute", lambda t: t.permute((0, 0, 1))),
    ("flatten", lambda t: t.flatten(0, 5)),
    ("chunk", lambda t: t.chunk(2, 3)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_dim_out_of_range(name, f):
    t = _lazy(2, 3, 4)
    with pytest.raises(lc.DimOutOfRange) as ei:
        f(t)
    check_msg(ei, name, "(2, 3, 4)")
    assert t.is_lazy


def test_dim_out_of_range_message_names_shape():
    with pytest.raises(lc.DimOutOfRange) as ei:
        _lazy(2, 3, 4).transpose(0, 7)
    check_msg(ei, "transpose", "7", "(2, 3, 4)")


def test_t_on_rank1_and_reduction_dims():
    with pytest.raises(lc.DimOutOfRange):
        _lazy(5).t()
    t = _lazy(2, 3)
    if not hasattr(t, "sum"):
        pytest.skip("reductions not implemented yet")
    with pytest.raises(lc.DimOutOfRange) as ei:
        t.sum(2)
    check_msg(ei, "sum")
    with pytest.raises(lc.DimOutOfRange):
        t.max(-3)


# ---- NarrowInvalidArgs ---------------------------------------------------------------------
@pytest.mark.parametrize("start,length", [(2, 5), (5, 0), (-1, 2), (0, -1), (4, 1)])
def test_narrow_invalid(start, length):
    t = _lazy(4, 6)
    with pytest.raises(lc.NarrowInvalidArgs) as ei:
        t.narrow(0, start, length)
    check_msg(ei, "narrow", "(4, 6)")
    assert t.is_lazy


# ---- IndexOutOfBounds / IndexError ---------------------------------------------------------
def test_indexing_out_of_range():
    t = _lazy(3, 4)
    with pytest.raises(IndexError):
        t[3]
    with pytest.raises(IndexError):
        t[-4]
    with pytest.raises(IndexError):
        t[0, 4]
    with pytest.raises(IndexError):
        t[0, 0, 0]
    with pytest.raises(lc.Error):
        t[1, 9]


def test_index_select_out_of_bounds():
    t = _lazy(3, 4)
    if not hasattr(t, "index_select"):
        pytest.skip("index ops not implemented yet")
    ids_ = lc.tensor(np.array([0, 3], np.int64))
    with pytest.raises(lc.IndexOutOfBounds):
        t.index_select(ids_, 0).numpy()
    neg = lc.tensor(np.array([0, -1], np.int64))
    with pytest.raises(lc.IndexOutOfBounds):
        t.index_select(neg, 1).numpy()


# ---- EmptyReduction ------------------------------------------------------------------------
def test_empty_reduction():
    t = _lazy(0, 3)
    if not hasattr(t, "max"):
        pytest.skip("reductions not implemented yet")
    for f in (lambda: t.max(0), lambda: t.min(0), lambda: t.argmax(0), lambda: t.argmin_keepdim(0),
              lambda: t.max_all()):
        with pytest.raises(lc.EmptyReduction):
            f()
    # a sum over a zero-length dim is fine (0)
    np.testing.assert_array_equal(t.sum(0).numpy(), np.zeros(3, np.float32))


# ---- UnboundPlaceholder / FeedError --------------------------------------------------------
def test_unbound_placeholder():
    p = lc.placeholder("x", (2, 3), lc.f32)
    with pytest.raises(lc.UnboundPlaceholder) as ei:
        p.numpy()
    check_msg(ei, "x")
    y = (p * 2.0).exp()
    with pytest.raises(lc.UnboundPlaceholder):
        y.numpy()
    with pytest.raises(lc.Error):
        lc.realize(y)


def test_feed_error():
    if not hasattr(lc, "compile"):
        pytest.skip("lc.compile not implemented yet")
    x = lc.placeholder("x", (2, 3), lc.f32)
    prog = lc.compile([(x * 2.0).exp()])
    good = np.zeros((2, 3), np.float32)
    np.testing.assert_allclose(prog.run(x=good)[0], np.ones((2, 3), np.float32))
    for feeds, needles in (({}, ["x"]), ({"x": good, "y": good}, ["y"]),
                           ({"x": np.zeros((3, 2), np.float32)}, ["x", "(2, 3)", "(3, 2)"]),
                           ({"x": np.zeros((2, 3), np.float64)}, ["x", "f32"])):
        with pytest.raises(lc.FeedError) as ei:
            prog.run(**feeds)
        check_msg(ei, *needles)


# ---- every message names the op, a shape and the dtype (SPEC "Errors") ---------------------
NAMED = [   # (op the message starts with, class, bad call, a shape and the dtype it must name)
    ("broadcast_add", lc.BroadcastIncompatibleShapes, lambda: _lazy(2, 3) + _lazy(4), "(2, 3)", "f32"),
    ("broadcast_add", lc.DTypeMismatchBinaryOp, lambda: _lazy(2, 3).broadcast_add(_lazy(3, dt=lc.f64)),
     "(2, 3)", "f64"),
    ("broadcast_as", lc.BroadcastIncompatibleShapes, lambda: _lazy(3, dt=lc.i64).broadcast_as((4,)), "(3,)", "i64"),
    ("masked_fill", lc.BroadcastIncompatibleShapes, lambda: _lazy(2, 3).masked_fill(t_of(lc.u8, 4), 0.0),
     "(2, 3)", "f32"),
    ("reshape", lc.ShapeMismatch, lambda: _lazy(2, 3).reshape((4, 2)), "(2, 3)", "f32"),
    ("sum", lc.DimOutOfRange, lambda: _lazy(2, 3, dt=lc.i32).sum(3), "(2, 3)", "i32"),
    ("transpose", lc.DimOutOfRange, lambda: _lazy(2, 3, dt=lc.bf16).transpose(0, 2), "(2, 3)", "bf16"),
    ("narrow", lc.NarrowInvalidArgs, lambda: _lazy(4, 6).narrow(1, 2, 5), "(4, 6)", "f32"),
    ("mT", lc.DimOutOfRange, lambda: _lazy(3, dt=lc.f64).mT, "(3,)", "f64"),
    ("index_select", lc.DimOutOfRange, lambda: _lazy(2, 3).index_select(t_of(lc.i64, 1), 2), "(2, 3)", "f32"),
    ("pad_with_zeros", lc.NarrowInvalidArgs, lambda: _lazy(2, 3).pad_with_zeros(0, -1, 1), "(2, 3)", "f32"),
    ("softmax", lc.DimOutOfRange, lambda: _lazy(2, 3).softmax(2), "(2, 3)", "f32"),
    ("topk", lc.DimOutOfRange, lambda: _lazy(2, 3, dt=lc.i32).topk(1, 5), "(2, 3)", "i32"),
    ("slice_assign", lc.NarrowInvalidArgs, lambda: _lazy(2, 3).slice_assign([slice(0, 2, 2)], _lazy(1, 3)),
     "(2, 3)", "f32"),
    ("max", lc.EmptyReduction, lambda: _lazy(0, 3).max(0), "(0, 3)", "f32"),
    ("where_cond", lc.ShapeMismatchBinaryOp, lambda: t_of(lc.u8, 2, 3).where_cond(_lazy(2, 3), _lazy(3, 2)),
     "(3, 2)", "f32"),
    ("mean", lc.UnsupportedDTypeForOp, lambda: _lazy(3, 4, dt=lc.i32).mean(0), "(3, 4)", "i32"),
    ("to_dtype", lc.UnsupportedDType, lambda: _lazy(2, 3).to_dtype("x"), "(2, 3)", "f32"),
]


@pytest.mark.parametrize("op,cls,call,shape,dt", NAMED, ids=[f"{c[0]}-{c[1].__name__}" for c in NAMED])
def test_message_names_op_shape_and_dtype(op, cls, call, shape, dt):
    with pytest.raises(cls) as ei:
        call()
    assert str(ei.value).startswith(op + ":"), str(ei.value)
    check_msg(ei, shape, dt)


# ---- errors never leave partial state ------------------------------------------------------
def test_errors_do_not_realize_or_break_the_graph():
    a = _lazy(2, 3)
    for f in (lambda: a + _lazy(3, 2), lambda: a.add(_lazy(2, 3, dt=lc.f64)), lambda: a.narrow(1, 2, 5),
              lambda: a.reshape((5,)), lambda: a.transpose(0, 2)):
        with pytest.raises(lc.Error):
            f()
    assert a.is_lazy
    np.testing.assert_array_equal((a + 1.0).numpy(), np.ones((2, 3), np.float32))
