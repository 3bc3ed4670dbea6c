"""Row normalisations (softmax, log_softmax, layer_norm, rms_norm, logsumexp over the last dim):
values against NumPy across dtypes, layouts, odd row lengths and -inf/NaN rows; low precision
bit for bit equal to op at a time (fusion never changes a low-precision value); and the kernel
counts issue 10 asks for (ONE row kernel each)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.compiler import schedule_capture
from lazycandle.ir.graph import capture
from conftest import assert_same, data, ids, rng_for

EPS = 1e-5
ROW_LENGTHS = [1, 7, 9, 17, 1000]       # 1, W-1 / W+1 at W = 8, 16, a long row
HIGH = [lc.f32, lc.f64]
LOW = [lc.f16, lc.bf16]


def _lse(x):
    m = np.max(x, -1, keepdims=True)
    return m + np.log(np.sum(np.exp(x - m), -1, keepdims=True))


def _softmax(x):
    e = np.exp(x - np.max(x, -1, keepdims=True))
    return e / np.sum(e, -1, keepdims=True)


def _layer_norm(x, g, b):
    xc = x - x.mean(-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + EPS) * g + b


def _rms_norm(x, a):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * a


OPS = {
    "softmax": (lambda x, g, b: lc.nn.softmax(x, -1), lambda x, g, b: _softmax(x)),
    "log_softmax": (lambda x, g, b: lc.nn.log_softmax(x, -1), lambda x, g, b: x - _lse(x)),
    "layer_norm": (lambda x, g, b: lc.nn.layer_norm(x, g, b, EPS), _layer_norm),
    "rms_norm": (lambda x, g, b: lc.nn.rms_norm(x, g, EPS), lambda x, g, b: _rms_norm(x, g)),
    "logsumexp": (lambda x, g, b: x.logsumexp(-1, keepdim=True), lambda x, g, b: _lse(x)),
}


def _inputs(dt, rows, n, seed):
    rng = rng_for("rows", dt.name, rows, n, seed)
    return data(dt, (rows, n), rng), data(dt, (n,), rng, "pos"), data(dt, (n,), rng)


@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("dt", HIGH, ids=ids(HIGH))
@pytest.mark.parametrize("op", sorted(OPS))
def test_row_op_matches_numpy(op, dt, n):
    x, g, b = _inputs(dt, 5, n, 0)
    got = OPS[op][0](lc.tensor(x), lc.tensor(g), lc.tensor(b)).numpy()
    want = OPS[op][1](x.astype(np.float64), g.astype(np.float64), b.astype(np.float64))
    tol = 2e-5 if dt is lc.f32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)


def _materialised(op, x, g, b):
    """The op with every intermediate realised: the op-at-a-time reference (each op its own
    kernel) that a fused low-precision result must equal bit for bit."""
    def r(t):
        return lc.tensor(t.numpy())
    if op == "softmax":
        e = r(r(x.broadcast_sub(r(x.max_keepdim(-1)))).exp())
        return e.broadcast_div(r(e.sum_keepdim(-1)))
    if op == "layer_norm":
        xc = r(x.broadcast_sub(r(x.mean_keepdim(-1))))
        rs = r(r(r(r(xc.sqr()).mean_keepdim(-1)) + EPS).sqrt())
        return r(r(xc.broadcast_div(rs)).broadcast_mul(g)).broadcast_add(b)
    xs = r(r(x.sqr()).mean_keepdim(-1))
    rs = r(r(xs + EPS).sqrt())
    return r(x.broadcast_div(rs)).broadcast_mul(g)


@pytest.mark.parametrize("n", [9, 1000])
@pytest.mark.parametrize("dt", LOW, ids=ids(LOW))
@pytest.mark.parametrize("op", ["softmax", "layer_norm", "rms_norm"])
def test_low_precision_row_op_is_bit_exact_with_op_at_a_time(op, dt, n):
    x, g, b = (lc.tensor(a) for a in _inputs(dt, 4, n, 1))
    fused = OPS[op][0](x, g, b).numpy()
    assert_same(fused, _materialised(op, x, g, b).numpy(), f"{op} {dt.name}", bits=True)


@pytest.mark.parametrize("layout", ["transposed", "narrowed"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_row_op_on_a_strided_input(op, layout):
    x, g, b = _inputs(lc.f32, 40, 33, 2)
    if layout == "transposed":
        base = np.ascontiguousarray(x[:33].T)                # (33, 33): rows strided
        t, ref = lc.tensor(base).t(), base.T
        g, b = g[:33], b[:33]
    else:
        t, ref = lc.tensor(x).narrow(1, 3, 29), x[:, 3:32]
        g, b = g[3:32], b[3:32]
    got = OPS[op][0](t, lc.tensor(g), lc.tensor(b)).numpy()
    want = OPS[op][1](ref.astype(np.float64), g.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)


def test_softmax_of_an_all_minus_inf_row_is_nan_like_numpy():
    x = np.array([[-np.inf] * 5, [0.0, 1.0, 2.0, 3.0, 4.0]], np.float32)
    got = lc.nn.softmax(lc.tensor(x), -1).numpy()
    with np.errstate(invalid="ignore"):
        want = _softmax(x.astype(np.float64))
    assert np.isnan(got[0]).all() and np.isnan(want[0]).all()
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_softmax_gives_zeros_where_a_row_is_masked_with_minus_inf():
    x = np.random.default_rng(3).normal(size=(6, 19)).astype(np.float32)
    x[np.triu_indices(6, 1, 19)] = -np.inf                   # causal-style mask
    got = lc.nn.softmax(lc.tensor(x), -1).numpy()
    assert (got[np.triu_indices(6, 1, 19)] == 0).all()
    np.testing.assert_allclose(got, _softmax(x.astype(np.float64)), rtol=1e-6, atol=1e-7)


def test_softmax_row_with_a_nan_is_nan_and_others_are_untouched():
    x = np.random.default_rng(4).normal(size=(3, 17)).astype(np.float32)
    x[1, 5] = np.nan
    got = lc.nn.softmax(lc.tensor(x), -1).numpy()
    assert np.isnan(got[1]).all()
    np.testing.assert_allclose(got[[0, 2]], _softmax(x[[0, 2]].astype(np.float64)), rtol=1e-6)


def test_row_op_on_zero_rows_is_empty():
    x = np.zeros((0, 8), np.float32)
    for op in sorted(OPS):
        got = OPS[op][0](lc.tensor(x), lc.tensor(np.ones(8, np.float32)), lc.tensor(np.zeros(8, np.float32)))
        assert got.numpy().shape[0] == 0, op


def _kernels(t):
    kernels, _, notes = schedule_capture(capture([t._node]))
    return kernels


@pytest.mark.parametrize("op", sorted(OPS))
def test_row_op_is_one_kernel(op):
    x, g, b = (lc.tensor(a) for a in _inputs(lc.f32, 64, 128, 5))
    assert len(_kernels(OPS[op][0](x, g, b))) == 1


# ---- the row kernel (issue 10 item 1) ------------------------------------------------------
# 1, W-1, W, W+1 and 4W+1 (the 4-accumulator loop) for every vector width W of 4, 8 or 16 lanes,
# an empty row and a long one with a tail
ODD_LENGTHS = [0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 65, 1031]
ALL = [lc.f32, lc.f64, lc.f16, lc.bf16]
TOL = {"f32": 2e-5, "f64": 1e-12, "f16": 1e-2, "bf16": 6e-2}


def _expect(op, x, g, b):
    """NumPy's answer in f64; an empty row: empty outputs, logsumexp -inf."""
    x64, g64, b64 = (a.astype(np.float64) for a in (x, g, b))
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1] + (1,), -np.inf) if op == "logsumexp" else np.zeros(x.shape)
    return OPS[op][1](x64, g64, b64)


@pytest.mark.parametrize("n", ODD_LENGTHS)
@pytest.mark.parametrize("dt", ALL, ids=ids(ALL))
@pytest.mark.parametrize("op", sorted(OPS))
def test_row_kernel_matches_numpy_across_dtypes_and_row_lengths(op, dt, n):
    x, g, b = _inputs(dt, 3, n, 7)
    got = OPS[op][0](lc.tensor(x), lc.tensor(g), lc.tensor(b)).numpy()
    want = _expect(op, x, g, b)
    assert got.shape == want.shape
    tol = TOL[dt.name]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("layout", ["contiguous", "outer_permuted", "row_strided"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_row_kernel_on_rank3_inputs(op, layout):
    rng = rng_for("rank3", op, layout)
    n = 37
    g, b = data(lc.f32, (n,), rng, "pos"), data(lc.f32, (n,), rng)
    if layout == "contiguous":
        ref = data(lc.f32, (3, 4, n), rng)
        t = lc.tensor(ref)
    elif layout == "outer_permuted":               # outer dims do not merge
        base = data(lc.f32, (4, 3, n), rng)
        t, ref = lc.tensor(base).transpose(0, 1), base.transpose(1, 0, 2)
    else:                                          # the row is strided: (n, 3, 4) -> (3, 4, n)
        base = data(lc.f32, (n, 3, 4), rng)
        t, ref = lc.tensor(base).permute(1, 2, 0), base.transpose(1, 2, 0)
    got = OPS[op][0](t, lc.tensor(g), lc.tensor(b)).numpy()
    want = OPS[op][1](ref.astype(np.float64), g.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)
    assert len(_kernels(OPS[op][0](t, lc.tensor(g), lc.tensor(b)))) == 1


@pytest.mark.parametrize("keepdim", [False, True])
def test_logsumexp_keepdim_shapes_of_a_rank3_input(keepdim):
    x = rng_for("lse_keep", keepdim).normal(size=(2, 5, 19)).astype(np.float32)
    got = lc.tensor(x).logsumexp(-1, keepdim=keepdim).numpy()
    want = _lse(x.astype(np.float64))
    want = want if keepdim else want[..., 0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _specials_rows(n=21):
    """Rows: one +inf, one NaN, some -inf, all -inf, a -inf next to +inf, plain."""
    x = np.random.default_rng(11).normal(size=(6, n)).astype(np.float32)
    x[0, 3] = np.inf
    x[1, 7] = np.nan
    x[2, ::3] = -np.inf
    x[3] = -np.inf
    x[4, 1], x[4, 2] = -np.inf, np.inf
    return x


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm", "rms_norm"])
def test_row_kernel_propagates_inf_and_nan_like_numpy(op):
    x = _specials_rows()
    g, b = np.full(x.shape[1], 1.5, np.float32), np.full(x.shape[1], 0.25, np.float32)
    got = OPS[op][0](lc.tensor(x), lc.tensor(g), lc.tensor(b)).numpy()
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        want = OPS[op][1](x.astype(np.float64), g.astype(np.float64), b.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    if op == "softmax":
        assert (got[2, ::3] == 0).all()            # masked next to finite values: exactly 0


def test_logsumexp_row_kernel_keeps_its_inf_and_nan_rules():
    """+inf gives inf, NaN gives NaN, an all -inf row gives -inf, -inf entries are skipped."""
    x = _specials_rows()
    got = lc.tensor(x).logsumexp(-1).numpy()
    assert got[0] == np.inf and np.isnan(got[1]) and got[3] == -np.inf and got[4] == np.inf
    finite = x[2][np.isfinite(x[2])].astype(np.float64)
    np.testing.assert_allclose(got[2], np.log(np.exp(finite).sum()), rtol=1e-6)
    np.testing.assert_allclose(got[5], _lse(x[5:].astype(np.float64))[0, 0], rtol=1e-6)


def _attention_scores(t, d, seed):
    rng = rng_for("attn", t, d, seed)
    q, k = rng.normal(size=(t, d)).astype(np.float32), rng.normal(size=(t, d)).astype(np.float32)
    return q, k, (q.astype(np.float64) @ k.T.astype(np.float64)) / np.sqrt(d)


@pytest.mark.parametrize("mask_by", ["where", "add"])
def test_attention_scale_mask_softmax_is_one_row_kernel(mask_by):
    t, d = 45, 16
    q, k, s64 = _attention_scores(t, d, 0)
    causal = np.triu(np.ones((t, t), bool), 1)
    s = lc.tensor(q).matmul(lc.tensor(k).t()) * (1 / np.sqrt(d))
    if mask_by == "where":
        s = s.masked_fill(lc.tensor(causal.astype(np.uint8)), float("-inf"))
    else:
        s = s + lc.tensor(np.where(causal, -np.inf, 0).astype(np.float32))
    p = lc.nn.softmax(s, -1)
    assert [k.kind for k in _kernels(p)] == ["matmul", "row"]
    got = p.numpy()
    assert (got[causal] == 0).all()
    s64[causal] = -np.inf
    np.testing.assert_allclose(got, _softmax(s64), rtol=1e-5, atol=1e-7)


def test_causal_sdpa_graph_path_runs_its_softmax_as_one_row_kernel():
    """Rank 5 is outside the fused flash-attention kernel, so sdpa runs as its graph."""
    t, d = 33, 8
    rng = rng_for("sdpa_rows")
    q, k, v = (rng.normal(size=(2, 1, 1, t, d)).astype(np.float32) for _ in range(3))
    out = lc.nn.scaled_dot_product_attention(lc.tensor(q), lc.tensor(k), lc.tensor(v), is_causal=True)
    kinds = [k.kind for k in _kernels(out)]
    assert kinds.count("row") == 1 and "reduce" not in kinds
    s = np.einsum("...ld,...sd->...ls", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(d)
    s[..., np.triu(np.ones((t, t), bool), 1)] = -np.inf
    np.testing.assert_allclose(out.numpy(), _softmax(s) @ v.astype(np.float64), rtol=1e-5, atol=1e-6)


def test_row_kernel_writes_full_rows_and_per_row_values_together():
    x = rng_for("two_outputs").normal(size=(6, 40)).astype(np.float32)
    t = lc.tensor(x)
    m, p = t.max_keepdim(-1), lc.nn.softmax(t, -1)
    kernels, _, _ = schedule_capture(capture([m._node, p._node]))
    assert len(kernels) == 1 and len(kernels[0].outputs) == 2
    lc.realize(m, p)
    np.testing.assert_array_equal(m.numpy(), x.max(-1, keepdims=True))
    np.testing.assert_allclose(p.numpy(), _softmax(x.astype(np.float64)), rtol=1e-6, atol=1e-8)


def test_row_fusion_refuses_a_merge_that_would_close_a_cycle():
    """x / s + s @ w: the matmul reads the row sum and feeds the consumer, so the consumer
    cannot join the sum's kernel; the schedule says why and the value is right.  The product
    is also a result, so the consumer stays out of the matmul's epilogue."""
    rng = rng_for("row_cycle")
    x, w = rng.normal(size=(8, 24)).astype(np.float32), rng.normal(size=(1, 24)).astype(np.float32)
    s = lc.tensor(x).sum_keepdim(-1)
    product = s.matmul(lc.tensor(w))
    out = lc.tensor(x).broadcast_div(s) + product
    kernels, _, notes = schedule_capture(capture([out._node, product._node]))
    assert "row" not in [k.kind for k in kernels]
    assert any("not fused into the row kernel" in n and "feeds it" in n for n in notes)
    s64 = x.astype(np.float64).sum(-1, keepdims=True)
    np.testing.assert_allclose(out.numpy(), x / s64 + s64 @ w, rtol=1e-5, atol=1e-5)


def test_schedule_dump_shows_the_row_kernel_and_its_passes():
    from lazycandle.compiler import get_plan
    from lazycandle.ir.printer import render
    x = lc.tensor(rng_for("dump_rows").normal(size=(16, 64)).astype(np.float32))
    text = render("schedule", "text", get_plan(capture([lc.nn.softmax(x, -1)._node])))
    assert "kernel 0: row" in text and "pass 1: max; pass 2: sum; write the row" in text
    assert "kernel 1" not in text


def test_row_kernel_compiles_once_for_every_row_length(compiled_counter):
    rng = rng_for("row_sizes")
    for n in (100, 200, 300, 1000):
        x = rng.normal(size=(8, n)).astype(np.float32)
        np.testing.assert_allclose(lc.nn.layer_norm(lc.tensor(x), None, None).numpy(),
                                   _layer_norm(x.astype(np.float64), 1.0, 0.0), rtol=1e-5, atol=1e-5)
        if n == 100:
            after_first = compiled_counter()
    assert compiled_counter() == after_first


def test_row_kernel_with_several_full_outputs_writes_each_one():
    """A costly per-element value both passes compute (kept in an output buffer between them)
    that is also an output of its own, next to other outputs (found by the mixed-graph fuzz)."""
    rng = rng_for("stash_outputs")
    x0, x1 = rng.normal(size=(3, 20)).astype(np.float32), rng.normal(size=(3, 20)).astype(np.float32)
    a = lc.tensor(x0).abs()
    h = (a - lc.tensor(x1).exp()) * 0.5
    c = (h - h.mean_keepdim(1).broadcast_as(h.shape)) * 0.5
    kernels, _, _ = schedule_capture(capture([c._node, a._node, h._node]))
    assert [k.kind for k in kernels] == ["row"]
    lc.realize(c, a, h)
    h64 = (np.abs(x0.astype(np.float64)) - np.exp(x1.astype(np.float64))) * 0.5
    np.testing.assert_allclose(a.numpy(), np.abs(x0))
    np.testing.assert_allclose(h.numpy(), h64, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(c.numpy(), (h64 - h64.mean(1, keepdims=True)) * 0.5, rtol=1e-6, atol=1e-6)


def test_row_kernel_prefetches_the_next_row_in_its_later_passes():
    """A row is often one 4 KiB page, where the hardware prefetcher stops: the passes after the
    first prefetch the next row so its first pass does not wait on DRAM (issue 10 softmax
    throughput).  The value of the last row, whose prefetch points past the input, is unchanged."""
    from lazycandle.compiler import get_plan
    from lazycandle.ir.printer import render
    x = rng_for("prefetch_rows").normal(size=(5, 3, 70)).astype(np.float32)
    y = lc.nn.softmax(lc.tensor(x).permute((1, 0, 2)), -1)
    text = render("llvm", "text", get_plan(capture([y._node])))
    assert text.count("call void @\"llvm.prefetch") >= 1
    np.testing.assert_allclose(y.numpy(), _softmax(x.transpose(1, 0, 2).astype(np.float64)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("reciprocal", [True, False], ids=["f64-reciprocal", "vector-divide"])
def test_row_division_by_a_row_value_is_exactly_the_f32_division(reciprocal, tmp_path, monkeypatch):
    """The write pass divides, or (on hosts where that is faster, row.RECIPROCAL_DIVIDE)
    multiplies by the divisor's f64 reciprocal: either way the f32 result is the correctly
    rounded quotient, bit for bit, also for zero, inf, NaN and subnormal divisors and inf/NaN
    dividends.  Both forms run here whatever the host picks (compiled in a cache of their own)."""
    from lazycandle.codegen import row
    monkeypatch.setattr(row, "RECIPROCAL_DIVIDE", reciprocal)
    monkeypatch.setenv("LAZYCANDLE_CACHE_DIR", str(tmp_path))
    lc.clear_caches()
    try:
        _check_row_division(reciprocal)
    finally:
        lc.clear_caches()


def _check_row_division(reciprocal):
    from lazycandle.compiler import get_plan
    from lazycandle.ir.printer import render
    rng = rng_for("row_recip")
    x = rng.normal(size=(9, 333)).astype(np.float32) * np.float32(1e3)
    x[0, :5] = [np.inf, -np.inf, np.nan, 0.0, 1e-40]
    d = np.float32([3.0, 0.0, -0.0, np.inf, np.nan, 1e-41, 3e38, 7.0, -1e-30]).reshape(9, 1)
    dcol = np.zeros_like(x)
    dcol[:, :1] = d
    y = lc.tensor(x) / lc.tensor(dcol).sum_keepdim(1).broadcast_as(x.shape)     # row value d (+0 for -0)
    kernels, _, _ = schedule_capture(capture([y._node]))
    assert [k.kind for k in kernels] == ["row"]
    vector_divide = re.search(r"fdiv [^%]*<\d+ x float>", render("llvm", "text", get_plan(capture([y._node]))))
    assert bool(vector_divide) is not reciprocal
    got = y.numpy()
    d = d + np.float32(0.0)
    with np.errstate(all="ignore"):
        want = x / d
    np.testing.assert_array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()


@pytest.mark.parametrize("n", [255, 256, 257, 511, 4097])
def test_row_f32_sums_in_blocks_keep_softmax_and_layer_norm_accurate(n):
    """An f32 row sum adds f32 partials per block of 256 elements into f64: every block, the
    block tail and the scalar tail count, and the result stays within f32 elementwise tolerance
    of the f64 reference."""
    x = rng_for(f"row_blocks_{n}").normal(size=(6, n)).astype(np.float32) * np.float32(3)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(lc.nn.softmax(lc.tensor(x), -1).numpy(), _softmax(x64), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(lc.nn.layer_norm(lc.tensor(x), None, None).numpy(),
                               _layer_norm(x64, 1.0, 0.0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lc.tensor(x).exp().sum(-1).numpy(), np.exp(x64).sum(-1), rtol=1e-6)


@pytest.mark.parametrize("n", [31, 32, 63, 64, 65, 127, 128, 129, 191, 320, 321])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm", "rms_norm"])
def test_row_f32_sums_keep_every_partial_chain_at_lengths_around_the_step(op, n):
    """A blocked f32 sum steps over 4 independent f32 partials of a vector each (64 lanes at 16
    lanes a vector, 32 at 8): lengths one short of, at and one past a step, and a step plus a
    W-wide and a scalar tail, all count every element once."""
    x, g, b = _inputs(lc.f32, 4, n, 11)
    got = OPS[op][0](lc.tensor(x), lc.tensor(g), lc.tensor(b)).numpy()
    want = OPS[op][1](x.astype(np.float64), g.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def _streamed_rows(n):
    """Rows of n f32 whose output is past the size from which stores are non-temporal."""
    from lazycandle.codegen.elementwise import streaming_min_bytes
    return streaming_min_bytes(row=True) // (4 * n) + 3


@pytest.mark.parametrize("layout", ["aligned", "unaligned_rows", "transposed"])
@pytest.mark.parametrize("op", ["log_softmax", "layer_norm", "rms_norm"])
def test_row_kernel_with_a_large_output_streams_it_and_keeps_its_values(op, layout):
    """An output larger than L2 is written with non-temporal stores (no read-for-ownership of
    lines the row kernel writes once); rows that do not start on a vector boundary (n = 1001)
    keep plain stores, and the values are NumPy's either way."""
    n = 1001 if layout == "unaligned_rows" else 1024
    rows = _streamed_rows(n)
    x, g, b = _inputs(lc.f32, rows, n, 3)
    t = lc.tensor(np.ascontiguousarray(x.T)).permute((1, 0)) if layout == "transposed" else lc.tensor(x)
    y = OPS[op][0](t, lc.tensor(g), lc.tensor(b))
    if layout == "aligned":
        from lazycandle.compiler import get_plan
        from lazycandle.ir.printer import render
        assert "!nontemporal" in render("llvm", "text", get_plan(capture([y._node])))
    want = OPS[op][1](x.astype(np.float64), g.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(y.numpy(), want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("long_rows", [False, True])
def test_softmax_with_a_large_output_stashes_exp_in_a_row_buffer_and_streams(long_rows):
    """softmax keeps exp(x - max) of a row that fits STASH_ROW in a stack row buffer (L1), so its
    output is written once, in the last pass, with non-temporal stores; a longer row stashes in
    the output itself and divides it in place with plain stores.  NumPy's values either way."""
    from lazycandle.codegen.row import STASH_ROW
    from lazycandle.compiler import get_plan
    from lazycandle.ir.printer import render
    n = STASH_ROW + 3 if long_rows else 1024
    x, g, b = _inputs(lc.f32, _streamed_rows(n), n, 5)
    y = lc.nn.softmax(lc.tensor(x), -1)
    assert "!nontemporal" in render("llvm", "text", get_plan(capture([y._node])))
    np.testing.assert_allclose(y.numpy(), _softmax(x.astype(np.float64)), rtol=2e-6, atol=1e-9)


def test_row_stash_that_is_an_output_itself_is_written_to_that_output():
    """When the stashed value (exp(x - max)) is also an output, it is stored in that output, not
    in the row buffer, and the quotient output is still written."""
    x = rng_for("stash_output").normal(size=(_streamed_rows(512), 512)).astype(np.float32)
    t = lc.tensor(x)
    e = t.broadcast_sub(t.max_keepdim(-1)).exp()
    y = e.broadcast_div(e.sum_keepdim(-1))
    got_e, got_y = lc.realize(e, y)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got_e.numpy(), np.exp(x64 - x64.max(-1, keepdims=True)), rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(got_y.numpy(), _softmax(x64), rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("lane", [0, 5, 15, 16, 31, 63, 64, 200])
def test_row_max_in_halving_steps_keeps_nan_and_minus_inf_rules(lane):
    """The row max combines its accumulators by halving the vector: a NaN in any lane still makes
    the softmax row NaN (other rows untouched), and a row max reached only in one lane is found."""
    x = rng_for("row_max_tree", lane).normal(size=(3, 201)).astype(np.float32)
    x[0, lane] = np.nan
    x[1, :] = -np.inf
    x[1, lane] = 2.0
    x[2, lane] = 50.0
    got = lc.nn.softmax(lc.tensor(x), -1).numpy()
    assert np.isnan(got[0]).all()
    want1 = np.zeros(201, np.float32)
    want1[lane] = 1.0
    np.testing.assert_array_equal(got[1], want1)
    np.testing.assert_allclose(got[2], _softmax(x[2:].astype(np.float64))[0], rtol=2e-6, atol=1e-30)
