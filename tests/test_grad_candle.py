"""candle-core's tests/grad_tests.rs, ported: the same inputs and the literal values it asserts.

candle's `y.backward()` on a non-scalar seeds it with ones; here that is `y.sum().backward()`
(SPEC: backward on a non-scalar raises).  candle's interpolate1d/2d are upsample_nearest1d/2d and
`slice_scatter0(src, start)` is `slice_set(src, 0, start)`.  `to_vec_round(t, d)` rounds like
candle's test_utils (in f32: round(v * 10^d) / 10^d)."""
import numpy as np

import lazycandle as lc


class rounded:
    """t's values rounded to `digits` decimals in f32; `==` compares with f32 literals."""

    def __init__(self, t, digits):
        scale = np.float32(10.0 ** digits)
        self.values = np.round(t.numpy().astype(np.float32) * scale) / scale

    def __eq__(self, expected):
        return np.array_equal(self.values, np.array(expected, np.float32))

    def __repr__(self):
        return repr(self.values.tolist())


def f32(data):
    return lc.Var(np.array(data, np.float32))


def grad_of(y, x):
    g = y.sum().backward().get(x)
    assert g is not None, "no grad for x"
    return g


def test_simple_grad():
    x = f32([3.0, 1.0, 4.0])
    y = x * x + x * 5.0 + 4.0
    g = grad_of(y, x)
    assert x.numpy().tolist() == [3.0, 1.0, 4.0]
    assert y.numpy().tolist() == [28.0, 10.0, 40.0]
    assert g.numpy().tolist() == [11.0, 7.0, 13.0]


def test_sum_grad():
    x = f32([3.0, 1.0, 4.0])
    y = x.sqr().sum_keepdim(0) * 2.0
    g = y.backward()[x]                       # shape (1,): one element, no seed needed
    assert y.numpy().tolist() == [52.0]
    assert g.numpy().tolist() == [12.0, 4.0, 16.0]
    y = (x.sqr().sum_keepdim(0) * 2.0).squeeze(0)
    g = y.backward()[x]
    assert y.item() == 52.0
    assert g.numpy().tolist() == [12.0, 4.0, 16.0]


def test_expand_grad():
    x = lc.Var(np.arange(24, dtype=np.float32).reshape(1, 1, 4, 6))
    e = x.unsqueeze(2).expand((1, 1, 3, 4, 6))
    g = (e.sqr().sum_all() * 0.5).backward()[x]
    assert g.flatten_all().numpy().tolist() == [3.0 * v for v in range(24)]


def test_matmul_grad():
    x = lc.Var(np.arange(12, dtype=np.float32).reshape(2, 2, 3))
    y = lc.Var(np.arange(12, dtype=np.float32).reshape(2, 3, 2))
    grads = x.matmul(y).sum().backward()
    assert grads[x].shape == (2, 2, 3) and grads[y].shape == (2, 3, 2)
    assert grads[x].numpy().tolist() == [[[1, 5, 9], [1, 5, 9]], [[13, 17, 21], [13, 17, 21]]]
    assert grads[y].numpy().tolist() == [[[3, 3], [5, 5], [7, 7]], [[15, 15], [17, 17], [19, 19]]]


def test_zero_matmul_grad():
    cases = [((2, 0), (0, 3), (2, 3)), ((0, 2), (2, 3), (0, 3)), ((2, 3), (3, 0), (2, 0)),
             ((0, 2, 3), (0, 3, 4), (0, 2, 4)), ((2, 3, 0), (2, 0, 4), (2, 3, 4))]
    for lhs_shape, rhs_shape, out_shape in cases:
        lhs, rhs = lc.Var(np.zeros(lhs_shape, np.float32)), lc.Var(np.zeros(rhs_shape, np.float32))
        out = lhs.matmul(rhs)
        assert out.shape == out_shape
        assert out.flatten_all().numpy().tolist() == [0.0] * int(np.prod(out_shape))
        grads = out.sum_all().backward()
        for v, shape in ((lhs, lhs_shape), (rhs, rhs_shape)):
            g = grads.get(v)
            assert g is not None and g.shape == shape
            assert g.flatten_all().numpy().tolist() == [0.0] * int(np.prod(shape))


def test_grad_descent():
    x = lc.Var(np.float32(0.0))
    opt = lc.optim.SGD([x], lr=0.1)
    for _ in range(100):
        c = (x - 4.2) * (x - 4.2)
        opt.step(c.backward())
    assert x.numpy().item() == np.float32(4.199999)


def test_unary_grad():
    x = f32([3.0, 1.0, 4.0, 0.15])
    y = x.log() + 1.0
    g = grad_of(y, x)
    assert rounded(y, 4) == [2.0986, 1.0, 2.3863, -0.8971]
    assert rounded(g, 4) == [0.3333, 1.0, 0.25, 6.6667]
    y = x.exp()
    g = grad_of(y, x)
    assert rounded(y, 4) == [20.0855, 2.7183, 54.5982, 1.1618]
    assert rounded(g, 4) == [20.0855, 2.7183, 54.5982, 1.1618]
    y = x.exp().sqr()
    g = grad_of(y, x)
    assert rounded(y, 3) == [403.429, 7.389, 2980.958, 1.35]
    assert rounded(g, 2) == [806.86, 14.78, 5961.92, 2.7]
    y = x.sin()
    g = grad_of(y, x)
    assert rounded(y, 4) == [0.1411, 0.8415, -0.7568, 0.1494]
    assert rounded(g, 4) == [-0.99, 0.5403, -0.6536, 0.9888]
    y = x.cos()
    g = grad_of(y, x)
    assert rounded(y, 4) == [-0.99, 0.5403, -0.6536, 0.9888]
    assert rounded(g, 4) == [-0.1411, -0.8415, 0.7568, -0.1494]
    y = x.sqr()
    g = grad_of(y, x)
    np.testing.assert_array_equal(y.numpy(), np.array([9.0, 1.0, 16.0, 0.0225], np.float32))
    np.testing.assert_array_equal(g.numpy(), np.array([6.0, 2.0, 8.0, 0.3], np.float32))
    y = x.sqr().sqrt()
    g = grad_of(y, x)
    np.testing.assert_array_equal(y.numpy(), np.array([3.0, 1.0, 4.0, 0.15], np.float32))
    assert rounded(g, 4) == [1.0, 1.0, 1.0, 1.0]
    y = -x
    g = grad_of(y, x)
    np.testing.assert_array_equal(y.numpy(), np.array([-3.0, -1.0, -4.0, -0.15], np.float32))
    assert g.numpy().tolist() == [-1.0, -1.0, -1.0, -1.0]
    y = x.affine(0.2, 1.0)
    g = grad_of(y, x)
    np.testing.assert_array_equal(y.numpy(), np.array([1.6, 1.2, 1.8, 1.03], np.float32))
    np.testing.assert_array_equal(g.numpy(), np.full(4, 0.2, np.float32))
    y = lc.tensor(np.float32(1.0)).broadcast_div(x)
    g = grad_of(y, x)
    assert rounded(y, 4) == [0.3333, 1.0, 0.25, 6.6667]
    np.testing.assert_array_equal(g.numpy(), np.array([-0.11111111, -1.0, -0.0625, -44.444443], np.float32))
    y = x.broadcast_div(lc.tensor(np.float32(0.5)))
    g = grad_of(y, x)
    np.testing.assert_array_equal(y.numpy(), np.array([6.0, 2.0, 8.0, 0.3], np.float32))
    assert g.numpy().tolist() == [2.0, 2.0, 2.0, 2.0]


def test_unary_grad_transcendental_activations():
    x = f32([3.0, 1.0, 4.0, 0.15])
    expected = {   # op: (rounding digits, values, gradients), candle's literals (torch's values)
        "powf": (2, lambda t: t.powf(2.5), [15.59, 1.0, 32.0, 0.01], [12.99, 2.5, 20.0, 0.15]),
        "tanh": (2, lambda t: t.tanh(), [1.0, 0.76, 1.0, 0.15], [0.01, 0.42, 0.0, 0.98]),
        "gelu": (4, lambda t: t.gelu(), [2.9964, 0.8412, 3.9999, 0.0839], [1.0116, 1.0830, 1.0003, 0.6188]),
        "erf": (4, lambda t: t.erf(), [1.0, 0.8427, 1.0, 0.168], [0.0001, 0.4151, 0.0, 1.1033]),
        "gelu_erf": (4, lambda t: t.gelu_erf(), [2.9960, 0.8413, 3.9999, 0.0839],
                     [1.0119, 1.0833, 1.0005, 0.6188]),
        "silu": (4, lambda t: t.silu(), [2.8577, 0.7311, 3.9281, 0.0806], [1.0881, 0.9277, 1.0527, 0.5747]),
    }
    for name, (digits, fn, values, grads) in expected.items():
        y = fn(x)
        g = grad_of(y, x)
        assert rounded(y, digits) == values, name
        assert rounded(g, digits) == grads, name
    ex = f32([-1.0, 0.0, -2.0, 3.0])
    y = ex.elu(2.0)
    g = grad_of(y, ex)
    assert rounded(y, 4) == [-1.2642, 0.0, -1.7293, 3.0]
    assert rounded(g, 4) == [0.7358, 2.0, 0.2707, 1.0]


def _weighted(y, n):
    """candle's `y.unsqueeze(1).transpose(0, 1).matmul(z.unsqueeze(1))` with z = 1..n."""
    z = lc.tensor(np.arange(1, n + 1, dtype=np.float32))
    return y.unsqueeze(1).transpose(0, 1).matmul(z.unsqueeze(1))


def test_unary_grad_interpolate():
    x = lc.Var(np.array([[[1, 2, 3], [4, 5, 6], [7, 8, 9]]], np.float32))
    g = _weighted(x.upsample_nearest1d(12).reshape(36), 36).sum().backward()[x]
    assert rounded(g, 4) == [[[10, 26, 42], [58, 74, 90], [106, 122, 138]]]
    x = lc.Var(np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3))
    g = _weighted(x.upsample_nearest2d(6, 6).reshape(36), 36).sum().backward()[x]
    assert rounded(g.flatten(0, 2), 4) == [[18, 26, 34], [66, 74, 82], [114, 122, 130]]
    x = lc.Var(np.array([[[[1, 2], [4, 5]]]], np.float32))
    g = _weighted(x.upsample_nearest2d(6, 6).reshape(36), 36).sum().backward()[x]
    assert rounded(g.flatten(0, 2), 4) == [[72, 99], [234, 261]]
    for data in ([[[[1, 2], [4, 5]], [[6, 7], [8, 9]]]], [[[[1, 2], [4, 5]]], [[[6, 7], [8, 9]]]]):
        x = lc.Var(np.array(data, np.float32))
        g = _weighted(x.upsample_nearest2d(4, 4).reshape(32), 32).sum().backward()[x]
        assert rounded(g.flatten(0, 1), 4) == [[[14, 22], [46, 54]], [[78, 86], [110, 118]]]


def test_binary_grad():
    x = f32([3.0, 1.0, -4.0, -1.0])
    y = x.maximum(x * 0.1)                            # leaky relu
    g = grad_of(y, x)
    np.testing.assert_array_equal(y.numpy(), np.array([3.0, 1.0, -0.4, -0.1], np.float32))
    np.testing.assert_array_equal(g.numpy(), np.array([1.0, 1.0, 0.1, 0.1], np.float32))
    y = x.minimum(x * 0.1)
    g = grad_of(y, x)
    np.testing.assert_array_equal(y.numpy(), np.array([0.3, 0.1, -4.0, -1.0], np.float32))
    np.testing.assert_array_equal(g.numpy(), np.array([0.1, 0.1, 1.0, 1.0], np.float32))
    y = x.minimum(x)                                  # the identity: gradient one, not two or a half
    g = grad_of(y, x)
    assert y.numpy().tolist() == [3.0, 1.0, -4.0, -1.0]
    assert g.numpy().tolist() == [1.0, 1.0, 1.0, 1.0]


def test_binary_grad_slice_scatter():
    x = f32([3.0, 1.0, -4.0, -1.0, 5.0, 9.0])
    y = f32([2.0, 7.0, 1.0])
    ss = x.reshape((2, 3)).slice_set(y.reshape((1, 3)), 0, 1).sqr()
    grads = ss.sum().backward()
    assert ss.numpy().tolist() == [[9.0, 1.0, 16.0], [4.0, 49.0, 1.0]]
    assert grads[x].numpy().tolist() == [6.0, 2.0, -8.0, 0.0, 0.0, 0.0]
    assert grads[y].numpy().tolist() == [4.0, 14.0, 2.0]


def test_flip_backprop():
    x = lc.Var(np.ones((2, 2)))
    weights = lc.arange(1.0, 5.0, dtype=lc.f64).reshape((2, 2))
    y = x.matmul(weights)
    assert y.numpy().tolist() == [[4.0, 6.0], [4.0, 6.0]]
    z = y.flip([1])
    assert z.numpy().tolist() == [[6.0, 4.0], [6.0, 4.0]]
    g = z.sum_all().backward()[x]
    expected = np.ones((2, 2)) @ np.flip(weights.numpy(), 1).T
    np.testing.assert_array_equal(g.numpy(), expected)
