"""conv_transpose1d / conv_transpose2d (GEMM + the col2im kernel) and upsample_bilinear2d against
float64 NumPy references written here (direct loops), candle's conv_tests.rs values (forward and
gradients), torch's documented Upsample values, every matmul dtype, strided inputs, both matmul
backends, zero-size tensors, the call-time errors, and the gradients against central differences."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from conftest import data, make_input, rng_for
from test_conv import check


def ref_conv_transpose2d(x, k, padding=(0, 0), out_padding=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1):
    """torch's conv_transpose2d in float64: every input pixel scatters kernel-weighted copies."""
    x = np.asarray(x).astype(np.float64)
    k = np.asarray(k).astype(np.float64)
    (ph, pw), (qh, qw), (sh, sw), (dh, dw) = padding, out_padding, stride, dilation
    b, ci, ih, iw = x.shape
    _, cog, kh, kw = k.shape
    full_h = (ih - 1) * sh + dh * (kh - 1) + 1 + qh
    full_w = (iw - 1) * sw + dw * (kw - 1) + 1 + qw
    full = np.zeros((b, cog * groups, full_h, full_w))
    cig = ci // groups
    for g in range(groups):
        for c in range(cig):
            for o in range(cog):
                for i in range(kh):
                    for j in range(kw):
                        full[:, g * cog + o, i * dh: i * dh + (ih - 1) * sh + 1: sh,
                             j * dw: j * dw + (iw - 1) * sw + 1: sw] += x[:, g * cig + c] * k[g * cig + c, o, i, j]
    return full[:, :, ph: full_h - ph, pw: full_w - pw]


def ref_conv_transpose1d(x, k, padding=0, out_padding=0, stride=1, dilation=1, groups=1):
    return ref_conv_transpose2d(np.asarray(x)[:, :, None, :], np.asarray(k)[:, :, None, :], (0, padding),
                                (0, out_padding), (1, stride), (1, dilation), groups)[:, :, 0, :]


def pair(v):
    return v if isinstance(v, tuple) else (v, v)


# ---- candle's conv_tests.rs -------------------------------------------------------------------
T1 = [0.4056, -0.8689, -0.0773, -1.5630, 1.2279, -0.9287, -1.7030, 0.1370, 0.1866, 0.4145,
      1.8025, -0.1536, 2.2013, -0.6836, 0.2477, 1.3127, -0.6957, 0.3278, -1.0124, 0.5599]
W1 = [-0.8404, -0.3490, 0.0130, 1.3123, 0.1763, -1.9249, 1.4270, 0.9421, 0.8670, -0.7181,
      -1.1111, 0.8869, -1.2429, 1.8357, 1.6052, -1.3844, 0.3951, -1.2036, 0.6686, 1.6261,
      -0.6451, -0.0840, -1.4247, 0.5512]


def test_candle_conv_transpose1d_values():
    t = lc.tensor(np.array(T1, np.float32).reshape(1, 4, 5))
    w = lc.tensor(np.array(W1, np.float32).reshape(2, 4, 3)).transpose(0, 1)
    for kernel in (w, w.contiguous()):
        res = t.conv_transpose1d(kernel)
        assert res.shape == (1, 2, 7)
        np.testing.assert_allclose(np.round(res.numpy().reshape(-1), 4), [
            0.0699, -1.2899, 8.3018, 5.5873, 2.4572, -2.6143, -0.0706, 1.8765, 4.8318, 1.1538,
            4.7076, -5.9745, -0.8276, 1.621], atol=1.5e-4)
        res = t.conv_transpose1d(kernel, 0, 0, 1, 1, 2)
        assert res.shape == (1, 4, 7)
        np.testing.assert_allclose(np.round(res.numpy()[0], 4), [
            [-1.5596, -1.8099, 2.0407, 4.8764, -0.1743, -0.735, -0.7819],
            [0.7816, 3.8152, -0.5926, 2.2515, -5.1844, -0.3157, 1.4721],
            [1.6295, 0.52, 6.2611, 0.7109, 2.6315, -1.8793, 0.7113],
            [1.0949, 1.0166, 1.7464, 2.4561, -0.79, -0.5119, 0.1488]], atol=1.5e-4)


def test_candle_conv_transpose2d_small_values():
    t = lc.tensor(np.array([0.4056, -0.8689, 0.6843, 0.2395, 1.2279, -0.9287, -1.7030, 0.1370, 0.1866, 0.4145,
                            -0.6266, 0.3529, 2.2013, -0.6836, 0.2477, 1.3127, -0.6957, 0.3278],
                           np.float32).reshape(1, 2, 3, 3))
    w = lc.tensor(np.array([-0.9259, 1.3017], np.float32).reshape(1, 2, 1, 1))
    res = t.conv_transpose2d(w.transpose(0, 1))
    assert res.shape == (1, 1, 3, 3)
    np.testing.assert_allclose(res.numpy().reshape(-1), [0.164, -0.0111, -0.1742, 2.6437, -2.0268, 1.1823, 3.2855,
                                                         -1.0324, 0.2539], atol=1.5e-4)
    res = t.transpose(0, 1).conv_transpose2d(w)
    assert res.shape == (2, 2, 3, 3)
    np.testing.assert_allclose(res.numpy().reshape(-1)[:12], [-0.3755, 0.8045, -0.6336, -0.2218, -1.1369, 0.8599,
                                                              1.5768, -0.1268, -0.1728, 0.528, -1.131, 0.8908],
                               atol=1.5e-4)


CANDLE_GRAD_T = [
    0.4056, -0.8689, -0.0773, -1.563, -2.8012, -1.5059, 0.3972, 1.0852, 0.4997, 3.0616, 1.6541, 0.0964,
    -0.8338, -1.6523, -0.8323, -0.1699, 0.0823, 0.3526, 0.6843, 0.2395, 1.2279, -0.9287, -1.703, 0.137,
    0.6047, 0.377, -0.6266, 0.3529, 2.2013, -0.6836, 0.2477, 1.3127, -0.226, 0.2622, -1.2974, -0.814, -0.8404,
    -0.349, 0.013, 1.3123, 1.7569, -0.3956, -1.8255, 0.1727, -0.3538, 2.6941, 1.0529, 0.4219, -0.2071, 1.1586,
    0.4717, 0.3865, -0.569, -0.501, -0.131, 0.7796, 0.663, -0.2021, 2.609, 0.2049, 0.6466, -0.5042, -0.0603,
    -1.6538, -1.2429, 1.8357, 1.6052, -1.3844, 0.3323, -1.3712, 0.9634, -0.4799, -0.6451, -0.084, -1.4247,
    0.5512, -0.1747, -0.5509, -0.3742, 0.379, -0.4431, -0.472, -0.789, 0.262, 0.5411, -1.1715, -2.4997,
    2.3249, -0.8912, -0.4733, -0.5701, -2.8888, -1.4112, -0.5471, -0.9234, -1.166, 0.4189, -0.7465, -0.6473,
    0.1402, 0.7875, 0.5377, -0.6779, -0.8088, -0.4864, -0.2312, 0.9279, 0.1264, 1.548, 0.8265, -0.1025,
    0.5138, -0.2512, 0.1576, 1.2705, 0.3641, -0.9325, 0.6451, -0.8537, 0.2378, 0.1794, 0.2752, -0.3687,
    -1.1149, -0.141, -0.5829, -0.0892, 1.4258, -2.2789, 0.527, 0.1825, 1.7007, -0.5263, -0.2954, 0.444,
    0.5537, 0.3492, 0.6186, 1.6475, 0.2219,
]
CANDLE_GRAD_W = [
    -1.1744, 0.3266, 2.5893, 1.0142, 0.1763, 0.7752, 0.6604, 0.2029, -0.2145, 0.7234, -0.3441, -1.54, -0.6333,
    0.6613, 0.2083, 0.623, -1.7002, 0.3393, 0.4049, 1.0762, 0.2723, 1.4181, 0.0029, -0.2122, 1.7668, 1.4168,
    0.332, -0.2719, 0.7932, -0.7204, 0.4447, 0.1211, 0.5908, 1.0089, -0.1646, 1.8033, -0.6286, 0.2016, -0.337,
    1.2555, 0.8009, -0.6488, -0.4652, -1.5685, 1.586, 0.5583, 0.4623, 0.6026, 0.8828, 2.499, 0.6811, -0.3369,
    1.332, 1.7669, -1.1067, 1.2958, -0.9415, -0.9655, -0.4462, 0.7181, 0.5181, -1.1658, -1.8467, -0.7763,
    1.2769, 0.8651, 0.989, 1.5092, 0.7207, -0.8481, 0.7417, 0.3375, -1.2685, 1.4572, 1.0915, 0.1093, -0.855,
    -0.5831, -0.6309, -0.2509, 0.522, -0.0914, 0.79, 0.1096, 0.3258, 0.2723, -1.0942, -0.3393, -0.1653,
    0.5732, -0.8014, 1.8194, -1.9023, 0.2127, 1.8636, -0.8979, 0.1927, -0.2778, 0.3105, 0.0071, -1.1823,
    0.2476, -0.7178, -1.3821, 1.0769, -0.4376, -0.9967, -0.1227, 1.6197, -1.0604, 0.1372, 0.8141, -0.6163,
    0.7304, -0.8285, 2.0636, -0.7176, 0.2495, -0.2581, -0.4478,
]


@pytest.mark.parametrize("setting", [
    # (padding, output_padding, stride, dilation, loss, first row of grad t[0, 0], first grad w values)
    (4, 2, 3, 3, 2904.0, [32.3, -41.6, -24.0, 14.1, 17.6], [-89.0, -135.3, 136.7, 102.0, -53.4, 117.9]),
    (1, 1, 2, 1, 3627.0, [13.2, -40.7, -9.7, -47.3, -82.7], [-24.6, -3.1, 221.9, 7.4, 56.2, 74.2]),
], ids=["p4-op2-s3-d3", "p1-op1-s2-d1"])
def test_candle_conv_transpose2d_grad_values(setting):
    """conv2d_grad of conv_tests.rs: loss = sum(conv_transpose2d(t, w)^2) and its gradients
    (candle and torch differ by 0.1 in a few places, hence the tolerance)."""
    p, q, s, d, loss_want, gt_row, gw_head = setting
    t = lc.Var(np.array(CANDLE_GRAD_T, np.float32).reshape(1, 4, 7, 5))
    w = lc.Var(np.array(CANDLE_GRAD_W, np.float32).reshape(4, 2, 3, 5))
    res = t.conv_transpose2d(w, p, q, s, d)
    loss = res.sqr().sum_all()
    assert round(float(loss.numpy())) == loss_want
    grads = loss.backward()
    gt, gw = grads[t].numpy(), grads[w].numpy()
    assert gt.shape == (1, 4, 7, 5) and gw.shape == (4, 2, 3, 5)
    np.testing.assert_allclose(gt[0, 0, 0], gt_row, atol=0.11)
    np.testing.assert_allclose(gw.reshape(-1)[:6], gw_head, atol=0.11)


# ---- against the NumPy reference ---------------------------------------------------------------
CT2D_CASES = [
    # (x shape, kernel shape, padding, output_padding, stride, dilation, groups)
    ((2, 3, 5, 4), (3, 4, 3, 3), 0, 0, 1, 1, 1),
    ((1, 4, 4, 5), (4, 3, 3, 2), 1, 1, 2, 1, 1),
    ((2, 4, 3, 3), (4, 2, 4, 4), 1, 0, 2, 1, 2),              # groups
    ((1, 6, 3, 4), (6, 1, 3, 3), 2, (1, 0), (3, 2), (2, 1), 3),
    ((1, 2, 4, 4), (2, 3, 1, 1), 0, 0, 1, 1, 1),              # 1x1: the GEMM alone
    ((1, 2, 3, 3), (2, 2, 1, 1), 0, 1, 2, 1, 1),              # 1x1 with stride: col2im spreads
    ((1, 1, 2, 3), (1, 2, 3, 2), (1, 0), 2, 3, 3, 1),         # output_padding < dilation only
    ((1, 1, 1, 1), (1, 1, 5, 5), 0, 0, 1, 1, 1),              # one input pixel
]


@pytest.mark.parametrize("case", CT2D_CASES, ids=[str(i) for i in range(len(CT2D_CASES))])
def test_conv_transpose2d_params(case):
    xs, ks, p, q, s, d, g = case
    rng = rng_for("conv_transpose2d", case)
    x, k = data(lc.f32, xs, rng), data(lc.f32, ks, rng)
    got = lc.tensor(x).conv_transpose2d(lc.tensor(k), padding=p, output_padding=q, stride=s, dilation=d,
                                        groups=g).numpy()
    check(got, ref_conv_transpose2d(x, k, pair(p), pair(q), pair(s), pair(d), g), lc.f32, f"{case}")


CT1D_CASES = [((2, 3, 6), (3, 2, 3), 0, 0, 1, 1, 1), ((1, 4, 7), (4, 3, 4), 2, 1, 3, 1, 2),
              ((2, 2, 5), (2, 1, 3), 1, 0, 1, 2, 2), ((1, 1, 1), (1, 3, 2), 0, 0, 1, 1, 1),
              ((1, 3, 4), (3, 2, 5), 3, 2, 4, 2, 1)]


@pytest.mark.parametrize("case", CT1D_CASES, ids=[str(i) for i in range(len(CT1D_CASES))])
def test_conv_transpose1d_params(case):
    xs, ks, p, q, s, d, g = case
    rng = rng_for("conv_transpose1d", case)
    x, k = data(lc.f32, xs, rng), data(lc.f32, ks, rng)
    got = lc.tensor(x).conv_transpose1d(lc.tensor(k), padding=p, output_padding=q, stride=s, dilation=d,
                                        groups=g).numpy()
    check(got, ref_conv_transpose1d(x, k, p, q, s, d, g), lc.f32, f"{case}")


DTYPES = [lc.f64, lc.f16, lc.bf16, lc.f8e4m3]


@pytest.mark.parametrize("dt", DTYPES, ids=[d.name for d in DTYPES])
def test_conv_transpose_dtypes(dt):
    rng = rng_for("conv_transpose-dt", dt.name)
    x, k = data(dt, (2, 4, 4, 3), rng), data(dt, (4, 3, 3, 3), rng)
    got = lc.tensor(x).conv_transpose2d(lc.tensor(k), padding=1, output_padding=1, stride=2, groups=2).numpy()
    check(got, ref_conv_transpose2d(x, k, (1, 1), (1, 1), (2, 2), (1, 1), 2), dt, f"conv_transpose2d {dt.name}")
    x1, k1 = data(dt, (2, 3, 6), rng), data(dt, (3, 2, 4), rng)
    got = lc.tensor(x1).conv_transpose1d(lc.tensor(k1), padding=2, stride=2, dilation=2).numpy()
    check(got, ref_conv_transpose1d(x1, k1, 2, 0, 2, 2), dt, f"conv_transpose1d {dt.name}")


@pytest.mark.parametrize("dt", [lc.f16, lc.bf16], ids=["f16", "bf16"])
def test_half_precision_conv_transpose_rounds_each_output_once(dt):
    """The GEMM and col2im's overlap sum run in f32 and each output is rounded once, as torch
    does (issue 37: rounding the GEMM's columns, then the sum, was 2-3 ulp off)."""
    rng = rng_for("conv_transpose-round-once", dt.name)
    x, k = data(dt, (2, 4, 5, 4), rng), data(dt, (4, 3, 3, 3), rng)
    got = lc.tensor(x).conv_transpose2d(lc.tensor(k), padding=1, stride=2, groups=2).numpy()
    want = ref_conv_transpose2d(x, k, (1, 1), (0, 0), (2, 2), (1, 1), 2).astype(np.float32).astype(dt.numpy)
    np.testing.assert_array_equal(got, want)
    x1, k1 = data(dt, (2, 3, 9), rng), data(dt, (3, 2, 4), rng)
    got = lc.tensor(x1).conv_transpose1d(lc.tensor(k1), padding=1, stride=2, dilation=2).numpy()
    want = ref_conv_transpose1d(x1, k1, 1, 0, 2, 2).astype(np.float32).astype(dt.numpy)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dt", [lc.i32, lc.i64], ids=["i32", "i64"])
def test_conv_transpose_integers_are_exact(dt):
    rng = rng_for("conv_transpose-int", dt.name)
    x = rng.integers(-5, 6, (1, 2, 3, 4)).astype(dt.numpy)
    k = rng.integers(-5, 6, (2, 2, 3, 2)).astype(dt.numpy)
    got = lc.tensor(x).conv_transpose2d(lc.tensor(k), padding=1, stride=2).numpy()
    want = ref_conv_transpose2d(x, k, (1, 1), (0, 0), (2, 2)).astype(dt.numpy)
    assert got.dtype == dt.numpy
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layout", ["transposed", "narrowed", "broadcast", "permuted"])
def test_conv_transpose_strided_inputs(layout):
    rng = rng_for("conv_transpose-layout", layout)
    x_t, x = make_input(layout, (2, 3, 5, 4), lc.f32, rng)
    k_t, k = make_input("transposed" if layout != "transposed" else "narrowed", (3, 2, 3, 2), lc.f32, rng)
    got = x_t.conv_transpose2d(k_t, padding=1, stride=(2, 1), output_padding=(1, 0)).numpy()
    check(got, ref_conv_transpose2d(x, k, (1, 1), (1, 0), (2, 1)), lc.f32, f"conv_transpose2d {layout}")
    got1 = x_t[:, :, 0, :].conv_transpose1d(k_t[:, :, 0, :], stride=2).numpy()
    check(got1, ref_conv_transpose1d(x[:, :, 0, :], k[:, :, 0, :], 0, 0, 2), lc.f32, f"conv_transpose1d {layout}")


@pytest.mark.parametrize("backend", ["blas", "tiled"])
def test_conv_transpose_backends_and_threads(backend):
    rng = rng_for("conv_transpose-backend", backend)
    x, k = data(lc.f32, (2, 8, 24, 20), rng), data(lc.f32, (8, 4, 4, 4), rng)
    ref = ref_conv_transpose2d(x, k, (1, 1), (0, 0), (2, 2), (1, 1), 2)
    old = lc.get_matmul_backend()
    try:
        lc.set_matmul_backend(backend)
        for n in (1, 2):
            with lc.num_threads(n):
                got = lc.tensor(x).conv_transpose2d(lc.tensor(k), padding=1, stride=2, groups=2).numpy()
            check(got, ref, lc.f32, f"{backend} {n} threads")
    finally:
        lc.set_matmul_backend(old)


def test_conv_transpose_zero_size_and_lazy_operands():
    rng = rng_for("conv_transpose-zero")
    k = data(lc.f32, (2, 3, 3, 3), rng)
    z = lc.tensor(np.zeros((0, 2, 4, 4), np.float32)).conv_transpose2d(lc.tensor(k), stride=2).numpy()
    assert z.shape == (0, 3, 9, 9)
    z = lc.ones((1, 2, 4, 4)).conv_transpose2d(lc.zeros((2, 0, 3, 3))).numpy()
    assert z.shape == (1, 0, 6, 6)
    z = lc.ones((1, 0, 4)).conv_transpose1d(lc.zeros((0, 2, 3))).numpy()       # no input channels: zeros
    np.testing.assert_array_equal(z, np.zeros((1, 2, 6), np.float32))
    x = data(lc.f32, (1, 2, 3, 3), rng)
    y = (lc.tensor(x) * 2.0).conv_transpose2d(lc.tensor(k) + 1.0, stride=2).relu()
    check(y.numpy(), np.maximum(ref_conv_transpose2d(x * 2.0, k + 1.0, stride=(2, 2)), 0), lc.f32, "lazy")


BAD = {
    "dtype mismatch": (lambda: lc.ones((1, 2, 4)).conv_transpose1d(lc.ones((2, 1, 3), dtype=lc.f64)),
                       lc.DTypeMismatchBinaryOp),
    "rank": (lambda: lc.ones((2, 4)).conv_transpose1d(lc.ones((2, 1, 3))), lc.ShapeMismatchBinaryOp),
    "kernel c_in": (lambda: lc.ones((1, 2, 4, 4)).conv_transpose2d(lc.ones((3, 1, 3, 3))), lc.ShapeMismatchBinaryOp),
    "groups do not divide": (lambda: lc.ones((1, 3, 4)).conv_transpose1d(lc.ones((3, 1, 3)), groups=2),
                             lc.ShapeMismatchBinaryOp),
    "output_padding too big": (lambda: lc.ones((1, 2, 4)).conv_transpose1d(lc.ones((2, 1, 3)), stride=2,
                                                                            output_padding=2),
                               lc.ShapeMismatchBinaryOp),
    "empty output": (lambda: lc.ones((1, 1, 1)).conv_transpose1d(lc.ones((1, 1, 2)), padding=1),
                     lc.ShapeMismatchBinaryOp),
    "empty input": (lambda: lc.ones((1, 1, 0)).conv_transpose1d(lc.ones((1, 1, 2))), lc.ShapeMismatchBinaryOp),
    "negative padding": (lambda: lc.ones((1, 1, 4)).conv_transpose1d(lc.ones((1, 1, 2)), padding=-1),
                         lc.ShapeMismatch),
    "zero stride": (lambda: lc.ones((1, 1, 4, 4)).conv_transpose2d(lc.ones((1, 1, 2, 2)), stride=(1, 0)),
                    lc.ShapeMismatch),
    "float padding": (lambda: lc.ones((1, 1, 4)).conv_transpose1d(lc.ones((1, 1, 2)), padding=1.0), TypeError),
    "storage-only": (lambda: lc.ones((1, 1, 4)).to_dtype(lc.f4).conv_transpose1d(lc.ones((1, 1, 2)).to_dtype(lc.f4)),
                     lc.UnsupportedDTypeForOp),
}


@pytest.mark.parametrize("name", list(BAD))
def test_conv_transpose_bad_args(name):
    fn, err = BAD[name]
    with pytest.raises(err):
        fn()


# ---- gradients ---------------------------------------------------------------------------------
def directional_check(fn, arrays, eps=1e-6):
    """d/dt sum(fn(x + t v) * w) at t = 0 by central differences against <grad, v> (f64)."""
    rng = rng_for("directional", *[a.shape for a in arrays])
    out = fn(*[lc.tensor(a) for a in arrays])
    w = rng.standard_normal(out.shape)
    loss = lambda *ts: (fn(*ts) * lc.tensor(w)).sum()
    grads = lc.grad(loss, tuple(range(len(arrays))))(*[lc.tensor(a) for a in arrays])
    for i, g in enumerate(grads):
        v = rng.standard_normal(arrays[i].shape)
        vals = []
        for step in (eps, -eps):
            xs = list(arrays)
            xs[i] = arrays[i] + step * v
            vals.append(float(loss(*[lc.tensor(a) for a in xs]).numpy()))
        want = (vals[0] - vals[1]) / (2 * eps)
        got = float((g.numpy() * v).sum())
        assert abs(got - want) <= 1e-6 * max(1.0, abs(want)), f"argument {i}: {got} vs {want}"


@pytest.mark.parametrize("case", [CT2D_CASES[1], CT2D_CASES[3], CT2D_CASES[5], CT2D_CASES[6]],
                         ids=["stride", "groups-dilation", "1x1-stride", "outpad-dilation"])
def test_conv_transpose2d_gradients(case):
    xs, ks, p, q, s, d, g = case
    rng = rng_for("conv_transpose-grad", case)
    directional_check(lambda x, k: x.conv_transpose2d(k, p, q, s, d, g),
                      [rng.standard_normal(xs), rng.standard_normal(ks)])


def test_conv_transpose1d_and_conv_gradients_through_col2im():
    rng = rng_for("conv_transpose1d-grad")
    directional_check(lambda x, k: x.conv_transpose1d(k, 2, 1, 3, 1, 2),
                      [rng.standard_normal((1, 4, 7)), rng.standard_normal((4, 3, 4))])
    directional_check(lambda x, k: x.conv2d(k, padding=1, stride=2, dilation=(1, 2)),   # im2col's VJP is col2im
                      [rng.standard_normal((1, 2, 7, 8)), rng.standard_normal((3, 2, 3, 2))])


# ---- upsample_bilinear2d -----------------------------------------------------------------------
def ref_bilinear(x, h, w, align_corners):
    """torch's upsample_bilinear2d, one output pixel at a time, in float64."""
    x = np.asarray(x).astype(np.float64)
    b, c, h0, w0 = x.shape
    out = np.zeros((b, c, h, w))

    def source(i, src, dst):
        if align_corners:
            pos = i * (src - 1) / (dst - 1) if dst > 1 else 0.0
        else:
            pos = max((i + 0.5) * src / dst - 0.5, 0.0)
        i0 = min(int(np.floor(pos)), src - 1)
        return i0, min(i0 + 1, src - 1), pos - i0

    for y in range(h):
        y0, y1, fy = source(y, h0, h)
        for xx in range(w):
            x0, x1, fx = source(xx, w0, w)
            out[:, :, y, xx] = ((1 - fy) * ((1 - fx) * x[:, :, y0, x0] + fx * x[:, :, y0, x1])
                                + fy * ((1 - fx) * x[:, :, y1, x0] + fx * x[:, :, y1, x1]))
    return out


def test_bilinear_torch_documented_values():
    """torch.nn.Upsample's documentation: [[1, 2], [3, 4]] to 4 x 4."""
    t = lc.tensor(np.array([[[[1.0, 2.0], [3.0, 4.0]]]], np.float32))
    np.testing.assert_allclose(t.upsample_bilinear2d(4, 4, False).numpy()[0, 0], [
        [1.0, 1.25, 1.75, 2.0], [1.5, 1.75, 2.25, 2.5], [2.5, 2.75, 3.25, 3.5], [3.0, 3.25, 3.75, 4.0]], atol=1e-6)
    np.testing.assert_allclose(t.upsample_bilinear2d(4, 4, align_corners=True).numpy()[0, 0], [
        [1.0, 1.3333, 1.6667, 2.0], [1.6667, 2.0, 2.3333, 2.6667], [2.3333, 2.6667, 3.0, 3.3333],
        [3.0, 3.3333, 3.6667, 4.0]], atol=1e-4)


BILINEAR_SIZES = [(2, 2, 4, 4), (5, 7, 3, 11), (4, 4, 4, 9), (1, 3, 4, 1), (6, 5, 13, 2), (3, 3, 3, 3)]


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("sizes", BILINEAR_SIZES, ids=[str(s) for s in BILINEAR_SIZES])
def test_bilinear_vs_reference(sizes, align_corners):
    h0, w0, h, w = sizes
    rng = rng_for("bilinear", sizes, align_corners)
    x = data(lc.f64, (2, 3, h0, w0), rng)
    got = lc.tensor(x).upsample_bilinear2d(h, w, align_corners).numpy()
    np.testing.assert_allclose(got, ref_bilinear(x, h, w, align_corners), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dt", [lc.f32, lc.f16, lc.bf16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "narrowed"])
def test_bilinear_dtypes_and_layouts(dt, layout):
    rng = rng_for("bilinear-dt", dt.name, layout)
    t, x = make_input(layout, (1, 2, 5, 6), dt, rng)
    got = t.upsample_bilinear2d(9, 4, False).numpy()
    check(got, ref_bilinear(x, 9, 4, False), dt, f"bilinear {dt.name} {layout}")


def test_bilinear_zero_size_errors_and_gradient():
    z = lc.zeros((0, 2, 3, 3)).upsample_bilinear2d(5, 5).numpy()
    assert z.shape == (0, 2, 5, 5)
    assert lc.ones((1, 1, 3, 3)).upsample_bilinear2d(0, 4).numpy().shape == (1, 1, 0, 4)
    with pytest.raises(lc.ShapeMismatch):
        lc.zeros((1, 1, 0, 3)).upsample_bilinear2d(2, 2)
    with pytest.raises(lc.ShapeMismatch):
        lc.ones((1, 3, 3)).upsample_bilinear2d(2, 2)
    with pytest.raises(lc.UnsupportedDTypeForOp):
        lc.ones((1, 1, 2, 2), dtype=lc.i32).upsample_bilinear2d(4, 4)
    with pytest.raises(lc.ShapeMismatch):
        lc.ones((1, 1, 2, 2)).upsample_bilinear2d(-1, 4)
    rng = rng_for("bilinear-grad")
    for ac in (False, True):
        directional_check(lambda x: x.upsample_bilinear2d(5, 3, ac), [rng.standard_normal((1, 2, 3, 4))])
