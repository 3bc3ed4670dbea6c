"""The matmul kernels (lazycandle.runtime.matmul) on raw storage + Layout, both backends,
against NumPy: float64 reference for floats (rounded once for f16/bf16/f8), wrap-around
uint64 arithmetic for integers."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from ml_dtypes import finfo

from lazycandle import config
from lazycandle import dtype as D
from lazycandle.layout import Layout, contiguous_strides
from lazycandle.runtime import matmul as MM, matmul_blas
from lazycandle.runtime.matmul import matmul

FLOATS = [D.f32, D.f64, D.f16, D.bf16, D.f8e4m3]
INTS = [D.i32, D.i64, D.u32, D.i16, D.u8]
BACKENDS = ["blas", "tiled"]


# ---- operands ---------------------------------------------------------------------------
def fill(rng, dt: D.DType, n: int, exact: bool = True) -> np.ndarray:
    """n random storage elements.  Float data is exactly representable and small enough that
    an f32 accumulation is exact, so low-precision results can be compared bit for bit."""
    if dt.is_int:
        info = np.iinfo(dt.numpy)
        return rng.integers(info.min, info.max, size=n, endpoint=True, dtype=dt.numpy)
    if exact:
        vals = np.array([-1, -0.5, 0, 0.5, 1]) if dt is D.f8e4m3 else np.arange(-3, 4)
        return rng.choice(vals, size=n).astype(dt.numpy)
    return rng.standard_normal(n).astype(dt.numpy)


def operand(rng, dt, shape, strides=None, offset=0, exact=True):
    """A storage buffer, its Layout, and the NumPy view of the same elements."""
    strides = tuple(contiguous_strides(shape)) if strides is None else tuple(strides)
    span = 1 + sum((d - 1) * s for d, s in zip(shape, strides)) if all(shape) else 0
    buf = fill(rng, dt, offset + max(span, 0) + 3, exact)
    view = np.lib.stride_tricks.as_strided(buf[offset:], shape, [s * buf.itemsize for s in strides])
    return buf, Layout(tuple(shape), strides, offset), view


def transposed(shape):
    """Strides of a (..., r, c) view that is the transpose of a contiguous (..., c, r) array."""
    s = list(contiguous_strides(shape[:-2] + (shape[-1], shape[-2])))
    s[-1], s[-2] = s[-2], s[-1]
    return tuple(s)


# ---- reference --------------------------------------------------------------------------
def reference(av, bv, dt):
    if dt.is_int:
        wide = np.matmul(av.astype(np.int64).astype(np.uint64), bv.astype(np.int64).astype(np.uint64))
        return wide.astype(dt.numpy)
    with np.errstate(invalid="ignore"):
        return np.matmul(av.astype(np.float64), bv.astype(np.float64))


def ulp(x: np.ndarray, dt) -> np.ndarray:
    fi = finfo(dt.numpy)
    e = np.floor(np.log2(np.maximum(np.abs(x), float(fi.smallest_normal))))
    return np.exp2(e - fi.nmant)


def check(out, ref, dt, exact=True):
    got = out.reshape(ref.shape)
    if dt.is_int:
        np.testing.assert_array_equal(got, ref)
        return
    scale = max(float(np.abs(ref).max()) if ref.size else 0.0, 1e-30)
    if dt in (D.f32, D.f64):
        tol = (1e-5 if dt is D.f32 else 1e-12) * scale
        err = np.abs(got.astype(np.float64) - ref).max() if ref.size else 0.0
        assert err <= tol, f"{dt}: max error {err} > {tol} (scale {scale})"
        return
    rounded = ref.astype(dt.numpy).astype(np.float64)
    g = got.astype(np.float64)
    if exact:
        np.testing.assert_array_equal(g, rounded)
    else:
        bad = np.abs(g - rounded) > ulp(rounded, dt) + 2.0 ** -20 * scale
        assert not bad.any(), f"{dt}: {bad.sum()} elements beyond 1 ulp, e.g. {g[bad][:4]} vs {rounded[bad][:4]}"


def run(a, b, dt, backend, out_shape):
    (abuf, alay, _), (bbuf, blay, _) = a, b
    out = np.full(int(np.prod(out_shape)), 7, dt.numpy)       # garbage that must be overwritten
    used = matmul(abuf, alay, bbuf, blay, out, dt, backend)
    return out, used


def mm_case(rng, dt, backend, a_shape, b_shape, a_str=None, b_str=None, a_off=0, b_off=0, exact=True):
    a = operand(rng, dt, a_shape, a_str, a_off, exact)
    b = operand(rng, dt, b_shape, b_str, b_off, exact)
    out_shape = tuple(a_shape[:-1]) + (b_shape[-1],)
    out, used = run(a, b, dt, backend, out_shape)
    check(out, reference(a[2], b[2], dt), dt, exact)
    return out, used


# ---- tests ------------------------------------------------------------------------------
SHAPES = [(1, 1, 1), (7, 7, 7), (64, 64, 64), (129, 129, 129), (257, 257, 257),
          (1, 257, 7), (129, 1, 64), (64, 129, 1), (257, 7, 129), (5, 300, 3)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", FLOATS + INTS, ids=lambda d: d.name)
def test_shapes(dt, backend):
    rng = np.random.default_rng(1)
    for m, k, n in SHAPES:
        _, used = mm_case(rng, dt, backend, (m, k), (k, n))
        expected = "tiled" if (dt.is_int or backend == "tiled") else "blas"
        assert used == expected


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", [D.f16, D.bf16, D.f32, D.f64], ids=lambda d: d.name)
def test_random_normal_data(dt, backend):
    rng = np.random.default_rng(2)
    for m, k, n in [(33, 300, 17), (129, 257, 65)]:
        mm_case(rng, dt, backend, (m, k), (k, n), exact=False)


LAYOUTS = {
    "nn": lambda m, k, n: (None, None, 0, 0),
    "tn": lambda m, k, n: (transposed((m, k)), None, 0, 0),
    "nt": lambda m, k, n: (None, transposed((k, n)), 0, 0),
    "tt": lambda m, k, n: (transposed((m, k)), transposed((k, n)), 0, 0),
    "narrow+offset": lambda m, k, n: ((k + 5, 1), (n + 3, 1), 11, 4),
    "strided cols": lambda m, k, n: ((2 * k, 2), (1, k + 2), 1, 3),
    "broadcast rows": lambda m, k, n: ((0, 1), (n, 1), 2, 0),      # every row of a the same
    "broadcast cols": lambda m, k, n: ((k, 1), (1, 0), 0, 5),      # every column of b the same
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dt", [D.f32, D.f16, D.i32, D.f64], ids=lambda d: d.name)
def test_layouts(dt, layout, backend):
    rng = np.random.default_rng(3)
    for m, k, n in [(7, 5, 3), (129, 66, 70), (20, 257, 33)]:
        a_str, b_str, a_off, b_off = LAYOUTS[layout](m, k, n)
        mm_case(rng, dt, backend, (m, k), (k, n), a_str, b_str, a_off, b_off)


def _batch_strides(shape, broadcast_dims, base=None):
    s = list(contiguous_strides(shape) if base is None else base)
    for d in broadcast_dims:
        s[d] = 0
    return tuple(s)


BATCHED = {
    # name: (a_shape, b_shape, a_strides, b_strides)
    "plain": ((4, 9, 13), (4, 13, 6), None, None),
    "rhs broadcast (fold into m)": ((5, 9, 13), (5, 13, 6), None, (0, 6, 1)),
    "lhs broadcast": ((6, 9, 13), (6, 13, 11), (0, 13, 1), None),
    "lhs broadcast row, rhs transposed (fold into n)": ((6, 1, 13), (6, 13, 11), (0, 13, 1), (143, 1, 13)),
    "lhs broadcast, rhs transposed": ((3, 9, 13), (3, 13, 11), (0, 13, 1), (143, 1, 13)),
    "both broadcast": ((3, 4, 5), (3, 5, 6), (0, 5, 1), (0, 6, 1)),
    "permuted batch": ((3, 4, 5, 6), (3, 4, 6, 2), (5 * 6, 3 * 5 * 6, 6, 1), None),
    "mixed broadcast 4d": ((2, 3, 7, 5), (2, 3, 5, 4), (35, 0, 5, 1), (0, 20, 4, 1)),
    "transposed batch": ((4, 9, 13), (4, 13, 6), (117, 1, 9), (78, 1, 13)),
    "many small": ((64, 3, 4), (64, 4, 5), None, None),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(BATCHED))
@pytest.mark.parametrize("dt", [D.f32, D.bf16, D.i64], ids=lambda d: d.name)
def test_batched(dt, case, backend):
    rng = np.random.default_rng(4)
    a_shape, b_shape, a_str, b_str = BATCHED[case]
    mm_case(rng, dt, backend, a_shape, b_shape, a_str, b_str, 3, 1)


def test_broadcast_lhs_big_blas():
    """(m, k) broadcast against (B, k, n): the case candle 0.11 computes as (m, B*n)."""
    rng = np.random.default_rng(5)
    for backend in BACKENDS:
        mm_case(rng, D.f32, backend, (8, 64, 48), (8, 48, 40), (0, 48, 1), None)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", [D.f32, D.f16, D.i32, D.u8], ids=lambda d: d.name)
def test_zero_sizes(dt, backend):
    rng = np.random.default_rng(6)
    for a_shape, b_shape in [((0, 4), (4, 5)), ((3, 4), (4, 0)), ((3, 0), (0, 5)), ((0, 3, 4), (0, 4, 5)),
                             ((2, 3, 0), (2, 0, 5)), ((0, 0), (0, 0))]:
        out, _ = mm_case(rng, dt, backend, a_shape, b_shape)
        if a_shape[-1] == 0:
            assert (out.astype(np.float64) == 0).all()        # k == 0: zeros, not garbage


def test_no_copy_for_contiguous_or_transposed(monkeypatch):
    """Under "blas", f32 operands that are contiguous or transposed go to sgemm as they are."""
    def boom(*args, **kw):
        raise AssertionError("operand copied")
    monkeypatch.setattr(matmul_blas, "CopyPlan", boom)
    monkeypatch.setattr(MM, "_plans", {})
    rng = np.random.default_rng(7)
    for m, k, n in [(33, 17, 9), (1, 5, 7), (6, 1, 4)]:
        for a_str, b_str in [(None, None), (transposed((m, k)), None), (None, transposed((k, n))),
                             (transposed((m, k)), transposed((k, n)))]:
            mm_case(rng, D.f32, "blas", (m, k), (k, n), a_str, b_str)
    mm_case(rng, D.f64, "blas", (3, 9, 13), (3, 13, 11), (0, 13, 1), (143, 1, 13))


def test_blas_folds_broadcast_rhs_into_one_call(monkeypatch):
    calls = []
    real = matmul_blas.BlasPlan.run
    monkeypatch.setattr(matmul_blas.BlasPlan, "run",
                        lambda self, *a: (calls.extend(j[2] for j in self.jobs), real(self, *a)))
    monkeypatch.setattr(MM, "_plans", {})
    rng = np.random.default_rng(8)
    mm_case(rng, D.f32, "blas", (5, 9, 13), (5, 13, 6), None, (0, 6, 1))
    assert calls == [45]                       # one GEMM with M = 5 * 9


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", [D.f32, D.bf16, D.i32, D.f64], ids=lambda d: d.name)
def test_threads_give_identical_results(dt, backend):
    rng = np.random.default_rng(9)
    a = operand(rng, dt, (3, 150, 260), exact=False)
    b = operand(rng, dt, (3, 260, 140), transposed((3, 260, 140)), exact=False)
    a1 = operand(rng, dt, (300, 257), exact=False)
    b1 = operand(rng, dt, (257, 190), exact=False)
    old = config.get_num_threads()
    try:
        results = []
        for t in (1, 2):
            config.set_num_threads(t)
            results.append((run(a, b, dt, backend, (3, 150, 140))[0], run(a1, b1, dt, backend, (300, 190))[0]))
    finally:
        config.set_num_threads(old)
    for x, y in zip(*results):
        if backend == "blas" and not dt.is_int:
            # BLAS cut into row blocks at 2 threads: the same bits with SkylakeX's kernels, not
            # always with Haswell's (an AVX2 Zen 3): equal within SPEC's matmul tolerance
            np.testing.assert_allclose(x.astype(np.float64), y.astype(np.float64), rtol=2e-2 if dt is D.bf16 else 1e-5,
                                       atol=1e-2 if dt is D.bf16 else 1e-5)
        else:
            np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", [D.f32, D.f16], ids=lambda d: d.name)
def test_nan_inf_propagate(dt, backend):
    rng = np.random.default_rng(13)
    a = operand(rng, dt, (9, 20))
    b = operand(rng, dt, (20, 7))
    a[0][3] = np.inf            # a[0, 3]: row 0 gets inf (or nan where it meets a zero)
    a[0][2 * 20 + 5] = np.nan   # a[2, 5]: row 2 is all nan
    b[0][4 * 7 + 1] = -np.inf   # b[4, 1]: column 1 gets -inf
    out, _ = run(a, b, dt, backend, (9, 7))
    ref = reference(a[2], b[2], dt).astype(dt.numpy).astype(np.float64)
    np.testing.assert_array_equal(out.reshape(9, 7).astype(np.float64), ref)


def test_auto_and_unknown_backend():
    rng = np.random.default_rng(10)
    _, used = mm_case(rng, D.f32, "auto", (300, 300), (300, 300))
    assert used in ("blas", "tiled")
    _, used = mm_case(rng, D.i32, "auto", (30, 30), (30, 30))
    assert used == "tiled"
    with pytest.raises(ValueError):
        mm_case(rng, D.f32, "cuda", (3, 3), (3, 3))


def test_blas_thread_count_follows_config():
    from lazycandle.runtime import blas
    if not blas.available():
        pytest.skip("no BLAS library")
    old = config.get_num_threads()
    try:
        config.set_num_threads(1)
        assert blas.info()["threads"] == 1
        config.set_num_threads(2)
        assert blas.info()["threads"] == 2
    finally:
        config.set_num_threads(old)


def test_blas_runs_single_threaded_inside_the_block_and_at_the_setting_after():
    """BlasPlan's BLAS calls run single-threaded inside the library (our pool runs the
    pieces); before and after the block the library's count is lazycandle's setting."""
    from lazycandle.runtime import blas
    if not blas.available():
        pytest.skip("no BLAS library")
    old = config.get_num_threads()
    try:
        for threads in (2, 1):
            config.set_num_threads(threads)
            with blas.single_threaded():
                assert blas.info()["threads"] == 1
            assert blas.info()["threads"] == threads
        with pytest.raises(RuntimeError):
            config.set_num_threads(2)
            with blas.single_threaded():
                raise RuntimeError("a failing BLAS piece")
        assert blas.info()["threads"] == 2
    finally:
        config.set_num_threads(old)


@st.composite
def problems(draw):
    dt = draw(st.sampled_from([D.f32, D.f64, D.f16, D.bf16, D.f8e4m3, D.i32, D.i64, D.u32, D.u8]))
    backend = draw(st.sampled_from(BACKENDS))
    m, k, n = (draw(st.integers(0, 19)) for _ in range(3))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))

    def strides(shape, trans):
        base = transposed(shape) if trans and len(shape) >= 2 else contiguous_strides(shape)
        out = []
        for d, s in zip(shape, base):
            kind = draw(st.sampled_from(["keep", "keep", "gap", "zero"]))
            out.append(0 if kind == "zero" else
                       s * 2 if kind == "gap" else s)
        return tuple(out)

    a_shape, b_shape = batch + (m, k), batch + (k, n)
    return (dt, backend, a_shape, b_shape, strides(a_shape, draw(st.booleans())),
            strides(b_shape, draw(st.booleans())), draw(st.integers(0, 5)), draw(st.integers(0, 5)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_hypothesis_strides(problem):
    dt, backend, a_shape, b_shape, a_str, b_str, a_off, b_off = problem
    mm_case(np.random.default_rng(11), dt, backend, a_shape, b_shape, a_str, b_str, a_off, b_off)


@pytest.mark.parametrize("bits", [256, 512])
def test_tiled_generator_is_parametric(monkeypatch, bits):
    """The AVX2 (6 x 2 vectors) and AVX-512 (14 x 2 vectors for floats, 6 x 4 for integers)
    tiles stay correct whatever the host: LLVM legalises the wider vectors on narrower hosts.
    Sizes around the register tile, k not a multiple of the unroll, transposed and sliced
    operands (the register tiles: AMX, which an AMX host would run bf16 on, off)."""
    from lazycandle.codegen import gemm
    monkeypatch.setenv("LAZYCANDLE_AMX", "off")
    real = gemm.choose_tile
    monkeypatch.setattr(gemm, "choose_tile", lambda dt, vector_bits=None: real(dt, bits))
    monkeypatch.setattr(MM, "_tile_kernels", {})
    monkeypatch.setattr(MM, "_plans", {})
    rng = np.random.default_rng(12)
    for dt in (D.f32, D.bf16, D.f64, D.i32):
        mr, nv, vw = real(dt, bits)
        nr = nv * vw
        assert (MM._tile_kernel(dt)[0].mr, MM._tile_kernel(dt)[0].nr) == (mr, nr)
        for m, k, n in [(7, 5, 70), (129, 200, 65), (mr - 1, 3, nr + 1), (mr + 1, 257, nr - 1),
                        (2 * mr, 1, 2 * nr), (3 * mr + 1, 6, 3 * nr + 1)]:
            mm_case(rng, dt, "tiled", (m, k), (k, n), transposed((m, k)), None)
            mm_case(rng, dt, "tiled", (m, k), (k, n), (2 * k + 3, 1), (1, k + 2), 1, 4)    # gaps, transposed B


@pytest.mark.parametrize("dt", [D.f32, D.f64, D.bf16, D.i32, D.u8], ids=lambda d: d.name)
def test_tiled_packs_k_contiguous_rows_by_register_transpose(dt):
    """A with unit k stride (row-major) and B with unit k stride (transposed) are packed by
    vector loads along k and an in-register transpose of vector-width blocks of rows, with a
    masked store for a partial block of rows (14 rows of 16 lanes; f64: 8 + 6) and the k tail
    per element: k around the vector width, rows around the panel width, row gaps."""
    rng = np.random.default_rng(21)
    spec = MM._tile_kernel(dt)[0]
    vw, mr, nr = spec.vw, spec.mr, spec.nr
    for m, k, n in [(mr, vw, nr), (mr + 1, vw - 1, nr - 1), (2 * mr - 1, vw + 1, 2 * nr + 3),
                    (3 * mr, 3 * vw + 5, nr + 1), (mr - 1, 2 * vw, 3)]:
        mm_case(rng, dt, "tiled", (m, k), (k, n), None, transposed((k, n)))
        mm_case(rng, dt, "tiled", (m, k), (k, n), (k + 3, 1), (1, k + 5), 2, 1)      # row gaps


@pytest.mark.parametrize("dt", [D.f32, D.f64, D.f16, D.bf16, D.f8e4m3, D.i32, D.i16, D.u8], ids=lambda d: d.name)
def test_tiled_packs_a_transposed_a_by_one_vector_per_k(dt):
    """A with unit row stride (a transposed operand: the backward's dW = x^T @ dy) is packed by
    one MR-wide vector load and store per k (MR is 14 for f32, not a power of two): full
    panels, a partial last panel, k of 1, column gaps and an offset."""
    rng = np.random.default_rng(22)
    mr = MM._tile_kernel(dt)[0].mr
    for m, k, n in [(mr, 1, 5), (mr + 1, 7, 33), (3 * mr, 70, 17), (5 * mr - 1, 257, 40)]:
        mm_case(rng, dt, "tiled", (m, k), (k, n), transposed((m, k)), None)
        mm_case(rng, dt, "tiled", (m, k), (k, n), (1, m + 3), transposed((k, n)), 5, 2)   # column gaps


@pytest.mark.parametrize("dt", [D.f32, D.bf16, D.i32, D.f64], ids=lambda d: d.name)
def test_tiled_last_row_tile_of_every_height_uses_the_smallest_micro_kernel_that_fits(dt, monkeypatch):
    """Every remainder of rows after whole register tiles (1 .. MR-1, inside and at the end of
    an MC block) goes to the micro-kernel of 4, 8 or MR rows; KC cut to 8 so that the 16-bit
    types also add partial sums across KC blocks in those kernels."""
    from lazycandle.codegen import gemm
    monkeypatch.setattr(MM, "_plans", {})
    monkeypatch.setattr(MM, "_blocking", lambda spec, ab, k: (3 * spec.mr, 8, 4 * spec.nr))
    mr = MM._tile_kernel(dt)[0].mr
    assert gemm.edge_rows(14) == (4, 8) and gemm.edge_rows(6) == (4,)
    rng = np.random.default_rng(22)
    for m in range(1, 2 * mr + 1):
        mm_case(rng, dt, "tiled", (m, 19), (19, 37))
    mm_case(rng, dt, "tiled", (3 * mr + 5, 19), (19, 37), transposed((3 * mr + 5, 19)))


@pytest.mark.parametrize("keep_a", [True, False])
@pytest.mark.parametrize("dt", [D.f32, D.f16, D.bf16, D.i16, D.f64], ids=lambda d: d.name)
def test_tiled_cache_blocking_edges(dt, keep_a, monkeypatch):
    """Tiny MC / KC / NC and scratch budgets, and tasks split however small, so every blocking
    loop, the partial-sum scratch of the 16-bit types (per NC block), the packed-A reuse across
    NC blocks and tasks, and the task split all run many times with ragged edges."""
    monkeypatch.setattr(MM, "_plans", {})
    monkeypatch.setattr(MM, "_blocking", lambda spec, ab, k: (2 * spec.mr, 8, 2 * spec.nr))
    monkeypatch.setattr(MM, "W_BYTES", 4096)
    monkeypatch.setattr(MM, "W_MAX_ROWS", 20)
    monkeypatch.setattr(MM, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(MM, "A_KEEP_BYTES", 1 << 30 if keep_a else 0)
    rng = np.random.default_rng(14)
    old = config.get_num_threads()
    try:
        for threads in (1, 2, 3):
            config.set_num_threads(threads)
            for m, k, n in [(50, 37, 70), (13, 9, 100), (64, 8, 33)]:
                mm_case(rng, dt, "tiled", (m, k), (k, n), transposed((m, k)))
                mm_case(rng, dt, "tiled", (3, m, k), (3, k, n), None, (0, n, 1))
                mm_case(rng, dt, "tiled", (3, m, k), (3, k, n), (0, k, 1), transposed((3, k, n)), 2, 1)
    finally:
        config.set_num_threads(old)


@pytest.mark.parametrize("dt", [D.f32, D.f64, D.bf16])
@pytest.mark.parametrize("m,n", [(1, 37), (1, 1), (29, 1)])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_blas_single_row_or_column_runs_gemv_with_any_transpose(dt, m, n, ta, tb, batch):
    """m == 1 / n == 1 go to gemv on the BLAS path: every transpose flag and leading dim."""
    rng = np.random.default_rng(m * 100 + n)
    k = 45
    sa, sb = batch + (m, k), batch + (k, n)
    a, la, av = operand(rng, dt, sa, transposed(sa) if ta else None, offset=2)
    b, lb, bv = operand(rng, dt, sb, transposed(sb) if tb else None, offset=1)
    out = np.zeros(batch + (m, n), dt.numpy)
    assert matmul(a, la, b, lb, out, dt, "blas") == "blas"
    check(out, reference(av, bv, dt), dt)


def test_auto_picks_the_backend_measured_faster_and_clear_caches_forgets_it(monkeypatch):
    from lazycandle import clear_caches
    from lazycandle.runtime import matmul_auto
    rng = np.random.default_rng(11)
    timings = {"blas": 2.0, "tiled": 1.0}
    calls = []

    def fake_measure(g, threads, make_plans):
        calls.append((g.m, g.n, g.k))
        assert set(make_plans(g)) == {"blas", "tiled"}
        return dict(timings)

    monkeypatch.setattr(matmul_auto, "measure", fake_measure)
    monkeypatch.setenv("LAZYCANDLE_CACHE_DIR", "off")      # the choices are made in memory only
    clear_caches()
    # m above matmul_skinny.MEASURED_M: only BLAS and tiled are candidates
    out, used = mm_case(rng, D.f32, "auto", (140, 50), (50, 60))
    assert used == "tiled" and len(calls) == 1
    _, used = mm_case(rng, D.f32, "auto", (141, 52), (52, 63))      # same bucket: no new measurement
    assert used == "tiled" and len(calls) == 1
    timings.update(blas=0.5)
    clear_caches()
    _, used = mm_case(rng, D.f32, "auto", (141, 52), (52, 63))
    assert used == "blas" and len(calls) == 2
    clear_caches()


def test_auto_choices_are_kept_on_disk_for_a_new_process(monkeypatch, tmp_path):
    """A measured choice is stored with the kernels: after the in-memory caches are emptied (as
    in a new process) it is read back, not measured again; a damaged entry is measured anew."""
    from lazycandle import clear_caches
    from lazycandle.runtime import matmul_auto
    rng = np.random.default_rng(12)
    calls = []

    def fake_measure(g, threads, make_plans):
        calls.append((g.m, g.n, g.k))
        return {"blas": 2.0, "tiled": 1.0}

    monkeypatch.setattr(matmul_auto, "measure", fake_measure)
    monkeypatch.setenv("LAZYCANDLE_CACHE_DIR", str(tmp_path))
    clear_caches()
    assert mm_case(rng, D.f32, "auto", (140, 50), (50, 60))[1] == "tiled" and len(calls) == 1
    clear_caches()
    assert mm_case(rng, D.f32, "auto", (141, 52), (52, 63))[1] == "tiled" and len(calls) == 1
    for entry in tmp_path.glob("*/*.o"):
        entry.write_bytes(entry.read_bytes()[:-1] + b"x")          # every entry damaged
    clear_caches()
    with warnings.catch_warnings():            # the drop warns once per process
        warnings.simplefilter("ignore")
        assert mm_case(rng, D.f32, "auto", (141, 52), (52, 63))[1] == "tiled"
    assert len(calls) == 2
    clear_caches()


@pytest.mark.parametrize("isa", [True, False], ids=["avx512", "other"])
def test_auto_rule_runs_big_f32_gemms_tiled_unmeasured(monkeypatch, isa):
    """On the rule's ISA (forced on and off) one f32 GEMM with m >= RULE_M, n, k >= RULE_NK runs the
    tiled GEMM without a measurement; elsewhere, with m below RULE_M or in f64, it is measured."""
    from lazycandle import clear_caches
    from lazycandle.runtime import matmul_auto
    calls = []

    def fake_measure(g, threads, make_plans):
        calls.append((g.m, g.n, g.k))
        return {"blas": 1.0, "tiled": 2.0}

    monkeypatch.setattr(matmul_auto, "measure", fake_measure)
    monkeypatch.setattr(matmul_auto, "_rule_isa", lambda: isa)
    monkeypatch.setenv("LAZYCANDLE_CACHE_DIR", "off")
    old = config.get_num_threads()
    rng = np.random.default_rng(13)
    try:
        config.set_num_threads(2)
        clear_caches()
        _, used = mm_case(rng, D.f32, "auto", (1024, 384), (384, 400), exact=False)
        assert (used, len(calls)) == (("tiled", 0) if isa else ("blas", 1))
        _, used = mm_case(rng, D.f32, "auto", (1023, 384), (384, 400), exact=False)
        assert used == "blas" and len(calls) == (1 if isa else 2)
        _, used = mm_case(rng, D.f64, "auto", (1024, 384), (384, 400), exact=False)
        assert used == "blas" and len(calls) == (2 if isa else 3)
    finally:
        config.set_num_threads(old)
        clear_caches()


def test_a_tiled_decision_does_not_load_blas(tmp_path):
    """A matmul whose bucket is decided for the tiled GEMM (here by the rule, forced on) runs
    without loading the BLAS library (~40 ms of a new process); a measured bucket loads it."""
    import subprocess
    import sys
    code = """
import numpy as np, lazycandle as lc
from lazycandle.runtime import blas, matmul_auto
matmul_auto._rule_isa = lambda: True
lc.set_num_threads(2)
a, b = np.ones((1024, 384), np.float32), np.ones((384, 400), np.float32)
assert ((lc.tensor(a) @ lc.tensor(b)).numpy() == 384).all()
print("loaded" in blas._state)
c = np.ones((64, 64), np.float32)
assert ((lc.tensor(c) @ lc.tensor(c)).numpy() == 64).all()
print("loaded" in blas._state)
"""
    env = dict(os.environ, LAZYCANDLE_CACHE_DIR=str(tmp_path), LAZYCANDLE_PROGRESS="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"]


def test_auto_calibration_times_a_proxy_for_big_problems():
    from lazycandle.runtime import matmul_auto
    g = MM.geometry(Layout.contiguous((4096, 3000)), Layout.contiguous((3000, 5000)), D.f32)
    p = matmul_auto._proxy(g)
    assert (p.m, p.n, p.k) == (1024, 1024, 1024) and p.rsa == 3000 and p.rsb == 5000
    small = MM.geometry(Layout.contiguous((64, 64)), Layout.contiguous((64, 64)), D.f32)
    assert matmul_auto._proxy(small) is small


def test_auto_calibration_goes_by_the_median_not_one_lucky_call():
    """A kernel that is fast once and slow otherwise loses to a steady one (on a busy host the
    minimum rewards the widest spread)."""
    import time
    from lazycandle.runtime import matmul_auto

    class Sleeper:
        def __init__(self, delays):
            self.delays, self.calls = delays, 0

        def run(self, *addrs):
            time.sleep(self.delays(self.calls))
            self.calls += 1

    plans = {"blas": Sleeper(lambda i: 0.0 if i == 1 else 0.02), "tiled": Sleeper(lambda i: 0.001)}
    g = MM.geometry(Layout.contiguous((8, 8)), Layout.contiguous((8, 8)), D.f32)
    best = matmul_auto.measure(g, 1, lambda p: plans)
    assert best["tiled"] < best["blas"] and matmul_auto.pick(best) == "tiled"


def test_blas_at_one_thread_is_one_gemm_call(monkeypatch):
    """At 1 thread a large GEMM is one sgemm call (a cut would pack an operand once per piece);
    with more threads it is cut over the pool, and the bits do not change."""
    calls = []
    real = matmul_blas.BlasPlan.run
    monkeypatch.setattr(matmul_blas.BlasPlan, "run",
                        lambda self, *a: (calls.extend(j[2:4] for j in self.jobs), real(self, *a)))
    rng = np.random.default_rng(21)
    a = operand(rng, D.f32, (300, 257), exact=False)
    b = operand(rng, D.f32, (257, 190), exact=False)
    old = config.get_num_threads()
    got = {}
    try:
        for t in (1, 2):
            monkeypatch.setattr(MM, "_plans", {})
            config.set_num_threads(t)
            calls.clear()
            got[t] = run(a, b, D.f32, "blas", (300, 190))[0]
            got[t, "calls"] = list(calls)
    finally:
        config.set_num_threads(old)
    assert got[1, "calls"] == [(300, 190)]
    if matmul_blas.BLAS_PARTS > 1:
        assert len(got[2, "calls"]) == matmul_blas.BLAS_PARTS
    # the pieces give one call's bits with OpenBLAS's SkylakeX kernels, not always with Haswell's
    np.testing.assert_allclose(got[1], got[2], rtol=1e-5, atol=1e-5)


def test_auto_picks_the_lower_median_even_on_a_close_call():
    """No backend is preferred: a close call on a big GEMM goes to the faster median too."""
    from lazycandle.runtime import matmul_auto
    assert matmul_auto.pick({"blas": 1.05, "tiled": 1.0}) == "tiled"
    assert matmul_auto.pick({"blas": 0.97, "tiled": 1.0}) == "blas"
    assert matmul_auto.pick({"blas": 1.5, "tiled": 1.0}) == "tiled"
