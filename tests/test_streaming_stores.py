"""Non-temporal (streaming) stores of elementwise kernels: large outputs whose run starts
vector aligned are written with streaming stores, everything else with plain stores.  The
kernels are built and called directly so the tests pick the output alignment (numpy buffers
are not line aligned), the unit ranges a thread pool would hand out, and the threshold."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.codegen import elementwise as E, jit
from lazycandle.codegen.loops import KERNEL_FN
from lazycandle.ir.kernels import EwSpec

ADD = (("add", None, "f32", "f32", (("i", 0), ("i", 1))),)


def _kernel(spec, min_bytes, monkeypatch):
    monkeypatch.setattr(E, "streaming_min_bytes", lambda row=False: min_bytes)
    text = E.build(spec, "ew")
    mod = jit.compile_ir(text, ["ew"], f"stream{min_bytes}")
    return text, mod, KERNEL_FN(mod.address("ew"))


def _misaligned(n, dtype, shift):
    """n elements of `dtype` starting `shift` elements past a 64-byte boundary."""
    dt = np.dtype(dtype)
    raw = np.zeros(n * dt.itemsize + 128, np.uint8)
    off = (-raw.ctypes.data) % 64 + shift * dt.itemsize
    return raw[off:off + n * dt.itemsize].view(dt)


def _run(fn, arrays, sizes, ranges):
    bufs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    sz = (ctypes.c_int64 * len(sizes))(*sizes)
    sc = (ctypes.c_int64 * 1)(0)
    for lo, hi in ranges:
        fn(bufs, sz, sc, lo, hi)


def test_large_outputs_get_nontemporal_stores_and_a_fence(monkeypatch):
    spec = EwSpec(1, (("f32", (1,)), ("f32", (1,))), ADD, ((0, "f32"),), (), None)
    text, mod, _ = _kernel(spec, 1 << 20, monkeypatch)
    assert "!nontemporal" in text and ("llvm.x86.sse.sfence" in text or "fence seq_cst" in text)
    if jit.has_feature("avx"):
        asm = mod.asm()
        assert "vmovnt" in asm and "sfence" in asm


@pytest.mark.parametrize("shift", [0, 1, 5, 15])
@pytest.mark.parametrize("min_bytes", [0, 1 << 40], ids=["streamed", "plain"])
def test_rank1_add_matches_numpy_at_any_output_alignment_and_split(shift, min_bytes, monkeypatch):
    n = 1000 + shift
    spec = EwSpec(1, (("f32", (1,)), ("f32", (1,))), ADD, ((0, "f32"),), (), None)
    _, _, fn = _kernel(spec, min_bytes, monkeypatch)
    rng = np.random.default_rng(shift)
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    out = _misaligned(n + 2, np.float32, shift)
    out[:] = -7.0
    body = out[1:n + 1]
    # ranges on multiples of 16 (as the pool splits) and uneven ones
    _run(fn, [a, b, body], [n], [(0, 3), (3, 3), (3, 37), (37, 48), (48, 512), (512, n)])
    np.testing.assert_array_equal(body, a + b)
    assert out[0] == -7.0 and out[-1] == -7.0          # nothing written outside the output


@pytest.mark.parametrize("inner", [1, 7, 16, 33, 100])
def test_rank2_broadcast_rows_streamed_where_a_row_starts_aligned(inner, monkeypatch):
    rows = 9
    spec = EwSpec(2, (("f32", (inner, 1)), ("f32", (0, 1))), ADD, ((0, "f32"),), (), None)
    _, _, fn = _kernel(spec, 0, monkeypatch)
    rng = np.random.default_rng(inner)
    a = rng.standard_normal((rows, inner)).astype(np.float32)
    bias = rng.standard_normal(inner).astype(np.float32)
    out = _misaligned(rows * inner, np.float32, 0)
    _run(fn, [a.ravel(), bias, out], [rows, inner, inner], [(0, 4), (4, rows)])
    np.testing.assert_array_equal(out.reshape(rows, inner), a + bias)


def test_two_outputs_of_different_widths_streamed_or_not_by_alignment(monkeypatch):
    """Outputs f32 and f64: streamed when both are aligned, plain when the second is one
    element off; both give NumPy's values."""
    instrs = ADD + (("cast", None, "f32", "f64", (("v", 0),)),)
    spec = EwSpec(1, (("f32", (1,)), ("f32", (1,))), instrs, ((0, "f32"), (1, "f64")), (), None)
    _, _, fn = _kernel(spec, 0, monkeypatch)
    n = 301
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    for shift64 in (0, 1):
        o32, o64 = _misaligned(n, np.float32, 0), _misaligned(n, np.float64, shift64)
        _run(fn, [a, b, o32, o64], [n], [(0, 160), (160, n)])
        np.testing.assert_array_equal(o32, a + b)
        np.testing.assert_array_equal(o64, (a + b).astype(np.float64))


def test_inplace_update_streamed_reads_each_element_before_it_is_written(monkeypatch):
    spec = EwSpec(1, (("f32", (1,)), ("f32", (1,))), ADD, ((0, "f32"),), (), None)
    _, _, fn = _kernel(spec, 0, monkeypatch)
    n = 517
    x = _misaligned(n, np.float32, 0)
    x[:] = np.arange(n, dtype=np.float32)
    _run(fn, [x, x, x], [n], [(0, 256), (256, n)])
    np.testing.assert_array_equal(x, 2 * np.arange(n, dtype=np.float32))


def test_streaming_thresholds_come_from_the_hosts_caches():
    sizes = jit.cache_bytes()
    assert E.streaming_min_bytes() == max(sizes[2], sizes[3] // 3) >= E.streaming_min_bytes(row=True) == sizes[2]
    assert E.streaming_min_bytes(row=True) >= 64 << 10


def test_public_api_outputs_above_the_threshold_match_numpy():
    """Through realize: f32 and f16 outputs larger than the threshold, a broadcast bias and
    an odd row length (row starts off a line), at the default thread count."""
    n = E.streaming_min_bytes() // 4 + 1031
    rng = np.random.default_rng(7)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_array_equal((lc.tensor(a) * lc.tensor(b)).numpy(), a * b)
    got16 = (lc.tensor(a) + lc.tensor(b)).to_dtype(lc.f16).numpy()
    np.testing.assert_array_equal(got16, (a + b).astype(np.float16))
    m = a[: (n // 1031) * 1031].reshape(-1, 1031)
    bias = rng.standard_normal(1031).astype(np.float32)
    np.testing.assert_array_equal((lc.tensor(m) + lc.tensor(bias)).numpy(), m + bias)
