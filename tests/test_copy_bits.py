"""A copy is bit-exact for every dtype: signalling and quiet NaN payloads, -0.0 and every other
bit pattern survive copies through elementwise kernels (contiguous copy, transposed and
broadcast `.contiguous()`, strided copies) and `where_cond` between values of one dtype."""
import numpy as np
import pytest

import lazycandle as lc

# every storage pattern for the small types; for f32 / f64 the special patterns plus random bits
VALID_BITS = {"f6e2m3": 6, "f6e3m2": 6, "f4": 4}
SPECIAL_BITS = {
    "f32": [0x7F800001, 0xFF800001, 0x7FC00001, 0xFFC12345, 0x7FBFFFFF, 0x80000000, 0x7F800000, 0x00000001],
    "f64": [0x7FF0000000000001, 0xFFF0000000000001, 0x7FF8000000000001, 0xFFF8DEADBEEF0001,
            0x8000000000000000, 0x7FF0000000000000, 0x0000000000000001],
}
DTYPES = ["bf16", "f16", "f8e4m3", "f32", "f64", "f8e8m0", "f6e2m3", "f6e3m2", "f4"]
COMPUTE = ["bf16", "f16", "f8e4m3", "f32", "f64"]


def _patterns(name, shape):
    """An array of dtype `name` whose raw bits cover every pattern of the type (16 bits and
    less) or its NaN / -0 / subnormal patterns and random bits (f32, f64)."""
    dt = getattr(lc, name)
    nbytes = dt.size_in_bytes
    n = int(np.prod(shape))
    ut = np.dtype(f"u{nbytes}")
    if name in SPECIAL_BITS:
        rng = np.random.default_rng(len(name))
        bits = rng.integers(0, np.iinfo(ut).max, n, dtype=ut, endpoint=True)
        sp = np.array(SPECIAL_BITS[name], ut)
        bits[: len(sp) * 4] = np.tile(sp, 4)
    else:
        codes = 1 << VALID_BITS.get(name, 8 * nbytes)
        bits = (np.arange(n, dtype=np.uint64) * 40503 % codes).astype(ut)    # a permutation of all codes
    return bits.reshape(shape).view(dt.numpy)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def _assert_bits(got, expected, what):
    g, e = _bits(got), _bits(expected)
    assert got.shape == expected.shape and got.dtype == expected.dtype, what
    bad = np.flatnonzero(g != e)
    assert bad.size == 0, (f"{what}: {bad.size} of {g.size} patterns changed, e.g. "
                           + ", ".join(f"{int(e.flat[i]):#x} -> {int(g.flat[i]):#x}" for i in bad[:6]))


@pytest.mark.parametrize("name", DTYPES)
def test_copies_keep_every_bit_pattern(name):
    a = _patterns(name, (256, 256))
    t = lc.tensor(a)
    _assert_bits(t.copy().numpy(), a, "copy")
    _assert_bits(t.t().contiguous().numpy(), a.T, "t().contiguous()")            # register transpose path
    _assert_bits(t[1:200:3, 5:77].contiguous().numpy(), a[1:200:3, 5:77], "strided copy")
    row = lc.tensor(a[:1, :48]).broadcast_as((5, 48)).contiguous().numpy()
    _assert_bits(row, np.broadcast_to(a[:1, :48], (5, 48)), "broadcast copy")
    small = lc.tensor(a[:9, :7]).t().contiguous().numpy()                        # scalar tails
    _assert_bits(small, a[:9, :7].T, "small transposed copy")


@pytest.mark.parametrize("name", COMPUTE)
def test_where_between_one_dtype_keeps_every_bit_pattern(name):
    a = _patterns(name, (64, 96))
    b = a[::-1].copy()
    mask_np = (np.arange(64 * 96).reshape(64, 96) * 7) % 3 == 0
    mask = lc.tensor(mask_np)
    _assert_bits(mask.where_cond(lc.tensor(a), lc.tensor(b)).numpy(), np.where(mask_np, a, b), "where")
    bt = lc.tensor(b.T.copy()).t()                                                # transposed operand
    _assert_bits(mask.where_cond(lc.tensor(a), bt).numpy(), np.where(mask_np, a, b), "where, transposed")
    row = a[:1]
    got = mask.where_cond(lc.tensor(row).broadcast_as((64, 96)), lc.tensor(b)).numpy()
    _assert_bits(got, np.where(mask_np, np.broadcast_to(row, (64, 96)), b), "where, broadcast")
