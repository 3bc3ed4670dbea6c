"""runtime/buffers: alloc (alignment, recycling of large blocks, private huge-page mappings), the data
address, and results given out again (result / readonly)."""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from lazycandle.runtime import buffers


def _smaps_entry(addr: int) -> dict:
    """The /proc/self/smaps fields of the mapping holding `addr`."""
    fields, inside = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                if inside:
                    break
                inside = lo <= addr < hi
            elif inside:
                fields[head.rstrip(":")] = line.split()[1]
    return fields


@pytest.mark.parametrize("n", [1, 1000, (1 << 20) // 4 + 3, (3 << 20) // 4 + 1])
def test_alloc_is_64_byte_aligned_with_the_asked_length(n):
    a = buffers.alloc(n, np.float32)
    assert a.ctypes.data % 64 == 0 and a.shape == (n,) and a.dtype == np.float32


def test_a_dead_large_block_is_reused_by_a_slightly_different_size():
    """Requests from 2 MiB up are rounded to whole huge pages, so a request a few KiB larger
    or smaller than the block just freed reuses it instead of faulting in a fresh one."""
    a = buffers.alloc((5 << 20) // 4, np.float32)
    addr = a.ctypes.data
    del a
    gc.collect()
    before = dict(buffers.stats)
    b = buffers.alloc((5 << 20) // 4 + 1000, np.float32)
    assert b.ctypes.data == addr and buffers.stats["reused"] == before["reused"] + 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_writes_to_a_large_block_do_not_reach_the_parent():
    a = buffers.alloc(1 << 20, np.float32)
    a[:] = 1.0
    pid = os.fork()
    if pid == 0:
        a[:] = 2.0
        os._exit(0)
    os.waitpid(pid, 0)
    assert (a == 1.0).all()


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "never"


@pytest.mark.skipif(_thp_mode() == "never" or not os.path.exists("/proc/self/smaps"),
                    reason="needs Linux transparent huge pages")
def test_large_blocks_are_eligible_for_transparent_huge_pages():
    a = buffers.alloc((4 << 20) // 4, np.float32)
    a[:] = 0.0
    assert _smaps_entry(a.ctypes.data).get("THPeligible") == "1"


def test_a_matmul_sized_output_of_256_kib_is_a_recycled_block():
    """A 256^2 f32 product's output (256 KiB) comes back from the free list, already mapped
    and cache-warm, instead of a fresh malloc that may fault its pages in again."""
    a = buffers.alloc(256 * 256, np.float32)
    addr = a.ctypes.data
    del a
    before = dict(buffers.stats)
    b = buffers.alloc(256 * 256, np.float32)
    assert b.ctypes.data == addr and buffers.stats["reused"] == before["reused"] + 1


def test_a_block_returns_to_the_free_list_only_when_its_last_view_dies():
    a = buffers.alloc(1 << 18, np.float32)
    addr = a.ctypes.data
    view = a[7:].reshape(-1, 3)[::2]
    del a
    held = buffers.alloc(1 << 18, np.float32)
    assert held.ctypes.data != addr           # the view still holds the first block
    view[0, 0] = 1.0
    del view
    again = buffers.alloc(1 << 18, np.float32)
    assert again.ctypes.data == addr


def test_a_block_under_2_mib_is_one_mapping_of_its_own_size():
    """Small pooled blocks (from POOL_MIN_BYTES up) carry no huge-page alignment slack: a
    program holding thousands of them must not use three mappings and 2 MiB of address space
    each."""
    block = buffers.Block(256 << 10)
    assert len(block.mm) == 256 << 10 and block.addr % 4096 == 0


def test_address_is_the_data_pointer_of_every_kind_of_array():
    """buffers.address reads the data pointer from the array object: it must agree with
    numpy's own `.ctypes.data` on every way an array reaches a kernel."""
    import ml_dtypes
    x = np.arange(60, dtype=np.float32).reshape(6, 10)
    ro = x.copy()
    ro.flags.writeable = False
    arrays = [x, x[2:], x[:, 3:], x.T, x[::2, ::3], ro, ro[1:], np.empty(0, np.int8), np.array(2.0),
              np.zeros(5, ml_dtypes.bfloat16)[1:], np.frombuffer(bytearray(64), np.int32, 4, 16),
              buffers.alloc(7, np.float32), buffers.alloc(1 << 17, np.float32)[5:],
              x.view(type("Sub", (np.ndarray,), {}))]         # (a subclass: the same object layout)
    assert buffers.DATA_AT, "the data pointer's offset was not found on this numpy"
    for a in arrays:
        assert buffers.address(a) == a.ctypes.data, (a.shape, a.dtype, a.strides)


# ---- results handed out again (buffers.result / readonly) ----------------------------------

def test_a_result_is_given_out_again_only_when_nothing_holds_it_or_its_views():
    n = 1000
    first = buffers.result(n, np.float32)
    addr = first.ctypes.data
    held = buffers.result(n, np.float32)            # `first` is held: a fresh one
    assert held.ctypes.data != addr
    del first, held
    again = buffers.result(n, np.float32)           # (the kept one is the last given out)
    view = buffers.readonly(again, (10, 100))
    assert view.shape == (10, 100) and not view.flags.writeable
    again_addr = again.ctypes.data
    del again
    busy = buffers.result(n, np.float32)            # the read-only view still holds it
    assert busy.ctypes.data != again_addr
    del busy, view
    for big in (n, 1 << 18):        # a numpy view of a small result refers to its owner, of a large one to it
        slice_of = buffers.result(big, np.float32)[3:]
        assert buffers.result(big, np.float32).ctypes.data != slice_of.ctypes.data - 12


def test_a_read_only_view_is_given_out_again_only_unchanged_and_unheld():
    buf = buffers.result(64, np.float32)
    a = buffers.readonly(buf, (8, 8))
    b = buffers.readonly(buf, (8, 8))
    assert a is not b                               # `a` is held
    del b
    c = buffers.readonly(buf, (8, 8))
    assert c.shape == (8, 8)
    with pytest.raises(ValueError):
        c.flags.writeable = True
    c.shape = (64,)                                 # what a caller may do to its own array
    del c
    d = buffers.readonly(buf, (8, 8))
    assert d.shape == (8, 8) and d.strides == (32, 4) and d.dtype == np.float32
    d.dtype = np.int32
    del d
    assert buffers.readonly(buf, (8, 8)).dtype == np.float32


@pytest.mark.parametrize("n", [48, 1 << 17])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint16", "bfloat16", "bool"])
def test_a_read_only_view_holds_its_result_for_every_dtype(dtype, n):
    import ml_dtypes
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    buf = buffers.result(n, dt)
    addr = buf.ctypes.data
    buffers.readonly(buf, (n // 16, 16))            # made and dropped
    del buf
    buf = buffers.result(n, dt)
    assert buf.ctypes.data == addr
    view = buffers.readonly(buf, (n // 16, 16))
    del buf
    assert buffers.result(n, dt).ctypes.data != addr
    assert view.base is not None


@pytest.mark.parametrize("shape", [(16, 16), (256,), (4, 4, 16), (512, 512), (1 << 17,)])
def test_views_made_of_a_numpy_view_hold_the_result(shape):
    """A row, a slice, a flattening or a transpose of t.numpy() refers to the 1-D array the
    read-only view reshapes, not to the view: it holds the result as well, so the next eager
    result of that size is a fresh array and the held values stay."""
    import lazycandle as lc
    a = lc.tensor(np.ones(shape, np.float32))
    derive = (lambda v: v[0], lambda v: v[1:], lambda v: v.reshape(-1), lambda v: v.T, lambda v: v[..., ::2][:1])
    for trial in range(3):
        held = []
        for k, f in enumerate(derive):
            value = k + 2 + 10 * trial
            view = (a * value).numpy()
            held.append((f(view), value))
            del view
            (a * -1).numpy()                        # the next result of the same size
        for h, value in held:
            assert (h == value).all(), (shape, trial, value)


@pytest.mark.parametrize("shape", [(16, 16), (256,)])
def test_the_memoryview_under_a_numpy_view_holds_the_result(shape):
    """`.base` (1-D) or `.base.base` (reshaped) of t.numpy() is the read-only memoryview over
    the result: holding it alone holds the result."""
    import lazycandle as lc
    a = lc.tensor(np.ones(shape, np.float32))
    view = (a * 2).numpy()
    mv = view.base if view.ndim == 1 else view.base.base
    assert isinstance(mv, memoryview)
    del view
    (a * 3).numpy()
    assert (np.frombuffer(mv, np.float32) == 2).all()


def test_forget_lets_a_kept_result_be_written_in_place():
    """slice_set_ donates a dead tensor's buffer: an eager result (kept to be given out again)
    is donated too, and the write never reaches a view a caller still holds."""
    import lazycandle as lc
    x = lc.tensor(np.arange(24, dtype=np.float32).reshape(4, 6))
    t = (x * 2).realize()
    t.numpy()                                       # a kept read-only view, dropped
    before = t._node.buffer.ctypes.data
    t.slice_set_(lc.tensor(np.full((1, 6), -1, np.float32)), 0, 1)
    assert t._node.buffer.ctypes.data == before
    want = np.arange(24, dtype=np.float32).reshape(4, 6) * 2
    want[1] = -1
    np.testing.assert_array_equal(t.numpy(), want)
    held = t.numpy()
    t.slice_set_(lc.tensor(np.full((1, 6), -2, np.float32)), 0, 2)
    np.testing.assert_array_equal(held, want)       # held: t was rebound, not written


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["sum", "mul", "mm", "exp"]), st.sampled_from(["keep", "drop", "view", "row"])),
                min_size=1, max_size=24))
def test_eager_results_held_in_any_pattern_keep_their_values(steps):
    """Eager results of the same size, some held (the tensor, its .numpy() view, or a slice of
    it) and some dropped, in any order: every held value still equals NumPy's at the end."""
    import lazycandle as lc
    rng = np.random.default_rng(len(steps))
    xs = rng.standard_normal((16, 16)).astype(np.float32)
    x = lc.from_dlpack(xs)
    ops = {"sum": (lambda t: t.sum(-1), lambda a: a.sum(-1)), "mul": (lambda t: (t * 3).sum(0), lambda a: (a * 3).sum(0)),
           "mm": (lambda t: t @ t, lambda a: a @ a), "exp": (lambda t: t.exp().sum(-1), lambda a: np.exp(a).sum(-1))}
    held = []
    for op, how in steps:
        lc_fn, np_fn = ops[op]
        t = lc_fn(x)
        got = t.numpy()
        want = np_fn(xs.astype(np.float64))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        if how == "keep":
            held.append((t, want))
        elif how == "view":
            held.append((got[1:], want[1:]))
        elif how == "row":                          # (a view of the 1-D array a 2-D view reshapes)
            held.append((got.reshape(-1)[:5], want.reshape(-1)[:5]))
        del t, got
    for h, want in held:
        np.testing.assert_allclose(h.numpy() if hasattr(h, "_node") else h, want, rtol=1e-4, atol=1e-4)
