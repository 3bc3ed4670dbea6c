"""lc.dask.run against NumPy on the whole array: elementwise, reductions over each dim, the
mean/std pair, softmax, layer_norm and an MLP (rows chunked, contraction chunked), uneven chunks,
on the synchronous, threaded and distributed schedulers; feed errors; a killed worker."""
import os

import numpy as np
import pytest

dask = pytest.importorskip("dask", reason="lc.dask needs the optional extra: pip install -e '.[dask]'")
da = pytest.importorskip("dask.array", reason="lc.dask needs dask[array]: pip install -e '.[dask]'")

import lazycandle as lc  # noqa: E402

RNG = np.random.default_rng(7)
X = RNG.standard_normal((50, 37)).astype(np.float32)
UNEVEN = [(50, 37), (17, 37), (50, 10), (20, 16)]


def _close(got, want, rtol=1e-5, atol=1e-5):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _programs():
    x = lc.placeholder("x", X.shape)
    return {
        "elementwise": (lc.compile([(x * 2 + 1).exp().sqrt()]), lambda a: np.sqrt(np.exp(a * 2 + 1))),
        "sum0": (lc.compile([x.sum(0)]), lambda a: a.sum(0)),
        "sum1": (lc.compile([x.sum(1)]), lambda a: a.sum(1)),
        "mean_both": (lc.compile([x.mean((0, 1))]), lambda a: np.float32(a.mean())),
        "max0": (lc.compile([x.max(0)]), lambda a: a.max(0)),
        "min1": (lc.compile([x.min(1)]), lambda a: a.min(1)),
        "argmax0": (lc.compile([x.argmax(0)]), lambda a: a.argmax(0).astype(np.uint32)),
        "argmax1": (lc.compile([x.argmax(1)]), lambda a: a.argmax(1).astype(np.uint32)),
        "softmax": (lc.compile([lc.nn.softmax_last_dim(x)]), _softmax),
    }


PROGRAMS = _programs()


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("chunks", UNEVEN, ids=str)
def test_matches_numpy_on_sync_scheduler(name, chunks):
    prog, ref = PROGRAMS[name]
    (out,) = lc.dask.run(prog, x=da.from_array(X, chunks=chunks))
    assert isinstance(out, da.Array)
    _close(out.compute(scheduler="sync"), ref(X))


def test_mean_std_pair_over_a_chunked_dim():
    x = lc.placeholder("x", X.shape)
    m = x.mean_keepdim(0)
    std = x.broadcast_sub(m).sqr().mean(0).sqrt()
    prog = lc.compile([m.squeeze(0), std])
    mean, sd = lc.dask.run(prog, x=da.from_array(X, chunks=(11, 20)))
    got_m, got_s = dask.compute(mean, sd, scheduler="threads")
    _close(got_m, X.mean(0))
    _close(got_s, X.std(0))


def test_layer_norm_rows_chunked_and_row_dim_chunked():
    gamma = RNG.standard_normal(37).astype(np.float32)
    beta = RNG.standard_normal(37).astype(np.float32)
    x = lc.placeholder("x", X.shape)
    prog = lc.compile([lc.nn.layer_norm(x, lc.tensor(gamma), lc.tensor(beta), 1e-5)])
    xc = X - X.mean(-1, keepdims=True)
    want = xc / np.sqrt((xc ** 2).mean(-1, keepdims=True) + 1e-5) * gamma + beta
    for chunks in [(17, 37), (17, 10)]:   # rows chunked; rows and the normalised dim chunked
        (out,) = lc.dask.run(prog, x=da.from_array(X, chunks=chunks))
        _close(out.compute(scheduler="threads"), want, rtol=1e-4, atol=1e-4)


def _mlp():
    w1 = RNG.standard_normal((37, 24)).astype(np.float32)
    b1 = RNG.standard_normal(24).astype(np.float32)
    w2 = RNG.standard_normal((24, 5)).astype(np.float32)
    x = lc.placeholder("x", X.shape)
    W1 = lc.placeholder("w1", w1.shape)
    y = (x @ W1).broadcast_add(lc.tensor(b1)).relu() @ lc.tensor(w2)
    want = np.maximum(X.astype(np.float64) @ w1 + b1, 0) @ w2
    return lc.compile([y]), w1, want.astype(np.float32)


@pytest.mark.parametrize("xchunks,wchunks", [((17, 37), (37, 24)), ((50, 10), (10, 7)), ((17, 10), (37, 24))],
                         ids=["rows", "contraction", "contraction-rechunked-to-match"])
def test_mlp_forward(xchunks, wchunks):
    prog, w1, want = _mlp()
    (out,) = lc.dask.run(prog, x=da.from_array(X, chunks=xchunks), w1=da.from_array(w1, chunks=wchunks))
    _close(out.compute(scheduler="threads"), want, rtol=1e-4, atol=1e-4)


def test_mismatched_chunks_along_joined_dims_are_refined():
    y = RNG.standard_normal((37, 50)).astype(np.float32)
    x, Y = lc.placeholder("x", X.shape), lc.placeholder("y", y.shape)
    prog = lc.compile([(x + Y.t()).sum(1)])     # x's dim 0 meets y's dim 1 and dim 1 meets dim 0
    (out,) = lc.dask.run(prog, x=da.from_array(X, chunks=(17, 37)), y=da.from_array(y, chunks=(9, 20)))
    assert out.chunks == ((17, 3, 14, 6, 10),)     # edges of both: 0 17 20 34 40 50
    _close(out.compute(scheduler="threads"), (X + y.T).sum(1))


def test_numpy_feeds_and_conversions():
    prog, _ = PROGRAMS["sum0"]
    (out,) = lc.dask.run(prog, x=X)
    _close(out.compute(), X.sum(0))
    t = lc.tensor(X)
    d = lc.dask.from_tensor(t, (20, 20))
    assert d.chunks == ((20, 20, 10), (20, 17))
    back = lc.dask.to_tensor(d * 2)
    assert isinstance(back, lc.Tensor)
    np.testing.assert_array_equal(back.numpy(), X * 2)


def test_named_dims_are_bound_to_the_feeds_sizes():
    x = lc.placeholder("x", ("n", 37), lc.f32)
    y = lc.placeholder("y", ("n", 37), lc.f32)
    prog = lc.compile([x * 2.0, (x + y).sum(0), x.var(0)])
    for rows in (50, 17):
        xs = X[:rows]
        got = lc.dask.run(prog, x=da.from_array(xs, chunks=(8, 20)), y=xs)
        for g, e in zip(got, [xs * 2, (xs + xs).sum(0), xs.var(0, ddof=1)]):
            _close(g.compute(), e)
    with pytest.raises(lc.FeedError, match=r"'n' is 50 in input 'x' \(shape \(50, 37\)\) but 17 in input 'y'"):
        lc.dask.run(prog, x=X, y=X[:17])


def test_feed_errors_are_feed_errors():
    prog, _ = PROGRAMS["sum0"]
    xd = da.from_array(X, chunks=10)
    with pytest.raises(lc.FeedError, match="missing"):
        lc.dask.run(prog)
    with pytest.raises(lc.FeedError, match="unknown"):
        lc.dask.run(prog, x=xd, y=xd)
    with pytest.raises(lc.FeedError, match="shape"):
        lc.dask.run(prog, x=xd[:10])
    with pytest.raises(lc.FeedError, match="dtype"):
        lc.dask.run(prog, x=xd.astype(np.float64))


def test_unsplittable_dim_is_merged_when_small_and_an_error_when_large(monkeypatch):
    x = lc.placeholder("x", X.shape)
    prog = lc.compile([x.reshape((50 * 37,)).exp()])      # a reshape merging the dims: no per-chunk form
    xd = da.from_array(X, chunks=(10, 37))
    (out,) = lc.dask.run(prog, x=xd)
    _close(out.compute(), np.exp(X).reshape(-1))
    monkeypatch.setattr(lc.dask, "AUTO_RECHUNK_BYTES", 0)
    with pytest.raises(lc.Error, match=r"dim 0 of input 'x'.*x\.rechunk\(\{0: -1\}\)"):
        lc.dask.run(prog, x=xd)


# ---- distributed ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(tmp_path_factory):
    distributed = pytest.importorskip("distributed", reason="needs distributed: pip install -e '.[dask]'")
    cache = tmp_path_factory.mktemp("lc-cache")
    before = os.environ.get("LAZYCANDLE_CACHE_DIR")
    os.environ["LAZYCANDLE_CACHE_DIR"] = str(cache)    # inherited by the worker processes
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=40)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()
    os.environ.pop("LAZYCANDLE_CACHE_DIR", None)
    if before is not None:                             # the session's directory (conftest.py)
        os.environ["LAZYCANDLE_CACHE_DIR"] = before


def test_distributed_cluster_matches_numpy(client):
    prog, w1, want = _mlp()
    (mlp,) = lc.dask.run(prog, x=da.from_array(X, chunks=(50, 10)), w1=da.from_array(w1, chunks=(10, 24)))
    sm_prog, ref = PROGRAMS["softmax"]
    (sm,) = lc.dask.run(sm_prog, x=da.from_array(X, chunks=(20, 16)))
    got_mlp, got_sm = client.compute([mlp, sm], sync=True)
    _close(got_mlp, want, rtol=1e-4, atol=1e-4)
    _close(got_sm, ref(X))

def test_worker_tasks_use_the_workers_thread_count(client):
    from lazycandle.dask.kernels import task_threads

    def threads_in_task():
        import lazycandle
        with task_threads():
            return lazycandle.get_num_threads()

    assert client.submit(threads_in_task, pure=False).result() == 1      # threads_per_worker=1
    assert set(client.run(lc.get_num_threads).values()) == {lc.get_num_threads()}   # restored after


def _exit_once(block, marker):
    """Kill this worker process the first time any worker runs it (a marker file remembers)."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return block
    os.close(fd)
    os._exit(1)


def test_killed_worker_is_retried_and_the_result_is_right(client, tmp_path):
    prog, ref = PROGRAMS["argmax0"]
    xd = da.from_array(X, chunks=(10, 37)).map_blocks(_exit_once, str(tmp_path / "killed"),
                                                      meta=np.empty((0, 0), X.dtype))
    (out,) = lc.dask.run(prog, x=xd)
    got = client.compute(out, sync=True)
    assert (tmp_path / "killed").exists()
    np.testing.assert_array_equal(got, ref(X))


def test_import_lazycandle_does_not_import_dask():
    import subprocess
    import sys
    code = "import sys, lazycandle as lc; assert 'dask' not in sys.modules; lc.dask.run; assert 'dask' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
