"""conv1d / conv2d (im2col kernel + matmul) against a float64 NumPy reference: padding, stride,
dilation, groups, every float dtype, strided inputs and kernels, both matmul backends, zero-size
batches and the call-time errors."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from conftest import data, ids as dt_ids, make_input, rng_for


def ref_conv2d(x, k, padding=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1):
    """Cross-correlation in float64 (candle / PyTorch conv2d semantics)."""
    x = np.asarray(x).astype(np.float64)
    k = np.asarray(k).astype(np.float64)
    (ph, pw), (sh, sw), (dh, dw) = padding, stride, dilation
    b, c, h, w = x.shape
    co, cpg, kh, kw = k.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((b, co, oh, ow))
    cog = co // groups
    for g in range(groups):
        xs = xp[:, g * cpg:(g + 1) * cpg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
                out[:, g * cog:(g + 1) * cog] += np.einsum("bchw,oc->bohw", patch, k[g * cog:(g + 1) * cog, :, i, j])
    return out


def ref_conv1d(x, k, padding=0, stride=1, dilation=1, groups=1):
    return ref_conv2d(np.asarray(x)[:, :, None, :], np.asarray(k)[:, :, None, :], (0, padding), (1, stride),
                      (1, dilation), groups)[:, :, 0, :]


RTOL = {lc.f64: 1e-12, lc.f32: 1e-5, lc.f16: 2e-3, lc.bf16: 1.6e-2, lc.f8e4m3: 1.3e-1}


def check(got, ref, dt, what=""):
    got = np.asarray(got)
    assert got.dtype == dt.numpy, f"{what}: dtype {got.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    if ref.size == 0:
        return
    rtol = RTOL[dt]
    # relative to the result's scale: sums of products cancel, so near-zero outputs get the
    # absolute error of the terms (SPEC: matmul rtol relative to the f64 reference)
    scale = max(np.abs(ref).max(), 1.0)
    err = np.abs(got.astype(np.float64) - ref)
    bad = err > rtol * np.maximum(np.abs(ref), 0.0) + rtol * scale
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} differ, max err {err.max()} (scale {scale})"


CONV2D_CASES = [
    # (x shape, kernel shape, padding, stride, dilation, groups)
    ((2, 3, 9, 8), (4, 3, 3, 3), 0, 1, 1, 1),
    ((2, 3, 9, 8), (4, 3, 3, 3), 1, 1, 1, 1),
    ((1, 4, 11, 7), (6, 2, 3, 2), 2, 2, 1, 2),
    ((2, 4, 10, 9), (4, 1, 3, 3), 1, 1, 2, 4),            # depthwise, dilated
    ((1, 2, 13, 12), (3, 2, 5, 4), (2, 1), (3, 2), (2, 1), 1),
    ((3, 5, 6, 6), (7, 5, 1, 1), 0, 1, 1, 1),             # 1x1: no im2col, a view
    ((1, 5, 7, 8), (2, 5, 1, 1), 1, 2, 1, 1),             # 1x1 with padding and stride: im2col
    ((1, 1, 5, 5), (1, 1, 5, 5), 0, 1, 1, 1),             # one output pixel
    ((1, 2, 3, 4), (2, 2, 3, 3), 3, 4, 1, 1),             # padding bigger than the kernel reach
]


@pytest.mark.parametrize("case", CONV2D_CASES, ids=[str(i) for i in range(len(CONV2D_CASES))])
def test_conv2d_params(case):
    xs, ks, p, s, d, g = case
    rng = rng_for("conv2d", case)
    x, k = data(lc.f32, xs, rng), data(lc.f32, ks, rng)
    got = lc.tensor(x).conv2d(lc.tensor(k), padding=p, stride=s, dilation=d, groups=g).numpy()
    pair = lambda v: v if isinstance(v, tuple) else (v, v)
    check(got, ref_conv2d(x, k, pair(p), pair(s), pair(d), g), lc.f32, f"conv2d {case}")


@pytest.mark.parametrize("dt", [lc.f64, lc.f16, lc.bf16, lc.f8e4m3], ids=dt_ids([lc.f64, lc.f16, lc.bf16, lc.f8e4m3]))
def test_conv_dtypes(dt):
    rng = rng_for("conv-dt", dt.name)
    x, k = data(dt, (2, 4, 7, 6), rng), data(dt, (6, 2, 3, 3), rng)
    got = lc.tensor(x).conv2d(lc.tensor(k), padding=1, stride=2, groups=2).numpy()
    check(got, ref_conv2d(x, k, (1, 1), (2, 2), (1, 1), 2), dt, f"conv2d {dt.name}")
    x1, k1 = data(dt, (2, 3, 11), rng), data(dt, (5, 3, 4), rng)
    got = lc.tensor(x1).conv1d(lc.tensor(k1), padding=2, dilation=2).numpy()
    check(got, ref_conv1d(x1, k1, 2, 1, 2), dt, f"conv1d {dt.name}")


@pytest.mark.parametrize("layout", ["transposed", "narrowed", "broadcast", "permuted"])
def test_conv2d_strided_inputs(layout):
    rng = rng_for("conv-layout", layout)
    x_t, x = make_input(layout, (2, 3, 8, 7), lc.f32, rng)
    k_t, k = make_input("transposed" if layout != "transposed" else "narrowed", (4, 3, 3, 2), lc.f32, rng)
    got = x_t.conv2d(k_t, padding=1, stride=(2, 1)).numpy()
    check(got, ref_conv2d(x, k, (1, 1), (2, 1)), lc.f32, f"conv2d {layout}")
    got1 = x_t[:, :, 0, :].conv1d(k_t[:, :, 0, :], padding=1, stride=2).numpy()
    check(got1, ref_conv1d(x[:, :, 0, :], k[:, :, 0, :], 1, 2), lc.f32, f"conv1d {layout}")


CONV1D_CASES = [((2, 3, 10), (4, 3, 3), 0, 1, 1, 1), ((1, 4, 17), (6, 2, 5), 2, 3, 1, 2),
                ((3, 6, 9), (6, 1, 3), 1, 1, 3, 6), ((2, 2, 8), (3, 2, 1), 0, 1, 1, 1), ((1, 1, 4), (2, 1, 4), 3, 2, 1, 1)]


@pytest.mark.parametrize("case", CONV1D_CASES, ids=[str(i) for i in range(len(CONV1D_CASES))])
def test_conv1d_params(case):
    xs, ks, p, s, d, g = case
    rng = rng_for("conv1d", case)
    x, k = data(lc.f32, xs, rng), data(lc.f32, ks, rng)
    got = lc.tensor(x).conv1d(lc.tensor(k), padding=p, stride=s, dilation=d, groups=g).numpy()
    check(got, ref_conv1d(x, k, p, s, d, g), lc.f32, f"conv1d {case}")


@pytest.mark.parametrize("backend", ["blas", "tiled"])
def test_conv_backends_and_threads(backend):
    rng = rng_for("conv-backend", backend)
    x, k = data(lc.f32, (2, 8, 40, 36), rng), data(lc.f32, (16, 4, 3, 3), rng)   # im2col above the threading cutoff
    ref = ref_conv2d(x, k, (1, 1), (1, 1), (1, 1), 2)
    old = lc.get_matmul_backend()
    try:
        lc.set_matmul_backend(backend)
        for n in (1, 2):
            with lc.num_threads(n):
                got = lc.tensor(x).conv2d(lc.tensor(k), padding=1, groups=2).numpy()
            check(got, ref, lc.f32, f"{backend} {n} threads")
    finally:
        lc.set_matmul_backend(old)


def test_conv_lazy_operands_and_zero_batch():
    rng = rng_for("conv-lazy")
    x, k = data(lc.f32, (1, 2, 6, 6), rng), data(lc.f32, (3, 2, 3, 3), rng)
    y = (lc.tensor(x) * 2.0).conv2d(lc.tensor(k) + 1.0, padding=1).relu()
    ref = np.maximum(ref_conv2d(x * 2.0, k + 1.0, (1, 1)), 0)
    check(y.numpy(), ref, lc.f32, "lazy operands")
    z = lc.tensor(np.zeros((0, 2, 6, 6), np.float32)).conv2d(lc.tensor(k), padding=1).numpy()
    assert z.shape == (0, 3, 6, 6)
    ones = lc.ones((1, 2, 4, 4)).conv2d(lc.ones((1, 2, 3, 3)), padding=1).numpy()     # constant operands
    check(ones, ref_conv2d(np.ones((1, 2, 4, 4)), np.ones((1, 2, 3, 3)), (1, 1)), lc.f32, "constants")


def test_conv_errors():
    x = lc.tensor(np.zeros((1, 4, 5, 5), np.float32))
    k = lc.tensor(np.zeros((2, 4, 3, 3), np.float32))
    with pytest.raises(lc.DTypeMismatchBinaryOp, match="conv2d"):
        x.conv2d(lc.tensor(np.zeros((2, 4, 3, 3), np.float64)))
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="conv2d"):
        x.conv2d(lc.tensor(np.zeros((2, 3, 3, 3), np.float32)))
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="groups"):
        x.conv2d(lc.tensor(np.zeros((3, 2, 3, 3), np.float32)), groups=2)     # c_out not divisible
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="too small"):
        x.conv2d(lc.tensor(np.zeros((2, 4, 7, 3), np.float32)))
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="conv1d"):
        x.conv1d(k)
    with pytest.raises(ValueError):
        x.conv2d(k, stride=0)
    with pytest.raises(ValueError):
        x.conv2d(k, padding=-1)
    f4 = lc.tensor(np.zeros((1, 4, 5, 5), np.float32).astype(lc.f4.numpy))
    with pytest.raises(lc.UnsupportedDTypeForOp, match="storage-only"):
        f4.conv2d(lc.tensor(np.zeros((2, 4, 3, 3), np.float32).astype(lc.f4.numpy)))


@pytest.mark.parametrize("dt", [lc.i64, lc.u32], ids=dt_ids([lc.i64, lc.u32]))
def test_conv_integer_dtypes(dt):
    """Integer convolutions go through the integer (wrapping) matmul: exact."""
    rng = rng_for("conv-int", dt.name)
    x = rng.integers(0, 9, (2, 4, 6, 5)).astype(dt.numpy)
    k = rng.integers(0, 5, (6, 2, 3, 2)).astype(dt.numpy)
    got = lc.tensor(x).conv2d(lc.tensor(k), padding=1, stride=(1, 2), groups=2).numpy()
    ref = ref_conv2d(x, k, (1, 1), (1, 2), (1, 1), 2)
    assert got.dtype == dt.numpy
    np.testing.assert_array_equal(got, ref.astype(dt.numpy))


def test_conv_dump_stages():
    x = lc.tensor(np.ones((1, 2, 5, 5), np.float32))
    y = x.conv2d(lc.tensor(np.ones((3, 2, 3, 3), np.float32)), padding=1)
    assert "im2col" in lc.dump(y, stage="schedule")
    assert '@"im2col"' in lc.dump(y, stage="llvm")
    assert "ret" in lc.dump(y, stage="asm")
