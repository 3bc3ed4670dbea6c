"""The eager realize's trace key (ir/trace.py, compiler.realize_traced): a single computed
node finds its bound plan from the key its construction built, without the capture walk.  The
key must tell apart exactly what the capture key tells apart, a new scalar value must compile
nothing, and every result must match NumPy on both execution paths."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from lazycandle import compiler, tensor_reduce
from lazycandle.ir.graph import capture

from conftest import run_in_threads

A = np.linspace(-1.5, 2.0, 16, dtype=np.float32)
M = np.arange(16, dtype=np.float32).reshape(4, 4) / 7


def _keys(t):
    n = t._node.base         # a reduction behind its reshape view: the view aliases it
    return compiler.trace_key(n), capture([n]).key


# name -> builder of (tensor, numpy expected) from fresh leaves; pairs that differ in what the
# kernel is built for, and pairs that differ only in data, offsets or scalar values
def _builders():
    def leaf(a=A, dt=None):
        return lc.tensor(a if dt is None else a.astype(dt))
    f64 = A.astype(np.float64)
    return {
        "chain": lambda: (((leaf() * 2.0) + 1.0).exp(), np.exp(A * np.float32(2) + np.float32(1))),
        "chain other scalars": lambda: (((leaf() * 3.0) + 0.5).exp(), np.exp(A * np.float32(3) + np.float32(0.5))),
        "chain f64": lambda: (((leaf(dt=np.float64) * 2.0) + 1.0).exp(), np.exp(f64 * 2 + 1)),
        "chain equal scalars": lambda: (((leaf() * 2.0) + 2.0).exp(), np.exp(A * np.float32(2) + np.float32(2))),
        "times one": lambda: (((leaf() * 1.0) + 1.0).exp(), np.exp(A + np.float32(1))),
        "plus zero": lambda: (((leaf() * 2.0) + 0.0).exp(), np.exp(A * np.float32(2))),
        "plus minus zero": lambda: (((leaf() * 2.0) + -0.0).exp(), np.exp(A * np.float32(2))),
        "square": lambda: ((leaf() ** 2.0) + 1.0, A ** np.float32(2) + np.float32(1)),
        "cube": lambda: ((leaf() ** 3.0) + 1.0, A ** np.float32(3) + np.float32(1)),
        "two leaves": lambda: ((leaf() + leaf(A[::-1].copy())).exp(), np.exp(A + A[::-1])),
        "one leaf twice": lambda: _twice(),
        "broadcast rows": lambda: ((leaf(M) + leaf(M[:1].copy())) * 2.0, (M + M[:1]) * np.float32(2)),
        "broadcast cols": lambda: ((leaf(M) + leaf(M[:, :1].copy())) * 2.0, (M + M[:, :1]) * np.float32(2)),
        "transposed read": lambda: ((leaf(M).t() + 1.0) * 2.0, (M.T + np.float32(1)) * np.float32(2)),
        "contiguous read": lambda: ((leaf(M) + 1.0) * 2.0, (M + np.float32(1)) * np.float32(2)),
        "slices apart": lambda: _slices(0, 8),
        "slices apart elsewhere": lambda: _slices(2, 6),
        "same slice twice": lambda: _slices(4, 4),
        "row sum": lambda: ((leaf(M) * 2.0).sum(-1), (M * np.float32(2)).sum(-1)),
        "affine clamp": lambda: (leaf().affine(2.0, 1.0).clamp(-1.0, 3.0), np.clip(A * 2 + 1, -1, 3)),
        "affine clamp others": lambda: (leaf().affine(0.5, -1.0).clamp(-2.0, 0.0), np.clip(A * 0.5 - 1, -2, 0)),
        "int wrap": lambda: (lc.tensor(np.arange(16, dtype=np.int32)) * 7 + 3, np.arange(16, dtype=np.int32) * 7 + 3),
        "shared square": lambda: _square(True),
        "two equal squares": lambda: _square(False),
        "shared below both": lambda: _shared_below(True),
        "equal below both": lambda: _shared_below(False),
        "shared row centre": lambda: _centred(),
    }


def _square(shared):
    """d * d of one node d, or of two equal but separate nodes (the capture keeps both)."""
    x = lc.tensor(A)
    d = x - 0.5
    return d * (d if shared else x - 0.5), (A - np.float32(0.5)) ** 2


def _shared_below(shared):
    """(e + 1) * (e * 2) with e = exp(x): e shared one level down, or built twice."""
    x = lc.tensor(A)
    e = x.exp()
    return (e + 1.0) * ((e if shared else x.exp()) * 2.0), (np.exp(A) + 1) * (np.exp(A) * 2)


def _centred():
    """layer_norm's shape: the centred rows read by the variance and by the output."""
    x = lc.tensor(M)
    xc = x.broadcast_sub(x.mean_keepdim(-1))
    r = (xc.sqr().mean_keepdim(-1) + 1e-5).sqrt()
    mc = M - M.mean(-1, keepdims=True)
    return xc.broadcast_div(r), mc / np.sqrt((mc ** 2).mean(-1, keepdims=True) + np.float32(1e-5))


def _twice():
    x = lc.tensor(A)
    return (x * x + 1.0).exp(), np.exp(A * A + np.float32(1))


def _slices(i, j):
    x = lc.tensor(A)
    return x[i:i + 8] * 2.0 + x[j:j + 8], A[i:i + 8] * np.float32(2) + A[j:j + 8]


def test_trace_key_tells_apart_exactly_what_the_capture_key_does():
    built = {name: b()[0] for name, b in _builders().items()}
    keys = {name: _keys(t) for name, t in built.items()}
    assert all(k[0] is not None for k in keys.values())
    for a, (ta, ca) in keys.items():
        for b, (tb, cb) in keys.items():
            assert (ta == tb) == (ca == cb), (a, b)
    # the pairs the kernel does not depend on share a key; the others do not
    assert keys["chain"][0] == keys["chain other scalars"][0]
    assert keys["slices apart"][0] == keys["slices apart elsewhere"][0]
    assert keys["affine clamp"][0] == keys["affine clamp others"][0]
    for other in ("chain f64", "chain equal scalars", "times one", "plus zero", "plus minus zero"):
        assert keys["chain"][0] != keys[other][0], other
    assert keys["plus zero"][0] != keys["plus minus zero"][0]
    assert keys["square"][0] != keys["cube"][0]
    assert keys["two leaves"][0] != keys["one leaf twice"][0]
    assert keys["broadcast rows"][0] != keys["broadcast cols"][0]
    assert keys["transposed read"][0] != keys["contiguous read"][0]
    assert keys["slices apart"][0] != keys["same slice twice"][0]
    assert keys["shared square"][0] != keys["two equal squares"][0]
    assert keys["shared below both"][0] != keys["equal below both"][0]


@pytest.mark.parametrize("mode", ["python", "native"])
def test_traced_realize_matches_numpy_on_both_paths(monkeypatch, mode):
    monkeypatch.setenv("LAZYCANDLE_EXEC", mode)
    for _ in range(3):              # the first realize of a key captures, the next ones do not
        for name, b in _builders().items():
            t, want = b()
            np.testing.assert_allclose(t.numpy(), want, rtol=1e-6, atol=1e-6, err_msg=name)


def test_new_scalar_values_and_leaves_compile_nothing():
    x = lc.tensor(A)
    ((x * 2.0) + 1.0).exp().numpy()
    plans, eager = len(compiler._plans), len(compiler._eager)
    for s in (3.0, -0.5, 7.25):
        got = ((lc.tensor(A + 1) * s) + 0.25).exp().numpy()
        np.testing.assert_allclose(got, np.exp((A + 1) * np.float32(s) + np.float32(0.25)), rtol=1e-6)
    assert (len(compiler._plans), len(compiler._eager)) == (plans, eager)


def test_node_realized_after_the_consumer_was_built_is_read_not_recomputed():
    x = lc.tensor(A)
    y = x * 2.0
    z = (y + 1.0).exp()
    key_before = compiler.trace_key(z._node)
    y.realize()
    assert key_before is not None and compiler.trace_key(z._node) is None
    np.testing.assert_allclose(z.numpy(), np.exp(A * np.float32(2) + np.float32(1)), rtol=1e-6)
    assert capture([((y + 1.0).exp())._node]).inputs[0] is y._node


@pytest.mark.parametrize("which", ["transposed view", "broadcast constant", "rank-0 constant"])
def test_views_and_constants_realized_after_the_consumer_was_built_are_its_inputs(which):
    data = np.arange(40, dtype=np.float32).reshape(8, 5) / 16
    parts = {"transposed view": lc.tensor(data).t(), "broadcast constant": lc.full(2.5, (5, 8)),
             "rank-0 constant": lc.full(0.5, ())}
    y = ((parts["transposed view"] * parts["broadcast constant"]) + parts["rank-0 constant"]).exp()
    assert compiler.trace_key(y._node) is not None
    parts[which].numpy()                    # it becomes a buffer of its own: an input of y's capture
    assert compiler.trace_key(y._node) is None
    want = np.exp(data.T * np.float32(2.5) + np.float32(0.5))
    np.testing.assert_allclose(y.numpy(), want, rtol=4e-6)


def test_realized_tensor_reused_in_a_new_graph():
    x = lc.tensor(A)
    y = ((x * 2.0) + 1.0).exp().realize()
    for _ in range(2):
        z = ((y - 1.0) * 0.5).numpy()
        np.testing.assert_allclose(z, (np.exp(A * np.float32(2) + np.float32(1)) - 1) * np.float32(0.5), rtol=1e-6)
    np.testing.assert_allclose((y + x).numpy(), np.exp(A * np.float32(2) + np.float32(1)) + A, rtol=1e-6)


def test_shared_subexpression_realizes_through_its_trace_without_capturing_again():
    """A DAG (a computed node read twice) has a trace; the second realize of the same
    structure on new data captures nothing and binds the new leaf."""
    for data in (A, A[::-1].copy(), A * 3):
        x = lc.tensor(data)
        d = x - 0.5
        sq = d * d
        assert compiler.trace_key(sq._node) is not None
        plans, eager = len(compiler._plans), len(compiler._eager)
        np.testing.assert_allclose(sq.numpy(), (data - np.float32(0.5)) ** 2, rtol=1e-6)
        if data is not A:
            assert (len(compiler._plans), len(compiler._eager)) == (plans, eager)


def test_shared_node_realized_after_the_consumer_was_built_is_read():
    x = lc.tensor(A)
    e = x.exp()
    y = (e + 1.0) * (e * 2.0)
    assert compiler.trace_key(y._node) is not None
    e.realize()
    assert compiler.trace_key(y._node) is None
    np.testing.assert_allclose(y.numpy(), (np.exp(A) + 1) * (np.exp(A) * 2), rtol=1e-6)


def test_placeholder_in_an_eager_realize_still_raises():
    p = lc.placeholder("p", (16,), lc.f32)
    with pytest.raises(lc.UnboundPlaceholder):
        ((p * 2.0) + 1.0).realize()


def test_reduction_behind_a_reshape_view_realizes_through_its_trace():
    x = lc.tensor(M)
    for _ in range(2):
        s = (x * 2.0).sum(-1)
        assert s._node.op.category == "view" and s._node.base.trace is not None
        np.testing.assert_allclose(s.numpy(), (M * 2).sum(-1), rtol=1e-6)


@pytest.mark.parametrize("mode", ["python", "native"])
def test_concurrent_eager_realize_from_threads_is_right(monkeypatch, mode):
    monkeypatch.setenv("LAZYCANDLE_EXEC", mode)

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(150):
            a = rng.standard_normal(16).astype(np.float32)
            s = float(rng.integers(1, 9))
            t = lc.tensor(a)
            np.testing.assert_allclose(((t * s) + 1.0).exp().numpy(), np.exp(a * np.float32(s) + np.float32(1)),
                                       rtol=4e-6)      # exp: SPEC's 4-ulp allowance
            np.testing.assert_allclose((t * 0.5 + t).sum(-1).numpy(), (a * np.float32(0.5) + a).sum(-1),
                                       rtol=1e-5, atol=1e-5)
    assert run_in_threads(work, 4) == []


def test_an_op_on_a_realized_node_reuses_its_trace_and_keeps_the_node_collectable():
    """ir/trace.py keeps the trace of a one-source op on the realized node it reads: built
    again it equals a fresh trace (the same key, new scalar values of affine-like args kept
    apart), the memo stays bounded, and it holds no reference to the node (which dies by
    reference count alone, with its buffer)."""
    import gc
    import weakref
    from lazycandle.ir import trace as T
    x = lc.tensor(M).realize()
    for _ in range(2):
        for t, want in ((x.sum(-1), M.sum(-1)), (x.max(0), M.max(0)), (x.exp(), np.exp(M)),
                        (x.clamp(0.2, 1.0), np.clip(M, 0.2, 1.0)), (x.clamp(0.3, 1.0), np.clip(M, 0.3, 1.0))):
            n = t._node.base
            assert n.trace == T._trace(n)
            np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)
    assert 0 < len(x._node.traces) <= T.MAX_MEMO
    for i in range(3 * T.MAX_MEMO):                 # new keys keep coming: the memo starts afresh
        x.clamp(0.0, 1.0 + i)
    assert len(x._node.traces) <= T.MAX_MEMO
    gc.disable()
    try:
        y = lc.tensor(M).realize()
        y.sum(-1).numpy()
        alive = weakref.ref(y._node)
        del y
        assert alive() is None
    finally:
        gc.enable()


def test_a_matmul_builds_its_trace_only_when_asked():
    """An eager `a @ b` realizes through its own path and never needs its trace: it is left
    pending; a consumer built on it, or a matmul that must realize through its trace (an
    unrealized operand), builds it then, and every result matches NumPy."""
    from lazycandle.ir import trace as T
    x = lc.tensor(M).realize()
    mm = x @ x
    assert mm._node.trace is T.PENDING
    np.testing.assert_allclose(mm.numpy(), M @ M, rtol=1e-6)
    y = (x @ x + 1.0).exp()                         # the consumer's trace holds the matmul's
    assert y._node.trace is not None and y._node.srcs[0].trace not in (None, T.PENDING)
    np.testing.assert_allclose(y.numpy(), np.exp(M @ M + np.float32(1)), rtol=1e-5)
    z = (x * 2.0) @ x                               # an operand not realized: the traced realize
    assert compiler.trace_key(z._node) is not None
    np.testing.assert_allclose(z.numpy(), (M * np.float32(2)) @ M, rtol=1e-6)


def _node_fields(n):
    return (n.op, n.arg, n.shape, n.dtype, n.layout, n.label, n.trace is None, n._base is not None)


REDUCTIONS = [("sum", 0, False), ("sum", -1, True), ("sum", None, False), ("mean", 1, False),
              ("prod", 0, True), ("max", -1, False), ("min", 0, True), ("argmax", 1, False),
              ("argmin", 0, False)]


@pytest.mark.parametrize("kind,dim,keepdim", REDUCTIONS)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "narrowed"])
def test_a_reduction_built_again_from_its_recipe_is_the_one_the_checks_build(kind, dim, keepdim, layout):
    """The second `x.sum(dim)` of a shape and dtype is built from the recipe the first left
    (tensor_reduce._recipes), without the checks: the same nodes field for field, the same
    values, on any view of the input; clearing the caches drops the recipes."""
    lc.clear_caches()
    base = np.arange(35, dtype=np.float32).reshape(5, 7) / 9 - 1.5
    views = {"contiguous": (lambda t: t, lambda a: a), "transposed": (lambda t: t.t(), lambda a: a.T),
             "narrowed": (lambda t: t.narrow(1, 1, 5), lambda a: a[:, 1:6])}
    view_lc, view_np = views[layout]

    def build(arr):
        x = view_lc(lc.tensor(arr))
        return x, getattr(x, kind)(dim, keepdim=keepdim)
    x1, first = build(base)
    assert len(tensor_reduce._recipes) == 1
    x2, again = build(base[::-1].copy())
    n1, n2 = first._node, again._node
    assert _node_fields(n1) == _node_fields(n2)
    assert n2.srcs[0] is not n1.srcs[0]
    if n1.op.name == "view":
        assert _node_fields(n1.srcs[0]) == _node_fields(n2.srcs[0]) and n2.srcs[0].srcs == (x2._node,)
    np_kind = {"argmax": "argmax", "argmin": "argmin"}.get(kind, kind)
    for arr, t in ((base, first), (base[::-1].copy(), again)):
        want = getattr(view_np(arr).astype(np.float64), np_kind)(axis=dim, keepdims=keepdim)
        np.testing.assert_allclose(t.numpy(), want, rtol=1e-6, atol=1e-6)
    lc.clear_caches()
    assert len(tensor_reduce._recipes) == 0


def test_a_recipe_never_skips_a_check_its_key_did_not_pass():
    """Bad input raises at every call, whatever recipes exist for nearby keys."""
    x = lc.tensor(np.ones((3, 4), np.float32))
    x.sum(1)
    x.max(0)
    for _ in range(2):
        with pytest.raises(lc.DimOutOfRange):
            x.sum(2)
        with pytest.raises(lc.UnsupportedDTypeForOp):
            lc.tensor(np.ones((3, 4), np.int32)).mean(1)
        with pytest.raises(lc.EmptyReduction):
            lc.tensor(np.ones((3, 0), np.float32)).max(1)
    ints = lc.tensor(np.arange(12, dtype=np.int32).reshape(3, 4))
    assert ints.sum(1).dtype == lc.i32 and ints.sum(1).numpy().tolist() == [6, 22, 38]


def test_named_dims_keep_their_own_path():
    """A reduction of a shape traced with named dims files no recipe (its sizes print as names)."""
    lc.clear_caches()
    x = lc.placeholder("x", ("n", 4))
    s = x.sum(1)
    assert tensor_reduce._recipes == {} and "n" in repr(s.shape)


def test_recipes_of_one_shape_stay_apart():
    """Kinds, dims and keepdim of one shape and dtype each keep their own recipe (every
    reduction twice: the second is built from the recipe)."""
    lc.clear_caches()
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7
    x = lc.tensor(a)
    for _ in range(2):
        for kind in ("sum", "mean", "max", "argmin"):
            for dim in (0, 1, 2, -1, None):
                for keepdim in (False, True):
                    if dim is None and kind == "argmin":
                        continue
                    got = getattr(x, kind)(dim, keepdim=keepdim)
                    want = getattr(a.astype(np.float64), kind)(axis=dim, keepdims=keepdim)
                    assert got.shape == want.shape, (kind, dim, keepdim)
                    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, err_msg=str((kind, dim, keepdim)))
    # (max over everything keeps its dims by a reshape of the one reduction: one recipe for both)
    assert len(tensor_reduce._recipes) == 4 * 5 * 2 - 2 - 1
