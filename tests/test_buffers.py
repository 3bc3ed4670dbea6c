"""runtime/buffers.alloc: alignment, recycling of large blocks, private huge-page mappings."""
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
    assert buffers._DATA_AT, "the data pointer's offset was not found on this numpy"
    for a in arrays:
        assert buffers.address(a) == a.ctypes.data, (a.shape, a.dtype, a.strides)
