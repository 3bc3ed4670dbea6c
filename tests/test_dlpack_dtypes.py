"""DLPack for the dtypes NumPy's DLPack cannot carry (SPEC "Mixing with NumPy and Python";
lazycandle/dlpack.py): bf16 and the ml_dtypes floats go to and come from torch and any other
producer bit-exactly, zero-copy where the data is row-major, read-only on export, with the
producer's memory kept alive exactly as long as something views it."""
from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

import lazycandle as lc
from lazycandle import dlpack

NO_NUMPY_DLPACK = [lc.bf16, lc.f8e4m3, lc.f8e8m0]         # the ones torch has too
SUBBYTE = [lc.f6e2m3, lc.f6e3m2, lc.f4]


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def torch_dtype(torch, dt):
    return {lc.bf16: torch.bfloat16, lc.f8e4m3: torch.float8_e4m3fn, lc.f8e8m0: torch.float8_e8m0fnu}[dt]


def values(dt, shape, seed=0) -> np.ndarray:
    """Finite values of `dt` (positive for e8m0, which has no sign)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 4
    return (np.abs(x) if dt is lc.f8e8m0 else x).astype(dt.numpy)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.itemsize}")


def torch_bits(x) -> np.ndarray:
    """The stored bits of a torch tensor (torch has no uint16 view to NumPy, int16 has the same bits)."""
    import torch
    return bits(x.view(torch.int16 if x.element_size() == 2 else torch.uint8).numpy())


def capsule_fields(capsule):
    """(capsule name, flags or None for a legacy capsule, (code, bits, lanes), data address)."""
    name, managed = dlpack._open(capsule)
    t = managed.dl_tensor
    flags = managed.flags if name == b"dltensor_versioned" else None
    return name, flags, (t.dtype.code, t.dtype.bits, t.dtype.lanes), t.data


class Producer:
    """A DLPack producer of a NumPy array's bytes relabelled as another DLDataType (how a library
    other than torch would hand us a dtype NumPy cannot name); `legacy` takes no keywords."""

    def __init__(self, arr, code, nbits, lanes=1, flags=0, legacy=False):
        self.arr, self.dtype, self.flags, self.legacy = arr, (code, nbits, lanes), flags, legacy

    def __dlpack__(self, **kwargs):
        if self.legacy and kwargs:
            raise TypeError("__dlpack__() takes no keyword arguments")
        capsule = self.arr.__dlpack__(**kwargs)
        name, managed = dlpack._open(capsule)
        managed.dl_tensor.dtype = dlpack.DLDataType(*self.dtype)
        if name == b"dltensor_versioned":
            managed.flags |= self.flags
        return capsule

    def __dlpack_device__(self):
        return (1, 0)


def lc_cases(dt):
    """name -> a lazycandle tensor of `dt`: realized, rank-0, empty, and lazy views of a realized one."""
    base = lc.tensor(values(dt, (3, 4)))
    return {"2d": base, "rank0": lc.tensor(values(dt, ())), "empty": lc.tensor(values(dt, (0, 3))),
            "transposed": base.t(), "narrowed": base.narrow(1, 1, 2)}


# ---- lazycandle -> torch -> lazycandle -----------------------------------------------------------
@pytest.mark.parametrize("case", ["2d", "rank0", "empty", "transposed", "narrowed"])
@pytest.mark.parametrize("dt", NO_NUMPY_DLPACK, ids=lambda d: d.name)
def test_lc_to_torch_to_lc_is_bit_exact(torch, dt, case):
    t = lc_cases(dt)[case]
    want = bits(t.numpy())
    x = torch.from_dlpack(t)
    assert x.dtype == torch_dtype(torch, dt) and tuple(x.shape) == t.shape
    np.testing.assert_array_equal(torch_bits(x), want)
    back = lc.from_dlpack(x)
    assert back.dtype is dt and back.shape == t.shape
    np.testing.assert_array_equal(bits(back.numpy()), want)
    if t.elem_count:
        assert back.numpy().ctypes.data == x.data_ptr() == t.numpy().ctypes.data


@pytest.mark.parametrize("dt", NO_NUMPY_DLPACK, ids=lambda d: d.name)
def test_export_is_zero_copy_read_only_and_carries_the_dlpack_code(torch, dt):
    t = lc.tensor(values(dt, (5, 3))).realize()
    name, flags, dtype, data = capsule_fields(t.__dlpack__(max_version=(1, 0)))
    assert name == b"dltensor_versioned" and flags & dlpack.READ_ONLY
    assert dtype == (*dlpack.CODES[dt], 1) and data == t.numpy().ctypes.data
    assert dtype == {lc.bf16: (4, 16, 1), lc.f8e4m3: (10, 8, 1), lc.f8e8m0: (14, 8, 1)}[dt]
    assert torch.from_dlpack(t).data_ptr() == t.numpy().ctypes.data
    assert t.__dlpack_device__() == (1, 0)


def test_copy_true_and_bad_requests_follow_numpy():
    t = lc.tensor(values(lc.bf16, (4,)))
    name, flags, _, data = capsule_fields(t.__dlpack__(max_version=(1, 0), copy=True))
    assert data != t.numpy().ctypes.data and not flags & dlpack.READ_ONLY
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    with pytest.raises(RuntimeError):
        t.__dlpack__(max_version=(1, 0), stream=1)


# ---- torch -> lazycandle -> torch ----------------------------------------------------------------
def torch_cases(torch, dt):
    """name -> a torch tensor of `dt`: contiguous (whole, rank-0, empty, a row) and strided views."""
    raw = values(dt, (4, 6), seed=1).view(np.int16 if dt.size_in_bytes == 2 else np.uint8)
    x = torch.from_numpy(raw).view(torch_dtype(torch, dt))
    return {"2d": x, "rank0": x[1, 2], "empty": x[:0], "row": x[2], "transposed": x.t(),
            "every_other": x[:, ::2]}


@pytest.mark.parametrize("case", ["2d", "rank0", "empty", "row", "transposed", "every_other"])
@pytest.mark.parametrize("dt", NO_NUMPY_DLPACK, ids=lambda d: d.name)
def test_torch_to_lc_to_torch_is_bit_exact(torch, dt, case):
    x = torch_cases(torch, dt)[case]
    t = lc.from_dlpack(x)
    assert t.dtype is dt and t.shape == tuple(x.shape)
    np.testing.assert_array_equal(bits(t.numpy()), torch_bits(x))
    if x.is_contiguous() and x.numel():
        assert t.numpy().ctypes.data == x.data_ptr()          # zero-copy
    elif x.numel():
        assert t.numpy().ctypes.data != x.data_ptr()          # strided: copied
    np.testing.assert_array_equal(torch_bits(torch.from_dlpack(t)), torch_bits(x))
    np.testing.assert_array_equal(bits(t.copy().numpy()), torch_bits(x))      # kernels read it too


# ---- lifetime ------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [6, 1 << 17], ids=["kept-result", "pooled-block"])
def test_torch_view_outlives_the_lc_tensor(torch, n):
    t = lc.tensor(values(lc.bf16, (n,))) * 1.0            # a computed result, from the buffer pool
    x = torch.from_dlpack(t)
    want = torch_bits(x).copy()
    del t
    gc.collect()
    for k in range(4):                                      # results of the same size, to reuse the memory
        (lc.tensor(np.full(n, k, ml_dtypes.bfloat16)) * 1.0).realize()
    np.testing.assert_array_equal(torch_bits(x), want)


def test_lc_tensor_outlives_the_torch_tensor_and_releases_it(torch):
    x = torch.arange(1 << 16, dtype=torch.float32).to(torch.bfloat16)
    storage = x.untyped_storage()       # counts the tensors on it: x, or the one torch exported
    uses = torch._C._storage_Use_Count(storage._cdata)
    want = torch_bits(x).copy()
    t = lc.from_dlpack(x)
    del x
    gc.collect()
    filler = [torch.full((1 << 16,), 7.0, dtype=torch.bfloat16) for _ in range(4)]
    np.testing.assert_array_equal(bits(t.numpy()), want)
    np.testing.assert_array_equal(bits((t * 1.0).numpy()), want)
    assert torch._C._storage_Use_Count(storage._cdata) == uses        # held by the lc tensor
    del t, filler
    gc.collect()
    assert torch._C._storage_Use_Count(storage._cdata) == uses - 1    # the producer's deleter ran


def _traced_growth(step, n=10_000) -> int:
    """Bytes still allocated after `n` calls of `step` (after a warm-up), per tracemalloc."""
    for _ in range(100):
        step()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(n):
            step()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_ten_thousand_exports_and_imports_leak_nothing(torch):
    t = lc.tensor(values(lc.bf16, (64,))).realize()
    x = torch.from_dlpack(t)
    uses = x._use_count()                   # each import not yet released holds x once
    steps = {"consumed": lambda: torch.from_dlpack(t), "unconsumed": lambda: t.__dlpack__(max_version=(1, 0)),
             "legacy copy": lambda: torch.from_dlpack(t.__dlpack__()), "import": lambda: lc.from_dlpack(x)}
    for what, step in steps.items():
        assert _traced_growth(step) < 100_000, what
    assert x._use_count() == uses


def test_numpy_refusing_an_export_loses_no_error_and_no_memory():
    """NumPy drops the capsule while its own error is set: the capsule's destructor must keep it."""
    t = lc.tensor(values(lc.bf16, (8,)))

    def refused():
        with pytest.raises(RuntimeError, match="Unsupported dtype"):
            np.from_dlpack(t)
    assert _traced_growth(refused, 2_000) < 50_000


def test_views_alive_at_interpreter_exit_do_not_crash(torch):
    script = textwrap.dedent("""
        import torch, lazycandle as lc
        t = lc.ones((3,)).to_dtype(lc.bf16)
        x = torch.from_dlpack(t)
        y = lc.from_dlpack(torch.ones(4, dtype=torch.float8_e4m3fn))
        unconsumed = t.__dlpack__(max_version=(1, 0))
        print(float(x.float().sum()), y.numpy().astype(float).sum())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3.0", "4.0"] and "Exception" not in done.stderr


# ---- legacy (pre-1.0) consumers and producers ----------------------------------------------------
@pytest.mark.parametrize("dt", NO_NUMPY_DLPACK, ids=lambda d: d.name)
def test_legacy_consumer_gets_a_copy(torch, dt):
    t = lc.tensor(values(dt, (2, 5)))
    capsule = t.__dlpack__()
    name, flags, dtype, data = capsule_fields(capsule)
    assert name == b"dltensor" and dtype == (*dlpack.CODES[dt], 1) and data != t.numpy().ctypes.data
    x = torch.from_dlpack(capsule)
    np.testing.assert_array_equal(torch_bits(x), bits(t.numpy()))
    with pytest.raises(BufferError):
        t.__dlpack__(copy=False)


@pytest.mark.parametrize("dt", NO_NUMPY_DLPACK, ids=lambda d: d.name)
def test_legacy_producer(dt):
    a = values(dt, (3, 2))
    t = lc.from_dlpack(Producer(bits(a), *dlpack.CODES[dt], legacy=True))
    assert t.dtype is dt and t.numpy().ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(bits(t.numpy()), bits(a))


# ---- strides, read-only, sub-byte ----------------------------------------------------------------
def test_negative_strides_are_copied_in_order():
    a = values(lc.bf16, (3, 4))
    t = lc.from_dlpack(Producer(bits(a)[::-1, ::-2], *dlpack.CODES[lc.bf16]))
    np.testing.assert_array_equal(bits(t.numpy()), bits(a)[::-1, ::-2])


def test_a_read_only_producer_gives_a_read_only_array():
    t = lc.tensor(values(lc.bf16, (4,)))
    assert not dlpack.to_numpy(t).flags.writeable          # lazycandle exports read-only
    assert dlpack.to_numpy(Producer(bits(values(lc.bf16, (4,))), 4, 16)).flags.writeable


@pytest.mark.parametrize("dt", SUBBYTE, ids=lambda d: d.name)
def test_subbyte_dtypes_travel_padded(dt):
    t = lc.tensor(np.array([0.5, -1.0, 2.0, 0.0], np.float32).astype(dt.numpy))
    name, flags, dtype, _ = capsule_fields(t.__dlpack__(max_version=(1, 0)))
    assert flags & dlpack.SUBBYTE_PADDED and dtype == (*dlpack.CODES[dt], 1)
    back = lc.from_dlpack(Producer(bits(t.numpy()), *dlpack.CODES[dt], flags=dlpack.SUBBYTE_PADDED))
    assert back.dtype is dt
    np.testing.assert_array_equal(bits(back.numpy()), bits(t.numpy()))
    with pytest.raises(BufferError, match="one value a byte"):
        t.__dlpack__()


# ---- dtypes lazycandle does not have -------------------------------------------------------------
@pytest.mark.parametrize("dtype, named", [((7, 8, 1), "kDLFloat8_e3m4"), ((4, 16, 2), "kDLBfloat"),
                                          ((17, 4, 1), "kDLFloat4_e2m1fn"), ((99, 8, 1), "unknown")],
                         ids=["e3m4", "two-lanes", "packed-f4", "unknown-code"])
def test_unsupported_dlpack_dtype_is_a_typed_error(dtype, named):
    with pytest.raises(lc.UnsupportedDType, match=rf"code {dtype[0]} \({named}") as e:
        lc.from_dlpack(Producer(np.zeros(4, np.uint8), *dtype))
    assert isinstance(e.value, TypeError)


def test_unsupported_torch_dtype_is_a_typed_error(torch):
    with pytest.raises(lc.UnsupportedDType, match=r"code 12 \(kDLFloat8_e5m2\)"):
        lc.from_dlpack(torch.zeros(3, dtype=torch.float8_e5m2))
