"""The scheduler: kernels always form a DAG (residual joins of a value with a function of it
through another kernel), its own output is validated (SchedulerError, an lc.Error), long chains
are cut into bounded kernels without changing a value, and every fusion it still makes is legal."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.ir.graph import capture
from lazycandle.ir.schedule import MAX_FUSED_NODES, _order_groups, schedule


def _f32(shape, seed):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _check_kernel_order(cap, kernels):
    """Every kernel reads only graph inputs, its own register values, or buffers of earlier kernels."""
    kernel_of = {j: i for i, k in enumerate(kernels) for j in k.nodes}
    assert sorted(kernel_of) == list(range(len(cap.nodes)))
    for j, ops in enumerate(cap.operands):
        for o in ops:
            if o.kind == "node":
                assert kernel_of[o.index] <= kernel_of[j], (j, o.index)


def _residual(a, c, w):
    x1 = a + c
    return x1 + (x1 @ w).relu()


def _residual_ref(a, c, w):
    x1 = a.astype(np.float64) + c
    return x1 + np.maximum(x1 @ w, 0)


def test_residual_add_of_matmul_branch_realizes_eagerly():
    a, c, w = _f32((5, 6), 0), _f32((5, 6), 1), _f32((6, 6), 2)
    y = _residual(lc.tensor(a), lc.tensor(c), lc.tensor(w))
    np.testing.assert_allclose(y.numpy(), _residual_ref(a, c, w), rtol=1e-5, atol=1e-6)


def test_residual_add_of_matmul_branch_compiles_and_jits():
    a, c, w = _f32((5, 6), 3), _f32((5, 6), 4), _f32((6, 6), 5)
    phs = [lc.placeholder(n, s, lc.f32) for n, s in (("a", a.shape), ("c", c.shape), ("w", w.shape))]
    prog = lc.compile([_residual(*phs)])
    np.testing.assert_allclose(prog.run(a=a, c=c, w=w)[0], _residual_ref(a, c, w), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lc.jit(_residual)(a, c, w), _residual_ref(a, c, w), rtol=1e-5, atol=1e-6)


def test_residual_join_fuses_with_the_branch_not_the_stream():
    a, c, w = (lc.tensor(_f32(s, i)) for i, s in enumerate([(4, 4), (4, 4), (4, 4)]))
    y = _residual(a, c, w)
    cap = capture([y._node])
    kernels, mat, notes = schedule(cap)
    _check_kernel_order(cap, kernels)
    ops = [[cap.nodes[j].op.name for j in k.nodes] for k in kernels]
    assert ops == [["add"], ["matmul", "relu", "add"]]      # the branch is the matmul's epilogue
    assert any("feeds another operand" in n for n in notes)


def test_pre_norm_blocks_stack_residuals():
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (3, 8)).astype(np.float32)
    ws = [rng.uniform(-0.5, 0.5, (8, 8)).astype(np.float32) for _ in range(3)]
    g, b = np.ones(8, np.float32), np.zeros(8, np.float32)
    t, ref = lc.tensor(x), x.astype(np.float64)
    for w in ws:
        t = t + lc.nn.layer_norm(t, lc.tensor(g), lc.tensor(b), 1e-5).matmul(lc.tensor(w)).gelu()
        mu = ref.mean(-1, keepdims=True)
        ln = (ref - mu) / np.sqrt(((ref - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
        h = ln @ w
        ref = ref + 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4, atol=1e-5)


def test_value_read_directly_and_through_a_reduction_is_not_fused_across():
    a = lc.tensor(_f32((4, 6), 8))
    x = a.exp()
    y = x - x.max_keepdim(1).broadcast_as(x.shape)
    z = y * x
    cap = capture([z._node])
    kernels, _, _ = schedule(cap)
    _check_kernel_order(cap, kernels)
    an = a.numpy().astype(np.float64)
    xn = np.exp(an)
    np.testing.assert_allclose(z.numpy(), (xn - xn.max(1, keepdims=True)) * xn, rtol=1e-5, atol=1e-6)


def test_two_producer_groups_connected_through_a_kernel_are_not_merged():
    a, w = lc.tensor(_f32((4, 4), 9)), lc.tensor(_f32((4, 4), 10))
    p = a.exp()
    q = (p @ w).tanh()            # q's group depends on p's through the matmul
    y = p * q + p.t().sin()       # ... and also reads p through a view
    cap = capture([y._node])
    kernels, _, _ = schedule(cap)
    _check_kernel_order(cap, kernels)
    pn, wn = np.exp(a.numpy().astype(np.float64)), w.numpy()
    np.testing.assert_allclose(y.numpy(), pn * np.tanh(pn @ wn) + np.sin(pn.T), rtol=1e-5, atol=1e-6)


def test_scheduler_error_is_an_lc_error():
    assert issubclass(lc.SchedulerError, lc.Error)


def test_cyclic_grouping_raises_scheduler_error_naming_nodes():
    """The grouping the old scheduler made for the residual: the stream {x1, y} and the branch
    {relu} around the matmul.  Validation must refuse it with a message naming the nodes."""
    a, c, w = (lc.tensor(_f32((4, 4), i)) for i in range(3))
    cap = capture([_residual(a, c, w)._node])
    names = [n.op.name for n in cap.nodes]
    assert names == ["add", "matmul", "relu", "add"]
    groups = {3: [0, 3], 1: [1], 2: [2]}
    group_of = [3, 1, 2, 3]
    with pytest.raises(lc.SchedulerError, match=r"wait for each other.*n1 matmul"):
        _order_groups(cap, groups, group_of)


def test_kernel_reading_its_own_member_through_a_view_raises_scheduler_error():
    a = lc.tensor(_f32((4, 4), 11))
    x = a.exp()
    y = x + x.t()
    cap = capture([y._node])
    with pytest.raises(lc.SchedulerError, match="through a buffer"):
        _order_groups(cap, {1: [0, 1]}, [1, 1])


def test_long_chain_is_cut_into_bounded_kernels():
    n = 3 * MAX_FUSED_NODES + 10
    x = lc.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    y = x
    for i in range(n):
        y = y.tanh() if i % 2 else y * 0.5 + 0.25
    cap = capture([y._node])
    kernels, _, _ = schedule(cap)
    _check_kernel_order(cap, kernels)
    assert all(len(k.nodes) <= MAX_FUSED_NODES for k in kernels)
    assert len(kernels) <= 2 * len(cap.nodes) // MAX_FUSED_NODES + 1


@pytest.mark.parametrize("dt", [lc.bf16, lc.f16], ids=lambda d: d.name)
def test_long_chain_cut_gives_the_op_at_a_time_bits(dt):
    """A kernel cut writes a value to memory in its dtype, exactly as the next op would round it."""
    base = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4).astype(dt.numpy)
    x, ref = lc.tensor(base), base
    for i in range(MAX_FUSED_NODES + 40):
        if i % 2:
            x, ref = x.relu() + 0.125, (np.maximum(ref.astype(np.float32), 0).astype(dt.numpy).astype(np.float32)
                                        + np.float32(0.125)).astype(dt.numpy)
        else:
            x, ref = x * 0.75, (ref.astype(np.float32) * np.float32(0.75)).astype(dt.numpy)
    np.testing.assert_array_equal(x.numpy().view(np.uint16), ref.view(np.uint16))


def test_long_reduction_chain_schedules_in_order():
    x = lc.tensor(_f32((4, 5), 12))
    y, ref = x, x.numpy().astype(np.float64)
    for i in range(80):
        if i % 2:
            y, ref = y - y.mean_keepdim(1).broadcast_as(y.shape), ref - ref.mean(1, keepdims=True)
        else:
            y, ref = y * 1.5 + 0.25, ref * 1.5 + 0.25
    cap = capture([y._node])
    kernels, _, _ = schedule(cap)
    _check_kernel_order(cap, kernels)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_exhausted_reachability_budget_only_refuses_merges(monkeypatch):
    """With no search budget every guarded merge is refused: more kernels, same values."""
    import lazycandle.ir.schedule as S
    a, w = lc.tensor(_f32((4, 4), 13)), lc.tensor(_f32((4, 4), 14))
    p = a.exp()
    y = (p * (p @ w).tanh() + p.sin()) * 0.5
    cap = capture([y._node])
    full, _, _ = schedule(cap)
    monkeypatch.setattr(S, "REACH_BUDGET", 0)
    starved, _, _ = schedule(cap)
    _check_kernel_order(cap, starved)
    assert len(starved) > len(full)
    pn = np.exp(a.numpy().astype(np.float64))
    np.testing.assert_allclose(y.numpy(), (pn * np.tanh(pn @ w.numpy()) + np.sin(pn)) * 0.5, rtol=1e-5, atol=1e-6)


def test_merged_groups_spanning_a_scan_do_not_wait_for_each_other():
    """Found by test_autograd's random graphs: the gradient of cumsum(a.t() @ b.flip(0)) ...
    fused a sigmoid (read by one cumsum) with a product read after the other cumsum, and the
    reach test, which skipped groups older than its source, missed the path through them: two
    kernels waited for each other (SchedulerError).  Now it schedules, and the gradient is right."""
    rng = np.random.default_rng(0)
    xv, yv = rng.uniform(-1, 1, (2, 2)), rng.uniform(-1, 1, (2, 2))

    def fn(x, y):
        m = (x.t() @ x.flip(0)) * 1.0
        s = (m.sqr() + 1.0).sqrt() + x
        return (s.cumsum(1) * m.sigmoid()).sum()
    gx = lc.grad(fn)(lc.tensor(xv), lc.tensor(yv)).numpy()
    eps, num = 1e-6, np.zeros_like(xv)

    def f64(x):
        m = x.T @ x[::-1]
        s = np.sqrt(m * m + 1) + x
        return (np.cumsum(s, 1) * (1 / (1 + np.exp(-m)))).sum()
    for i in np.ndindex(xv.shape):
        d = np.zeros_like(xv)
        d[i] = eps
        num[i] = (f64(xv + d) - f64(xv - d)) / (2 * eps)
    np.testing.assert_allclose(gx, num, rtol=1e-6, atol=1e-8)
