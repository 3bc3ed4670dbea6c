"""Fusion: elementwise DAGs become one kernel; shared values are computed once; rebuilt graphs
hit the compile cache; low-precision chains give bit for bit the op-at-a-time results; 1 and 2
threads give identical results."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.codegen import jit
from lazycandle.ir.graph import capture
from lazycandle.compiler import schedule_capture
from conftest import LOWP, assert_same, data, ids, rng_for


def sched(*ts):
    cap = capture([t._node for t in ts])
    kernels, mat, notes = schedule_capture(cap)
    return cap, kernels, mat, notes


def _f32(shape, seed, lo=-1.0, hi=1.0):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def _instr_ops(kernel):
    return [ins[0] for ins in kernel.spec.instrs]


# ---- one kernel ----------------------------------------------------------------------------
def test_mul_add_exp_is_one_kernel():
    a, b, c = (lc.tensor(_f32((64, 33), s)) for s in range(3))
    y = (a * b + c).exp()
    cap, kernels, mat, _ = sched(y)
    assert len(kernels) == 1
    assert kernels[0].kind == "elementwise"
    assert len(kernels[0].outputs) == 1
    assert len(mat) == 1          # only the result is written to memory
    an, bn, cn = (a.numpy(), b.numpy(), c.numpy())
    np.testing.assert_allclose(y.numpy(), np.exp(an * bn + cn), rtol=1e-6, atol=1e-6)


def test_transposed_plus_tensor_times_two_is_one_kernel():
    A = lc.tensor(_f32((17, 9), 1))
    B = lc.tensor(_f32((9, 17), 2))
    y = (A.t() + B) * 2
    _, kernels, mat, _ = sched(y)
    assert len(kernels) == 1 and len(mat) == 1
    assert_same(y.numpy(), (A.numpy().T + B.numpy()) * np.float32(2))


def test_mixed_layout_inputs_are_one_kernel():
    base = lc.tensor(_f32((8, 40), 3))
    a = base[:, ::2]                        # stepped (8, 20)
    b = lc.tensor(_f32((20, 8), 4)).t()     # transposed
    c = lc.tensor(_f32((20,), 5)).broadcast_as((8, 20))
    d = base.narrow(1, 3, 20)               # narrowed, same buffer as a
    y = ((a * b - c).maximum(d) + 1.0).tanh()
    _, kernels, _, _ = sched(y)
    assert len(kernels) == 1
    an, bn, cn, dn = base.numpy()[:, ::2], b.numpy(), c.numpy(), base.numpy()[:, 3:23]
    np.testing.assert_allclose(y.numpy(), np.tanh(np.maximum(an * bn - cn, dn) + 1), rtol=1e-6, atol=1e-6)


def test_comparison_where_cast_chain_is_one_kernel():
    a = lc.tensor(_f32((5, 7), 6))
    b = lc.tensor(_f32((5, 7), 7))
    m = a.gt(b)
    y = m.where_cond(a.exp(), b.neg()).to_dtype(lc.bf16).to_dtype(lc.f32) * 3.0
    _, kernels, _, _ = sched(y)
    assert len(kernels) == 1


def test_shared_value_is_computed_once():
    a, b = (lc.tensor(_f32((33,), s)) for s in (8, 9))
    x = (a * b).exp()
    y = x + x * x.sin()
    _, kernels, mat, _ = sched(y)
    assert len(kernels) == 1
    ops = _instr_ops(kernels[0])
    assert ops.count("exp") == 1, ops
    assert ops.count("sin") == 1, ops
    xs = np.exp(a.numpy() * b.numpy())
    np.testing.assert_allclose(y.numpy(), xs + xs * np.sin(xs), rtol=1e-5, atol=1e-6)


def test_intermediate_output_written_once_in_one_kernel():
    a, b, c = (lc.tensor(_f32((40, 3), s)) for s in (10, 11, 12))
    x = a * b + c
    y = x.exp()
    cap, kernels, mat, _ = sched(x, y)
    assert len(kernels) == 1
    assert len(kernels[0].outputs) == 2
    assert len(mat) == 2
    ops = _instr_ops(kernels[0])
    assert ops.count("mul") == 1 and ops.count("add") == 1 and ops.count("exp") == 1, ops
    # and realizing both in one call works and gives consistent data
    lc.realize(x, y)
    assert not x.is_lazy and not y.is_lazy
    xn = a.numpy() * b.numpy() + c.numpy()
    np.testing.assert_allclose(x.numpy(), xn, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y.numpy(), np.exp(x.numpy()), rtol=1e-6, atol=1e-6)


def test_realize_several_compiles_one_graph(compiled_counter):
    a = lc.tensor(_f32((13,), 13))
    x = (a * 1.25 + 0.5).sigmoid()
    y = x * x
    z = x - 2.0
    cap, kernels, mat, _ = sched(x, y, z)
    assert len(kernels) == 1 and len(kernels[0].outputs) == 3
    lc.realize(x, y, z)
    assert_same(y.numpy(), x.numpy() * x.numpy())
    assert_same(z.numpy(), x.numpy() - np.float32(2))


def test_realized_part_is_not_recomputed():
    a = lc.tensor(_f32((21,), 14))
    x = (a * 3.0).exp().realize()
    y = x + 1.0
    cap, kernels, _, _ = sched(y)
    assert len(kernels) == 1
    assert _instr_ops(kernels[0]).count("exp") == 0
    assert any(n is x._node for n in cap.inputs)


# ---- compile cache -------------------------------------------------------------------------
def _graph(an, bn, cn):
    a, b, c = lc.tensor(an), lc.tensor(bn), lc.tensor(cn)
    return ((a * b + c).exp() - a.t().t()).maximum(b[:, ::1])


def test_rebuilding_same_graph_on_new_data_compiles_nothing():
    shape = (19, 23)
    first = _graph(_f32(shape, 20), _f32(shape, 21), _f32(shape, 22))
    first.numpy()
    before = jit.stats["compiled"]
    for seed in range(3):
        an, bn, cn = _f32(shape, 30 + seed), _f32(shape, 40 + seed), _f32(shape, 50 + seed)
        out = _graph(an, bn, cn).numpy()
        np.testing.assert_allclose(out, np.maximum(np.exp(an * bn + cn) - an, bn), rtol=1e-6, atol=1e-6)
    assert jit.stats["compiled"] == before


def test_rebuilding_bf16_and_int_graphs_compiles_nothing():
    def run(seed):
        rng = rng_for("rebuild", seed)
        x = lc.tensor(data(lc.bf16, (7, 5), rng))
        i = lc.tensor(data(lc.i32, (5, 7), rng))
        return lc.realize((x * x - 1.0).abs(), (i / 3 + i.t().t()).maximum(i))
    for t in run(0):
        t.numpy()
    before = jit.stats["compiled"]
    for s in (1, 2):
        for t in run(s):
            t.numpy()
    assert jit.stats["compiled"] == before


# ---- low-precision fusion rule -------------------------------------------------------------
def _chain_fused(a, b, c):
    return ((a * b) + c).exp()


def _chain_steps(a, b, c):
    ab = (a * b).realize()
    s = (ab + c).realize()
    return s.exp().realize()


@pytest.mark.parametrize("dt", LOWP, ids=ids(LOWP))
def test_lowp_fused_chain_bit_identical_to_stepwise(dt):
    rng = rng_for("fuse-rule", dt.name)
    an, bn, cn = (data(dt, (3, 37), rng) for _ in range(3))
    fused = _chain_fused(lc.tensor(an), lc.tensor(bn), lc.tensor(cn))
    _, kernels, _, _ = sched(fused)
    assert len(kernels) == 1
    stepwise = _chain_steps(lc.tensor(an), lc.tensor(bn), lc.tensor(cn))
    assert_same(fused.numpy(), stepwise.numpy(), f"{dt.name} fused vs stepwise", bits=True)
    # the + and * part is what eager ml_dtypes gives, bit for bit
    f32 = np.float32
    ab = (an.astype(f32) * bn.astype(f32)).astype(dt.numpy)
    s = (ab.astype(f32) + cn.astype(f32)).astype(dt.numpy)
    assert_same(((lc.tensor(an) * lc.tensor(bn)) + lc.tensor(cn)).numpy(), s, bits=True)


@pytest.mark.parametrize("dt", LOWP, ids=ids(LOWP))
def test_lowp_long_chain_bit_identical_to_stepwise(dt):
    rng = rng_for("fuse-rule-long", dt.name)
    an = data(dt, (41,), rng)
    bn = data(dt, (41,), rng, "nonzero")
    ops = [lambda x, y: x * y, lambda x, y: x - y, lambda x, y: x.tanh(), lambda x, y: x / y,
           lambda x, y: x.maximum(y), lambda x, y: x.sigmoid() + y, lambda x, y: x.affine(0.75, 0.125),
           lambda x, y: x.sqr(), lambda x, y: x.sin() * y]
    ta, tb = lc.tensor(an), lc.tensor(bn)
    fused = ta
    for f in ops:
        fused = f(fused, tb)
    step = lc.tensor(an)
    for f in ops:
        step = f(step, lc.tensor(bn)).realize()
    assert_same(fused.numpy(), step.numpy(), f"{dt.name} long chain", bits=True)


@pytest.mark.parametrize("dt", [lc.f32, lc.f64], ids=["f32", "f64"])
def test_f32_f64_fused_chain_close_to_stepwise(dt):
    # |a*b+c| <= 2, so an FMA (allowed for f32/f64) moves exp's result by far less than the tolerance
    an, bn, cn = (_f32((3, 37), 70 + s).astype(dt.numpy) for s in range(3))
    fused = _chain_fused(lc.tensor(an), lc.tensor(bn), lc.tensor(cn)).numpy()
    step = _chain_steps(lc.tensor(an), lc.tensor(bn), lc.tensor(cn)).numpy()
    tol = 1e-6 if dt is lc.f32 else 1e-13
    np.testing.assert_allclose(fused, step, rtol=tol, atol=tol)


# ---- threads -------------------------------------------------------------------------------
BIG = 1 << 18


def _run_threads(build):
    outs = []
    for n in (1, 2):
        with lc.num_threads(n):
            assert lc.get_num_threads() == n
            outs.append([t.numpy().copy() for t in build()])
    return outs


def test_threads_identical_f32_chain():
    rng = np.random.default_rng(60)
    an, bn, cn = (rng.uniform(-2, 2, BIG + 13).astype(np.float32) for _ in range(3))
    one, two = _run_threads(lambda: [((lc.tensor(an) * lc.tensor(bn) + lc.tensor(cn)).exp())])
    assert_same(one[0], two[0], bits=True)
    np.testing.assert_allclose(one[0], np.exp(an * bn + cn), rtol=1e-6, atol=1e-6)


def test_threads_identical_2d_transposed_and_lowp():
    rng = np.random.default_rng(61)
    m = rng.normal(size=(517, 1031)).astype(np.float32)      # > 1<<18 elements, odd sizes
    v = rng.normal(size=(517,)).astype(np.float32)

    def build():
        tm = lc.tensor(m)
        x = (tm.t() * lc.tensor(v)).tanh()
        h = tm.to_dtype(lc.bf16)
        return [x, (h * h - h).sigmoid(), tm.t().contiguous()]
    one, two = _run_threads(build)
    for a, b in zip(one, two):
        assert_same(a, b, bits=True)
    assert_same(one[2], np.array(m.T, order="C"))


def test_threads_identical_int():
    rng = np.random.default_rng(62)
    a = rng.integers(-2**31, 2**31, BIG + 7).astype(np.int32)
    b = rng.integers(-50, 50, BIG + 7).astype(np.int32)
    one, two = _run_threads(lambda: [(lc.tensor(a) / lc.tensor(b)) * lc.tensor(b) + lc.tensor(a).abs()])
    assert_same(one[0], two[0])


def test_num_threads_scope_restores():
    before = lc.get_num_threads()
    with lc.num_threads(1):
        assert lc.get_num_threads() == 1
    assert lc.get_num_threads() == before
    lc.set_num_threads(2)
    try:
        assert lc.get_num_threads() == 2
    finally:
        lc.set_num_threads(before)


# ---- outputs of several dtypes, views of computed nodes -------------------------------------
def test_multi_output_mixed_dtypes():
    rng = np.random.default_rng(80)
    a, b, c = (rng.normal(size=1023).astype(np.float32) for _ in range(3))
    x = lc.tensor(a) * lc.tensor(b)
    outs = [x, x.lt(lc.tensor(c)), x.to_dtype(lc.f64), x.to_dtype(lc.bf16), x.to_dtype(lc.i32)]
    _, kernels, _, _ = sched(*outs)
    assert len(kernels) == 1 and len(kernels[0].outputs) == 5
    lc.realize(*outs)
    ab = a * b
    assert_same(outs[0].numpy(), ab)
    assert_same(outs[1].numpy(), (ab < c).astype(np.uint8))
    assert_same(outs[2].numpy(), ab.astype(np.float64))
    assert_same(outs[3].numpy(), ab.astype(lc.bf16.numpy), bits=True)
    assert_same(outs[4].numpy(), ab.astype(np.int32))


def test_offset_views_of_a_computed_node():
    m = _f32((37, 41), 81)
    y = lc.tensor(m) * 2.0
    z = y[3:, 5::3] + y[:-3, :-5:3] * y.t()[5::3, 3:].t()
    m2 = m * np.float32(2)
    np.testing.assert_allclose(z.numpy(), m2[3:, 5::3] + m2[:-3, :-5:3] * m2.T[5::3, 3:].T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name,f,g", [
    ("reshape", lambda t: (t * 2.0).reshape((6,)) + 1.0, lambda a: (a * 2).reshape(6) + 1),
    ("reshape_tensor_operand", lambda t: (t * 2.0).reshape((6,)) + lc.tensor(np.ones(6, np.float32)),
     lambda a: (a * 2).reshape(6) + 1),
    ("unsqueeze", lambda t: (t * 2.0).unsqueeze(0) + 1.0, lambda a: (a * 2)[None] + 1),
    ("copy_of_transpose_reshaped", lambda t: t.t().reshape((-1,)) * 3.0, lambda a: a.T.reshape(-1) * 3),
    ("diamond_through_reshape", lambda t: (t + 1.0) * (t + 1.0).flatten_all().reshape((2, 3)),
     lambda a: (a + 1) * (a + 1)),
    ("squeeze_of_computed", lambda t: (t[None] * 2.0).squeeze(0) - t, lambda a: a * 2 - a),
])
def test_view_of_computed_feeding_elementwise(name, f, g):
    """Regression: a shape-changing view of a computed node read by an elementwise op."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert_same(f(lc.tensor(a)).numpy(), g(a).astype(np.float32), name)
