"""Index, copy, scan, im2col, col2im and nonzero kernels take their sizes at run time (issue 9): a new
length reuses the compiled kernel (and the symbolic plan), results stay bit-exact against
NumPy on odd sizes and exotic layouts, and bad ids raise IndexOutOfBounds at every size."""
import numpy as np
import pytest

import lazycandle as lc

SIZES = (0, 1, 2, 15, 16, 17, 100)
WARM = (1, 2)          # a length of 1 drops a dim when merging: its own shape class


def _kernels():
    return lc.cache_info()["kernels"]


def _t(a):
    return lc.tensor(np.ascontiguousarray(a))


def _rng(seed=0):
    return np.random.default_rng(seed)


def _families():
    """name -> fn(L, rng) -> (lazycandle result tensor, numpy expectation)."""
    emb_np = _rng(1).standard_normal((37, 24)).astype(np.float32)
    emb = _t(emb_np)

    def index_select(L, r):
        ids = r.integers(0, 37, L).astype(np.int64)
        return emb.index_select(_t(ids), 0), emb_np[ids]

    def index_select_transposed(L, r):       # t read through a transposed view, dim 1
        ids = r.integers(0, 37, L).astype(np.uint32)
        return emb.T.index_select(_t(ids), 1), emb_np.T[:, ids]

    def gather(L, r):
        t = r.standard_normal((L, 9)).astype(np.float32)
        ids = r.integers(0, 9, (L, 5)).astype(np.int64)
        return _t(t).gather(_t(ids), 1), np.take_along_axis(t, ids, 1)

    def gather_narrowed(L, r):                 # gather along the growing dim of a narrowed view
        t = r.standard_normal((L + 3, 6)).astype(np.float32)
        ids = r.integers(0, max(L, 1), (L, 4)).astype(np.uint8) if L else np.zeros((0, 4), np.uint8)
        return _t(t).narrow(0, 1, L).narrow(1, 1, 4).gather(_t(ids), 0), \
            np.take_along_axis(t[1:1 + L, 1:5], ids.astype(np.int64), 0)

    def scatter_add(L, r):
        base = r.standard_normal((11, 7)).astype(np.float32)
        src = r.standard_normal((L, 7)).astype(np.float32)
        ids = r.integers(0, 11, (L, 7)).astype(np.int64)
        want = base.copy()
        for i in range(L):
            for j in range(7):
                want[ids[i, j], j] += src[i, j]
        return _t(base).scatter_add(_t(ids), _t(src), 0), want

    def scatter(L, r):
        base = r.standard_normal((L, 5)).astype(np.float32)
        ids = np.array([r.permutation(5)[:4] for _ in range(L)], np.int64).reshape(L, 4)
        src = r.standard_normal(ids.shape).astype(np.float32)
        want = base.copy()
        np.put_along_axis(want, ids, src, 1)
        return _t(base).scatter(_t(ids), _t(src), 1), want

    def index_add(L, r):
        base = r.standard_normal((13, 8)).astype(np.float32)
        ids = r.integers(0, 13, L).astype(np.int64)
        src = r.standard_normal((L, 8)).astype(np.float32)
        want = base.copy()
        for i in range(L):
            want[ids[i]] += src[i]
        return _t(base).index_add(_t(ids), _t(src), 0), want

    def cat(L, r):
        a = r.standard_normal((L, 6)).astype(np.float32)
        b = r.standard_normal((3, 6)).astype(np.float32)
        return lc.cat([_t(a), _t(b)], 0), np.concatenate([a, b], 0)

    def cat_transposed_dim1(L, r):
        a = r.standard_normal((L, 5)).astype(np.float32)
        b = r.standard_normal((5, 2)).astype(np.float32)
        return lc.cat([_t(a).T, _t(b)], 1), np.concatenate([a.T, b], 1)

    def cumsum(L, r):
        x = r.integers(-50, 50, (L, 6)).astype(np.int32)
        return _t(x).cumsum(0), np.cumsum(x, 0, dtype=np.int32)

    def cumsum_transposed(L, r):
        x = r.standard_normal((7, L)).astype(np.float64)
        return _t(x).T.cumsum(1), np.cumsum(x.T, 1)

    def conv2d(L, r):                          # im2col over a growing width (>= 2: a width
        L += 2                                 # of 1 makes the row stride a unit stride)
        x = r.standard_normal((1, 2, 5, L)).astype(np.float32)
        w = r.standard_normal((3, 2, 3, 3)).astype(np.float32)
        got = _t(x).conv2d(_t(w), padding=1)
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        want = np.zeros((1, 3, 5, L))
        for i in range(3):
            for j in range(3):
                want += np.einsum("bchw,oc->bohw", xp[:, :, i:i + 5, j:j + L], w[:, :, i, j])
        return got, want.astype(np.float32)

    def conv_transpose2d(L, r):                # col2im over a growing width, stride 2
        L += 2
        x = r.standard_normal((1, 2, 4, L)).astype(np.float32)
        w = r.standard_normal((2, 3, 3, 3)).astype(np.float32)
        got = _t(x).conv_transpose2d(_t(w), padding=1, stride=2)
        full = np.zeros((1, 3, 2 * 3 + 3, 2 * (L - 1) + 3))
        for i in range(3):
            for j in range(3):
                full[:, :, i:i + 7:2, j:j + 2 * L - 1:2] += np.einsum("bchw,co->bohw", x.astype(np.float64), w[:, :, i, j])
        return got, full[:, :, 1:-1, 1:-1].astype(np.float32)

    return {k: v for k, v in locals().items() if callable(v) and not k.startswith("_") and k != "emb"}


FAMILIES = _families()


def _check(name, L, r):
    got, want = FAMILIES[name](L, r)
    out = got.numpy()
    assert out.shape == want.shape, (name, L)
    if name.startswith("conv") or name == "scatter_add" or name == "index_add":
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    else:
        assert out.dtype == want.dtype and np.array_equal(out.view(np.uint8), np.ascontiguousarray(want).view(np.uint8)), (name, L)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_new_length_compiles_no_new_kernel_and_matches_numpy(name):
    r = _rng(7)
    lc.set_matmul_backend("blas")   # the convs' GEMMs: under "auto" a new length may measure and
    try:                            # compile another GEMM form (its own business, not the steps')
        for L in WARM:
            _check(name, L, r)
        before = _kernels()
        for L in SIZES:
            _check(name, L, r)
    finally:
        lc.set_matmul_backend("auto")
    assert _kernels() == before, f"{name}: {_kernels() - before} kernels compiled for new lengths"


@pytest.mark.parametrize("name", ["index_select", "cat", "cumsum", "gather"])
def test_a_new_length_reuses_the_symbolic_plan(name):
    r = _rng(3)
    for L in (2, 3):
        _check(name, L, r)
    plans = lc.cache_info()["plans"]
    for L in (15, 16, 17, 100, 41):
        _check(name, L, r)
    assert lc.cache_info()["plans"] == plans


def test_growing_kv_cache_by_cat_compiles_a_constant_number_of_kernels():
    r = _rng(5)
    rows = [r.standard_normal((1, 64)).astype(np.float32)]
    k = _t(rows[0])
    before = _kernels()
    for _ in range(2, 40):
        rows.append(r.standard_normal((1, 64)).astype(np.float32))
        k = lc.cat([k, _t(rows[-1])], 0)
        got = k.numpy()
        k = _t(got)
    assert np.array_equal(got, np.concatenate(rows, 0))
    assert _kernels() - before <= 1


def test_index_select_over_growing_id_counts_compiles_a_constant_number_of_kernels():
    r = _rng(6)
    emb_np = r.standard_normal((1000, 64)).astype(np.float32)
    emb = _t(emb_np)
    before = _kernels()
    for n in range(2, 40):
        ids = r.integers(0, 1000, n).astype(np.int64)
        assert np.array_equal(emb.index_select(_t(ids), 0).numpy(), emb_np[ids])
    assert _kernels() - before <= 1


@pytest.mark.parametrize("L", (1, 2, 16, 17, 100))
@pytest.mark.parametrize("bad", (37, -1))
def test_bad_ids_raise_at_every_length(L, bad):
    emb = _t(_rng(2).standard_normal((37, 24)).astype(np.float32))
    ids = np.zeros(L, np.int64)
    ids[L // 2] = bad
    with pytest.raises(lc.IndexOutOfBounds):
        emb.index_select(_t(ids), 0).numpy()
    t = _t(np.zeros((L, 4), np.float32))
    gids = np.zeros((L, 4), np.int64)
    gids[-1, -1] = 4 if bad > 0 else bad
    with pytest.raises(lc.IndexOutOfBounds):
        t.gather(_t(gids), 1).numpy()
    with pytest.raises(lc.IndexOutOfBounds):
        _t(np.zeros((5, 3), np.float32)).index_add(_t(np.full(L, bad if bad < 0 else 5, np.int64)),
                                                   _t(np.ones((L, 3), np.float32)), 0).numpy()


def test_broadcast_ids_and_zero_sized_operands():
    emb_np = _rng(4).standard_normal((9, 4)).astype(np.float32)
    emb = _t(emb_np)
    ids = _t(np.array([[3, 1, 0, 2]], np.int64)).broadcast_as((6, 4))
    assert np.array_equal(emb.gather(ids, 0).numpy(), np.take_along_axis(emb_np, np.tile([[3, 1, 0, 2]], (6, 1)), 0))
    assert emb.index_select(_t(np.zeros(0, np.int64)), 0).numpy().shape == (0, 4)
    assert lc.cat([_t(np.zeros((0, 4), np.float32)), emb], 0).numpy().shape == (9, 4)
    assert _t(np.zeros((0, 3), np.float32)).cumsum(0).numpy().shape == (0, 3)


def test_named_dim_program_runs_index_cat_and_scan_natively_at_every_length(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    t = lc.placeholder("t", (40, 8), lc.f32)
    ids = lc.placeholder("ids", ("n",), lc.i64)
    k = lc.placeholder("k", ("n", 8), lc.f32)
    rows = (t * 2.0).index_select(ids, 0)
    prog = lc.compile([lc.cat([k, rows], 0).cumsum(0).exp(), rows.sum(-1)])
    r = _rng(8)
    tv = r.standard_normal((40, 8)).astype(np.float32) / 8
    kernels = None
    for n in (2, 3, 17, 100, 5):
        iv = r.integers(0, 40, n).astype(np.int64)
        kv = r.standard_normal((n, 8)).astype(np.float32) / 8
        sel = tv[iv] * 2
        for _ in range(2):          # the second run of a binding goes through the native program
            got, s = prog.run(t=tv, ids=iv, k=kv)
            np.testing.assert_allclose(got, np.exp(np.cumsum(np.concatenate([kv, sel]), 0)), rtol=1e-5)
            np.testing.assert_allclose(s, sel.sum(-1), rtol=1e-5, atol=1e-6)
        if n == 3:
            kernels = _kernels()
        bad = iv.copy()
        bad[-1] = 40
        with pytest.raises(lc.IndexOutOfBounds, match=f"ids i64 shape \\({n},\\)"):
            prog.run(t=tv, ids=bad, k=kv)
    assert _kernels() == kernels


def test_sort_compiles_once_per_power_of_two_row_length():
    r = _rng(9)

    def run(rows, n):
        a = r.standard_normal((rows, n)).astype(np.float32)
        v, i = _t(a).sort_last_dim()
        assert np.array_equal(i.numpy(), np.argsort(a, -1, kind="stable").astype(np.uint32))
        assert np.array_equal(v.numpy(), np.sort(a, -1))
        b = r.standard_normal((n, 6)).astype(np.float32)      # rows of n read through a transpose
        assert np.array_equal(_t(b).T.arg_sort_last_dim(asc=False).numpy(),
                              np.argsort(-b.T, -1, kind="stable").astype(np.uint32))

    run(3, 17)
    run(5, 33)
    before = _kernels()
    for rows, n in ((4, 20), (9, 31), (2, 32), (7, 18), (6, 40), (3, 64), (11, 50)):
        run(rows, n)
    assert _kernels() == before
