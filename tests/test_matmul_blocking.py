"""The tiled GEMM's cache blocking follows the host: cache sizes read from sysfs, KC covering
K (one pass over each C tile) while the micro-panels fit L2, and the 2-thread split."""
from __future__ import annotations

import numpy as np

from lazycandle import dtype as D
from lazycandle.codegen import jit
from lazycandle.runtime import matmul as MM


def _fake_sysfs(root, entries):
    for i, (level, kind, size) in enumerate(entries):
        d = root / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")


def test_cache_sizes_are_read_from_sysfs_ignoring_the_instruction_cache(tmp_path, monkeypatch):
    _fake_sysfs(tmp_path, [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"),
                           (3, "Unified", "300M"), (4, "Unified", "bogus")])
    real_glob = jit.glob.glob
    monkeypatch.setattr(jit.glob, "glob", lambda pat: real_glob(str(tmp_path / "index*")))
    monkeypatch.setattr(jit, "_cache_sizes", {})
    assert jit.cache_bytes() == {1: 48 << 10, 2: 2 << 20, 3: 300 << 20}


def test_cache_sizes_fall_back_when_sysfs_says_nothing(monkeypatch):
    monkeypatch.setattr(jit.glob, "glob", lambda pat: [])
    monkeypatch.setattr(jit, "_cache_sizes", {})
    got = jit.cache_bytes()
    assert got[1] < got[2] < got[3]


def test_kc_covers_k_while_the_micro_panels_fit_a_quarter_of_l2(monkeypatch):
    monkeypatch.setattr(MM, "CACHES", {1: 48 << 10, 2: 2 << 20, 3: 300 << 20})
    spec, _, ab, _ = MM._tile_kernel(D.f32)
    panel_limit = (2 << 20) // 4 // ((spec.mr + spec.nr) * ab)
    for k in (1, 7, 256, 1000, 2048):
        mc, kc, nc = MM._blocking(spec, ab, k)
        if k <= panel_limit:
            assert kc >= k and kc % 8 == 0
        assert mc % spec.mr == 0 and nc % spec.nr == 0
        assert mc * kc * ab <= (2 << 20) // 3 + spec.mr * kc * ab
    mc, kc, nc = MM._blocking(spec, ab, 10 * panel_limit)
    assert kc <= panel_limit and (spec.mr + spec.nr) * kc * ab <= (2 << 20) // 4


def test_two_thread_split_takes_the_dimension_with_the_smaller_largest_task():
    # 256 rows in 14-row tiles split 140 / 116; 256 columns in 32-column tiles split 128 / 128
    assert MM._chunks(1, 256, 256, 14, 32, 2.0 * 256 ** 3, 2) == (256, 128)
    # rows split evenly in 16-row tiles: the m split of square problems under n ~ 2048 stays
    assert MM._chunks(1, 512, 512, 16, 32, 2.0 * 512 ** 3, 2) == (256, 512)
    assert MM._chunks(1, 4096, 300, 14, 32, 2.0 * 4096 * 300 * 64, 2)[1] == 300
    assert MM._chunks(2, 512, 512, 14, 32, 2.0 * 512 ** 3, 2) == (512, 512)    # one batch each
    assert np.all(np.array(MM._chunks(1, 20, 20, 14, 32, 1.0, 2)) == (20, 20))    # too small to split


def _plan_field(plan, name):
    return plan.params[MM.gemm.param_index(name)]


def test_a_one_mc_block_task_keeps_its_packed_b_block_within_half_of_l2(monkeypatch):
    """128 x 768 @ 768 x 3072 (a transformer's MLP): the rows are one MC block, so a KC x NC
    block of B is swept once; NC is cut so that block stays in L2 for that sweep, and the
    ragged last NC block still gives NumPy's product."""
    monkeypatch.setattr(MM, "CACHES", {1: 48 << 10, 2: 2 << 20, 3: 300 << 20})
    rng = np.random.default_rng(3)
    m, k, n = 30, 768, 700
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    g = MM.geometry(MM.Layout((m, k), (k, 1), 0), MM.Layout((k, n), (n, 1), 0), D.f32)
    plan = MM.TiledPlan(g, 1)
    spec, _, ab, _ = MM._tile_kernel(D.f32)
    nc, kc = _plan_field(plan, "nc"), _plan_field(plan, "kc")
    assert nc < n and nc % spec.nr == 0 and kc * nc * ab <= (2 << 20) // 2
    out = np.empty(m * n, np.float32)
    plan.run(a.ctypes.data, b.ctypes.data, out.ctypes.data)
    np.testing.assert_allclose(out.reshape(m, n), a @ b, rtol=1e-4, atol=1e-3)
    tall = MM.TiledPlan(MM.geometry(MM.Layout((4096, k), (k, 1), 0), MM.Layout((k, n), (n, 1), 0), D.f32), 1)
    assert _plan_field(tall, "nc") >= n      # many MC blocks share each B block: it stays L3-sized
