"""The blocking of reduce kernels: f32 sums load full registers and add groups of PAIRED of them
in f32 before each widening to f64; inner-output reductions walk the strips of one row a call
runs as one strip.  Lengths around the block, unroll and vector widths,
empty and strided inputs, low-precision dtypes and 1 vs 2 threads, against NumPy in f64."""
import ml_dtypes
import numpy as np
import pytest

import lazycandle as lc
from lazycandle.codegen import jit
from lazycandle.codegen.reduce import CHAIN, F32_BLOCK, PAIRED, UNROLL
from lazycandle.ir.kernels import MIN_STRIP, output_strips

rng = np.random.default_rng(7)
E = jit.vector_bits() // 32          # f32 lanes of one register
EDGES = sorted({0, 1, E - 1, E, E + 1, UNROLL * E - 1, UNROLL * E, UNROLL * E + 1,
                F32_BLOCK - 1, F32_BLOCK, F32_BLOCK + 1, 2 * F32_BLOCK + UNROLL * E + E + 3, 3000})


def _close(got, want, tol=1e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("n", EDGES)
def test_last_dim_f32_sum_and_mean_at_block_and_vector_edges(n):
    x = rng.standard_normal((3, n)).astype(np.float32)
    t = lc.tensor(x)
    _close(t.sum(-1).numpy(), x.astype(np.float64).sum(-1))
    if n:
        _close(t.mean(-1).numpy(), x.astype(np.float64).mean(-1))
    _close((t * 2.5 + 1.0).sum(-1).numpy(), (x.astype(np.float64) * 2.5 + 1.0).sum(-1))


def test_last_dim_sum_of_large_offset_values_keeps_f64_accuracy_across_blocks():
    """Only PAIRED values meet in f32, the rest in f64, so a long row of values with a large
    common offset (where one f32 accumulator would lose digits) stays within SPEC's rtol."""
    x = (1000.0 + rng.standard_normal((2, 64 * F32_BLOCK + 5))).astype(np.float32)
    got = lc.tensor(x).sum(-1).numpy()
    np.testing.assert_allclose(got, x.astype(np.float64).sum(-1), rtol=2e-7)


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16])
def test_last_dim_low_precision_sums_are_the_f64_sum_within_their_precision(dt):
    x = rng.uniform(-1, 1, (4, F32_BLOCK + 3 * E + 1)).astype(dt)
    got = lc.tensor(x).sum(-1).numpy()
    want = x.astype(np.float64).sum(-1).astype(dt)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2)


@pytest.mark.parametrize("view", ["transpose", "step", "narrow"])
def test_last_dim_f32_sum_of_strided_views(view):
    x = rng.standard_normal((F32_BLOCK + 9, 2 * F32_BLOCK + 7)).astype(np.float32)
    t = lc.tensor(x)
    tv, xv = {"transpose": (t.t(), x.T), "step": (t[::2, 1::3], x[::2, 1::3]),
              "narrow": (t.narrow(1, 5, F32_BLOCK + E + 1), x[:, 5:5 + F32_BLOCK + E + 1])}[view]
    _close(tv.sum(-1).numpy(), xv.astype(np.float64).sum(-1))
    _close(tv.sum(0).numpy(), xv.astype(np.float64).sum(0))


def test_f32_sum_over_several_dims_ending_in_the_last():
    x = rng.standard_normal((3, 5, F32_BLOCK + 17)).astype(np.float32)
    _close(lc.tensor(x).sum((0, 2)).numpy(), x.astype(np.float64).sum((0, 2)))
    _close(lc.tensor(x).sum((1, 2)).numpy(), x.astype(np.float64).sum((1, 2)), 1e-5)


def test_empty_last_dim_sum_is_zero():
    z = np.zeros((4, 0), np.float32)
    np.testing.assert_array_equal(lc.tensor(z).sum(-1).numpy(), np.zeros(4, np.float32))


@pytest.mark.parametrize("m", [33, 63, 64, 65, 100, 128, 257, 511, 512, 513, 1024, 2047, 2049, 4100])
@pytest.mark.parametrize("kind", ["sum", "mean", "max", "argmax"])
def test_leading_dim_merged_strips_match_numpy_and_each_thread_count(m, kind):
    """A 1-thread call walks a row's strips as one, a 2-thread call one strip per thread: the
    same values either way, and right at every width around the strip splits (rows of 64
    outputs and more split in two: 2 x MIN_STRIP)."""
    x = rng.standard_normal((max(150, 80000 // m), m)).astype(np.float32)    # big enough to run in parallel
    res = []
    for n in (1, 2):
        with lc.num_threads(n):
            res.append(getattr(lc.tensor(x), kind)(0).numpy())
    np.testing.assert_array_equal(res[0], res[1])
    if kind == "argmax":
        np.testing.assert_array_equal(res[0], x.argmax(0).astype(np.uint32))
    elif kind == "max":
        np.testing.assert_array_equal(res[0], x.max(0))
    else:
        _close(res[0], getattr(x.astype(np.float64), kind)(0))


def test_rows_of_two_min_strips_split_in_two():
    assert output_strips(2 * MIN_STRIP - 1) == 1 and output_strips(2 * MIN_STRIP) == 2 and MIN_STRIP <= 32


def test_leading_dim_strips_of_a_rank3_reduction_cover_every_outer_row():
    """10 units (5 outer rows x 2 strips): 2 and 3 threads start chunks in the middle of a row."""
    x = rng.standard_normal((5, 20, 1030)).astype(np.float32)
    for n in (1, 2, 3):
        with lc.num_threads(n):
            _close(lc.tensor(x).sum(1).numpy(), x.astype(np.float64).sum(1))
            np.testing.assert_array_equal(lc.tensor(x).min(1).numpy(), x.min(1))


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16])
def test_last_dim_max_min_record_a_nan_anywhere_in_the_row(kind, dt):
    """Float max / min over the last dim keep NaN apart from their accumulators: a NaN in the
    unrolled body, the one-vector loop or the scalar tail makes that row NaN; inf, -inf and
    all--inf rows stay exact."""
    n = 3 * UNROLL * E + E + 3
    x = rng.standard_normal((8, n)).astype(dt)
    x[0, 1] = np.nan
    x[1, 3 * UNROLL * E + 2] = np.nan          # the one-vector loop
    x[2, n - 1] = np.nan                       # the scalar tail
    x[3, 5] = np.inf
    x[4, :] = -np.inf
    x[5, :] = np.inf
    x[6, [0, n - 1]] = np.nan
    got = getattr(lc.tensor(x), kind)(-1).numpy()
    np.testing.assert_array_equal(got, getattr(x, kind)(-1))
    np.testing.assert_array_equal(getattr(lc.tensor(x[:, ::2]), kind)(-1).numpy(), getattr(x[:, ::2], kind)(-1))


# ---- inner-reduce row blocks: ROWS rows read side by side, the rest one at a time -------------
from lazycandle.codegen import reduce as red  # noqa: E402
from lazycandle.codegen.reduce import ROWS  # noqa: E402

TUNINGS = {cpu: red._stream_tuning(cpu) for cpu in ("sapphirerapids", "znver4")}
MAX_ROWS = max(t[0] for t in TUNINGS.values())
ROW_COUNTS = sorted({1, MAX_ROWS - 1, MAX_ROWS, MAX_ROWS + 1, 2 * MAX_ROWS + 3})
ROW_LENGTHS = [1, E - 1, 2 * E + 3, F32_BLOCK + 5]


@pytest.fixture(params=sorted(TUNINGS))
def stream_tuning(request, tmp_path, monkeypatch):
    """Kernels built under each host's stream tuning (rows side by side, prefetches), whatever
    this host is: in their own disk cache, and dropped from memory before and after."""
    monkeypatch.setenv("LAZYCANDLE_CACHE_DIR", str(tmp_path))
    lc.clear_caches()
    for name, value in zip(("ROWS", "PREFETCH", "ROW_PREFETCH_BYTES", "ONE_ROW"), TUNINGS[request.param], strict=True):
        monkeypatch.setattr(red, name, value)
    yield request.param
    monkeypatch.undo()
    lc.clear_caches()


@pytest.mark.parametrize("shape", [(2 * MAX_ROWS + 3, F32_BLOCK + 5), (9, 3 * E + 1), (40, 2 * MIN_STRIP + 3)])
def test_reductions_under_every_stream_tuning(stream_tuning, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    t = lc.tensor(x)
    for n in (1, 2):
        with lc.num_threads(n):
            for axis in (-1, 0):
                for kind in ("sum", "mean", "max", "min"):
                    _close(getattr(t, kind)(axis).numpy(), getattr(x.astype(np.float64), kind)(axis))
                np.testing.assert_array_equal(t.argmax(axis).numpy(), x.argmax(axis))
            _close((t[:, ::2] * 2.0).sum(-1).numpy(), (x[:, ::2].astype(np.float64) * 2.0).sum(-1))


@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("rows", ROW_COUNTS)
@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min"])
def test_last_dim_row_blocks_match_numpy_around_the_block_size(kind, rows, n):
    x = rng.standard_normal((rows, n)).astype(np.float32)
    t = lc.tensor(x)
    got, got_keep = getattr(t, kind)(-1).numpy(), getattr(t, f"{kind}_keepdim")(-1).numpy()
    want = getattr(x.astype(np.float64), kind)(-1)
    _close(got, want)
    assert got_keep.shape == (rows, 1)
    _close(got_keep[:, 0], want)


@pytest.mark.parametrize("dt", [np.float64, np.int32, np.int64, np.uint8, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("kind", ["sum", "max", "min"])
def test_last_dim_row_blocks_of_other_dtypes(kind, dt):
    """Integer sums wrap in their dtype (NumPy's int sum of the same dtype), f16 / bf16 sums are
    the f64 sum rounded to the dtype within its precision, max / min are exact."""
    rows, n = 2 * ROWS + 1, F32_BLOCK + 3 * E + 1
    if np.dtype(dt).kind in "iu":
        x = rng.integers(0, 100, (rows, n)).astype(dt)
    else:
        x = rng.uniform(-1, 1, (rows, n)).astype(dt)
    got = getattr(lc.tensor(x), kind)(-1).numpy()
    if kind != "sum":
        np.testing.assert_array_equal(got, getattr(x, kind)(-1))
    elif np.dtype(dt).kind in "iu":
        np.testing.assert_array_equal(got, x.sum(-1, dtype=got.dtype))
    else:
        want = x.astype(np.float64).sum(-1)
        tol = 1e-12 if dt == np.float64 else 1e-2
        np.testing.assert_allclose(got.astype(np.float64), want.astype(dt).astype(np.float64), rtol=tol)


@pytest.mark.parametrize("view", ["transpose", "step", "broadcast_row", "broadcast_col", "rank3_middle"])
def test_last_dim_row_blocks_of_strided_and_broadcast_inputs(view):
    x = rng.standard_normal((2 * ROWS + 3, F32_BLOCK + E + 1)).astype(np.float32)
    t = lc.tensor(x)
    tv, xv = {"transpose": (t.t(), x.T),
              "step": (t[1::3, ::2], x[1::3, ::2]),
              "broadcast_row": (t[:1].expand(9, x.shape[1]), np.broadcast_to(x[:1], (9, x.shape[1]))),
              "broadcast_col": (t[:, :1].expand(x.shape[0], 37), np.broadcast_to(x[:, :1], (x.shape[0], 37))),
              "rank3_middle": (lc.tensor(x.reshape(1, *x.shape)).expand(3, *x.shape),
                               np.broadcast_to(x, (3, *x.shape)))}[view]
    for kind in ("sum", "max", "min"):
        _close(getattr(tv, kind)(-1).numpy(), getattr(xv.astype(np.float64), kind)(-1))
    _close((tv * 2.0 - 1.0).sum(-1).numpy(), (xv.astype(np.float64) * 2.0 - 1.0).sum(-1))


def test_last_dim_reductions_of_empty_and_rank0_inputs():
    for shape in [(0, 5), (ROWS + 1, 0), (0, 0)]:
        z = np.ones(shape, np.float32)
        np.testing.assert_array_equal(lc.tensor(z).sum(-1).numpy(), z.sum(-1))
    s = lc.tensor(np.float32(3.5))
    assert float(s.sum().numpy()) == 3.5 and float(s.max().numpy()) == 3.5


@pytest.mark.parametrize("kind", ["max", "min"])
def test_last_dim_row_blocks_keep_each_rows_nan_to_itself(kind):
    """A NaN in one row of a block makes that row NaN and no other, at every position of the
    block and in the rows left over after the last block."""
    rows, n = 2 * ROWS + 3, 2 * E + 3
    x = rng.standard_normal((rows, n)).astype(np.float32)
    for r in range(0, rows, 2):
        x[r, (r * 5) % n] = np.nan
    got = getattr(lc.tensor(x), kind)(-1).numpy()
    np.testing.assert_array_equal(got, getattr(x, kind)(-1))


@pytest.mark.parametrize("kind", ["sum", "mean", "max"])
def test_last_dim_results_do_not_depend_on_the_thread_split(kind):
    """Chunks of 2 and 3 threads start inside a block of ROWS rows; each row is reduced in the
    same order whether it runs in a block or alone, so the bits match the 1-thread call."""
    x = rng.standard_normal((4 * ROWS * 20 + 3, 2 * F32_BLOCK + 2 * E + 5)).astype(np.float32)
    res = []
    for n in (1, 2, 3):
        with lc.num_threads(n):
            res.append(getattr(lc.tensor(x), kind)(-1).numpy())
    np.testing.assert_array_equal(res[0], res[1])
    np.testing.assert_array_equal(res[0], res[2])
    _close(res[0], getattr(x.astype(np.float64), kind)(-1))


def _sums(x):
    t = lc.tensor(x)
    return {"sum(-1)": (t.sum(-1), x.astype(np.float64).sum(-1), x.sum(-1)),
            "sum(0)": (lc.tensor(np.ascontiguousarray(x.T)).sum(0), x.astype(np.float64).sum(-1),
                       np.ascontiguousarray(x.T).sum(0)),
            "mean(-1) * n": (t.mean(-1) * x.shape[1], x.astype(np.float64).sum(-1), None)}


@pytest.mark.parametrize("dt", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_f32_valued_sum_that_cancels_stays_within_the_paired_bound(dt):
    """Rows (and columns) of values and their negatives in another order sum to exactly 0 in
    f64.  Over the last dim PAIRED registers of a row are added pairwise in f32 before one
    widening, so a value meets at most log2(PAIRED) f32 roundings: the error is at most
    log2(PAIRED) u sum|x|, u = 2^-24; over leading dims CHAIN rows meet in one f32 chain, at
    most (CHAIN - 1) u sum|x| (the f64 additions and the final rounding of 0 add nothing
    measurable).  Widening every value first made these sums exactly 0."""
    lo, hi = (50, 150) if dt == np.float32 else (0.5, 1.5)
    v = rng.uniform(lo, hi, (4, 2048)).astype(dt)
    x = np.concatenate([v, -rng.permuted(v, axis=1)], axis=1)
    roundings = {"sum(-1)": np.log2(PAIRED), "sum(0)": CHAIN - 1, "mean(-1) * n": np.log2(PAIRED)}
    for name, (got, want, _) in _sums(x).items():
        bound = roundings[name] * 2.0 ** -24 * np.abs(x.astype(np.float64)).sum(-1)
        assert not want.any()
        err = np.abs(got.numpy().astype(np.float64) - want)
        assert (err <= bound).all(), (name, err, bound)
        if dt == np.float32:
            assert err.max() > 0        # (f32 roundings do happen: the bound is not vacuous)


@pytest.mark.parametrize("threads", [1, 2])
def test_f32_sums_of_normal_rows_err_less_than_numpys(threads):
    """On rows of normal values the paired and chained sums stay inside SPEC's rtol / atol 1e-5
    on every row (f32 partials per block of 256 values did not: rows that nearly cancel) and
    their error against the f64 sum is well under NumPy's own f32 sum's on the same array (root
    mean square over the rows: about 0.4x its pairwise sum(-1), 0.07x its row-by-row sum(0);
    sum(0)'s chains of 16 rows are 0.7x NumPy's pairwise sum of the same values)."""
    x = np.random.default_rng(3).standard_normal((1024, 4096)).astype(np.float32)
    with lc.num_threads(threads):
        for name, (got, want, numpys) in _sums(x).items():
            got = got.numpy().astype(np.float64)
            _close(got, want)
            if numpys is not None:
                rms, rms_np = (np.sqrt(np.mean((g - want) ** 2)) for g in (got, numpys.astype(np.float64)))
                assert rms < 0.6 * rms_np, (name, rms, rms_np)


# ---- inner-output passes: one row per pass (a whole-row strip) or ROW_BLOCK rows per pass ------
SUM0_ROWS = sorted({1, CHAIN - 1, CHAIN + 1, 2 * CHAIN + red.ROW_BLOCK + 1})
SUM0_COLS = [1, 2 * UNROLL * E + E + 3, 700]
SUM0_DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int32]


def _leading_dim_results(xs):
    """sum(0) and max(0) of every input; for f32 also min, mean, a fused producer, a flipped view
    and rank-3 reductions over leading dims."""
    out = {}
    for key, x in xs.items():
        t = lc.tensor(x)
        res = [t.sum(0), t.max(0)]
        if x.dtype == np.float32:
            t3 = lc.tensor(np.stack([x, -x, x * 2]))
            res += [t.min(0), t.mean(0), (t * 2.0 - 1.0).sum(0), t[:, ::-1].sum(0), t3.sum(1), t3.sum((0, 1)), t3.max(1)]
        out[key] = [r.numpy() for r in res]
    return out


def test_leading_dim_one_row_and_blocked_passes_agree_bit_for_bit(tmp_path, monkeypatch):
    """A strip of a whole row reads one row per pass, the strips of two threads sharing a row
    ROW_BLOCK rows per pass; an f32-valued sum adds each group of CHAIN rows in the same f32
    chain either way, so both forms give the same bits -- around the group and block sizes, on
    the vector edges of the strip, for every dtype (f64 and integer sums take the plain
    accumulate), with fused producers, a flipped view and rank-3 reductions -- and match NumPy
    in f64."""
    monkeypatch.setenv("LAZYCANDLE_CACHE_DIR", str(tmp_path))
    xs = {(r, c, np.dtype(dt).name): (rng.standard_normal((r, c)) * 50).astype(dt)
          for r in SUM0_ROWS for c in SUM0_COLS for dt in SUM0_DTYPES}
    got = {}
    try:
        for form, one_row in (("one row", True), ("blocked", False)):
            lc.clear_caches()
            monkeypatch.setattr(red, "ONE_ROW", one_row)
            got[form] = _leading_dim_results(xs)
    finally:
        monkeypatch.undo()
        lc.clear_caches()
    for key, x in xs.items():
        for a, b in zip(got["one row"][key], got["blocked"][key], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=str(key))
        s, mx = got["one row"][key][:2]
        if x.dtype == np.int32:
            np.testing.assert_array_equal(s, x.sum(0, dtype=np.int32))
        else:
            tol = 1e-5 if x.dtype.itemsize >= 4 else 1e-2
            np.testing.assert_allclose(s.astype(np.float64), x.astype(np.float64).sum(0), rtol=tol, atol=tol * 50)
        np.testing.assert_array_equal(mx, x.max(0))


@pytest.mark.parametrize("threads", [1, 2])
def test_leading_dim_sum_of_a_wide_row_keeps_nan_and_inf(threads):
    """A NaN or inf in any row of a group (first, middle or last pass of the chain, or a row
    after the last group) reaches its column's sum; +inf and -inf in one column give NaN."""
    x = rng.standard_normal((2 * CHAIN + 3, 1030)).astype(np.float32)
    x[0, 1] = np.nan
    x[CHAIN // 2, 2] = np.inf
    x[CHAIN - 1, 3] = -np.inf
    x[2 * CHAIN + 2, 4] = np.nan
    x[1, 5], x[CHAIN + 1, 5] = np.inf, -np.inf
    with lc.num_threads(threads):
        got = lc.tensor(x).sum(0).numpy()
    with np.errstate(invalid="ignore"):
        want = x.astype(np.float64).sum(0)
    np.testing.assert_array_equal(got[1:6], want[1:6].astype(np.float32))
    _close(got[6:], want[6:])


def _split_everything(monkeypatch):
    """Split leading-dim sums of inputs of any size (tensor_reduce.SPLIT_MIN_BYTES: 32 MiB)."""
    from lazycandle import tensor_reduce
    monkeypatch.setattr(tensor_reduce, "SPLIT_MIN_BYTES", 0)
    lc.clear_caches()       # (recipes of the unsplit forms)
    return tensor_reduce.SPLIT_CHUNKS


def _is_split(t) -> bool:
    """The reduction reads the results of another reduction (its chunks)."""
    n = t._node._base or t._node
    src = n.srcs[0]
    return (src._base or src).op.category == "reduce"


SPLIT_VIEWS = {"contiguous": (lambda t: t, lambda a: a), "transposed": (lambda t: t.t(), lambda a: a.T),
               "narrowed": (lambda t: t.narrow(1, 2, 5), lambda a: a[:, 2:7]),
               "flipped": (lambda t: t.flip(0), lambda a: a[::-1])}


@pytest.mark.parametrize("kind", ["sum", "mean"])
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("view", list(SPLIT_VIEWS))
@pytest.mark.parametrize("keepdim", [False, True])
def test_leading_dim_sum_split_in_chunks_matches_numpy_on_every_view(monkeypatch, kind, dt, view, keepdim):
    """A sum or mean over the first dim of a stored input is two reductions (chunks of the rows,
    then the chunks): the same values as NumPy in f64 on views of every kind, keepdim or not."""
    if kind == "mean" and dt is np.int32:
        return
    k = _split_everything(monkeypatch)
    base = (rng.standard_normal((8 * k, 12)) * 50).astype(dt)
    view_lc, view_np = SPLIT_VIEWS[view]
    x_np = view_np(base) if view != "transposed" else view_np(base.reshape(12, 8 * k))
    x = view_lc(lc.tensor(base if view != "transposed" else base.reshape(12, 8 * k)))
    got = getattr(x, kind)(0, keepdim=keepdim)
    assert _is_split(got)
    want = getattr(x_np.astype(np.float64), kind)(axis=0, keepdims=keepdim)
    assert got.shape == want.shape and got.dtype.numpy == dt
    if dt is np.int32:
        np.testing.assert_array_equal(got.numpy(), want.astype(np.int32))
    else:
        _close(got.numpy(), want, 1e-5 if dt is np.float32 else 1e-12)


def test_split_sum_gives_the_same_bits_at_any_thread_count_and_compiled(monkeypatch):
    k = _split_everything(monkeypatch)
    a = rng.standard_normal((64 * k, 3, 40)).astype(np.float32)
    x = lc.tensor(a)
    outs = []
    for threads in (1, 2):
        with lc.num_threads(threads):
            outs.append(x.sum(0).numpy())
            outs.append(lc.compile([lc.placeholder("x", a.shape).sum(0)]).run(x=a)[0])
    assert all(np.array_equal(o, outs[0]) for o in outs[1:])
    _close(outs[0], a.astype(np.float64).sum(0))


def test_what_stays_one_reduction(monkeypatch):
    """A computed input (its producers stay fused), other kinds and dtypes, rows that do not
    split in SPLIT_CHUNKS, rows wider than SPLIT_MAX_ROW_BYTES, other dims: one reduction."""
    from lazycandle import tensor_reduce
    k = _split_everything(monkeypatch)
    x = lc.tensor(rng.standard_normal((8 * k, 12)).astype(np.float32))
    assert _is_split(x.sum(0))
    assert not _is_split((x * 2.0).sum(0))
    assert not _is_split(x.max(0)) and not _is_split(x.prod(0))
    assert not _is_split(lc.tensor(np.ones((8 * k, 12), np.float16)).sum(0))
    assert not _is_split(lc.tensor(np.ones((8 * k + 1, 12), np.float32)).sum(0))
    wide = tensor_reduce.SPLIT_MAX_ROW_BYTES // 4 + 1
    assert not _is_split(lc.tensor(np.ones((8 * k, wide), np.float32)).sum(0))
    assert not _is_split(lc.tensor(np.ones((8 * k, 3, 4), np.float32)).sum(1))
    assert not _is_split(lc.tensor(np.ones((8 * k,), np.float32)).sum(0))


def test_split_sum_differentiates_like_the_plain_one(monkeypatch):
    k = _split_everything(monkeypatch)
    a = rng.standard_normal((8 * k, 5))
    x = lc.Var(a)
    w = rng.standard_normal(5)
    loss = (x.mean(0) * lc.tensor(w)).sum() + x.sum(0).sum()
    g = loss.backward()[x].numpy()
    np.testing.assert_allclose(g, np.broadcast_to(w / (8 * k) + 1.0, a.shape), rtol=1e-12)


def test_a_computed_input_first_leaves_no_recipe_that_skips_the_split(monkeypatch):
    """The split of a key depends on its input: a recipe filed by a computed input's build
    must not make a stored input's later build one reduction (nor the other way round)."""
    k = _split_everything(monkeypatch)
    x = lc.tensor(rng.standard_normal((8 * k, 12)).astype(np.float32))
    assert not _is_split((x * 2.0).sum(0))
    assert _is_split(x.sum(0)) and _is_split(x.sum(0))
    assert not _is_split((x * 2.0).sum(0))
