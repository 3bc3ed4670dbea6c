"""One native program per size class (issue 9): a plan's whole-program module is built and
linked once, and every binding of its size class -- a new one at its first run included --
runs natively with its sizes, extents and arena offsets read from per-binding arrays.  Native
and per-kernel results are bit-identical across bindings (odd sizes, sizes that switch a kernel
between the calling thread and the pool, empty dims), and index kernels still raise
IndexOutOfBounds at new sizes."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.codegen import jit
from lazycandle.runtime import arena
from conftest import run_in_threads


def _w():
    return jit.vector_bits() // 32


def _sizes():
    w = _w()
    return sorted({2, 3, w - 1, w, w + 1, 3 * w + 5, 1000, 4099})


def _mixed_program(rows=True):
    """Elementwise, a row kernel (a max: not at n = 0), a dim-0 reduction, a transposed read
    and a matmul over a named dim n, several intermediates alive at once (arena slots shared
    across sizes)."""
    x = lc.placeholder("x", (24, "n"), lc.f32)
    w = lc.placeholder("w", ("n", 8), lc.f32)
    y = (x * 1.5 - 0.25).tanh()
    soft = lc.nn.softmax_last_dim(y * 2.0) if rows else (y * 2.0).sigmoid()
    col = (y * y).sum_keepdim(0)
    z = (soft + col.broadcast_as(y.shape)).exp()
    return lc.compile([z, soft @ w, (x.transpose(0, 1) + 1.0).abs(), col])


def _feeds(n, seed=0):
    rng = np.random.default_rng(seed + n)
    return {"x": rng.uniform(-1, 1, (24, n)).astype(np.float32), "w": rng.uniform(-1, 1, (n, 8)).astype(np.float32)}


def _run(prog, feeds, mode, monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", mode)
    return prog.run(**feeds)


def test_native_and_per_kernel_runs_are_bit_identical_across_bindings_of_one_class(monkeypatch):
    prog = _mixed_program()
    for threads in (1, 2):
        with lc.num_threads(threads):
            for n in _sizes():
                feeds = _feeds(n)
                slow = _run(prog, feeds, "python", monkeypatch)
                fast = _run(prog, feeds, "native", monkeypatch)
                assert prog._last_direct is not None or prog._last.plan.native, n     # (both native)
                for a, b in zip(slow, fast):
                    assert a.shape == b.shape and np.array_equal(a, b), (threads, n)


def test_sizes_zero_and_one_run_natively_and_match_the_per_kernel_path(monkeypatch):
    prog = _mixed_program(rows=False)
    for n in (0, 1, 0, 1, 2, 0):
        feeds = _feeds(n)
        slow = _run(prog, feeds, "python", monkeypatch)
        fast = _run(prog, feeds, "native", monkeypatch)
        for a, b in zip(slow, fast):
            assert a.shape == b.shape and np.array_equal(a, b), n


def test_a_class_with_an_empty_dim_binds_new_sizes_natively(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    x = lc.placeholder("x", (0, "n"), lc.f32)
    prog = lc.compile([(x * 2.0).exp(), x.sum_keepdim(0), lc.nn.softmax_last_dim(x)])
    for n in (5, 6, 17, 300):
        e, s, sm = prog.run(x=np.zeros((0, n), np.float32))
        assert e.shape == (0, n) and sm.shape == (0, n)
        np.testing.assert_array_equal(s, np.zeros((1, n), np.float32))
        assert prog._last.plan.native is not None


def test_the_program_module_is_linked_once_per_matmul_form_not_per_binding(monkeypatch):
    prog = _mixed_program()
    prog.run(**_feeds(5))
    prog.run(**_feeds(5))             # the plan's second run builds its native program
    links = []
    orig = jit.link_ir
    monkeypatch.setattr(jit, "link_ir", lambda *a, **k: links.append(a[1]) or orig(*a, **k))
    kernels = lc.cache_info()["kernels"]
    for n in (6, 7, 9, 31, 33, 100, 257):
        prog.run(**_feeds(n))
        native = prog._last.plan.native
        assert native, f"a new binding (n={n}) did not run natively at its first run"
    # one program module per matmul form the bindings meet (k = n past the small-m kernel's
    # regime turns its call into a BLAS / tiled step), not one per binding; no kernel compiled
    programs = {id(inst.plan.native.program) for inst in prog._bound.values()}
    # (small-m, tiled and BLAS: each its own matmul form; earlier tests may have linked them)
    assert len(links) <= 3 and len(programs) <= 3, links
    assert lc.cache_info()["kernels"] == kernels


def test_a_one_shot_eager_realize_does_not_link_a_program_module(monkeypatch):
    from lazycandle import caches, compiler
    monkeypatch.setattr(compiler, "_plans", caches.LRU(64))
    monkeypatch.setattr(compiler, "_bound", caches.LRU(64))
    links = []
    orig = jit.link_ir
    monkeypatch.setattr(jit, "link_ir", lambda *a, **k: links.append(a[1]) or orig(*a, **k))
    a = lc.tensor(np.linspace(-1, 1, 37, dtype=np.float32))
    np.testing.assert_allclose(((a * 3.0).sin() + 1.0).numpy(), np.sin(a.numpy() * 3) + 1, rtol=1e-6)
    assert links == []


def test_bindings_share_one_arena_layout_that_never_overlaps_live_buffers():
    prog = _mixed_program()
    for n in (5, 6):
        prog.run(**_feeds(n))
    plan = prog._last.plan.plan
    slot_of, _ = arena.slots(plan)
    spans = {j: (a, e) for j, a, e in arena.lifetimes(plan)}
    for n in (2, 17, 1000):
        binding = prog._traced.bind({"n": n}).plan.binding
        where, top = arena.layout(plan, binding.numels)
        items = [(where[j], where[j] + binding.numels[j] * plan.dtypes[j].numpy.itemsize, *spans[j]) for j in where]
        for a in items:
            assert a[1] <= top
            for b in items:
                if a is not b and not (a[3] < b[2] or b[3] < a[2]):
                    assert a[1] <= b[0] or b[1] <= a[0], (n, a, b)


@pytest.mark.parametrize("n", [3, 7, 40])
def test_bad_ids_raise_index_out_of_bounds_from_native_index_kernels_at_new_sizes(n, monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    t = lc.placeholder("t", ("n", 8), lc.f32)
    ids = lc.placeholder("ids", (3,), lc.i64)
    prog = lc.compile([(t * 2.0).index_select(ids, 0).exp()])
    tv = np.arange(n * 8, dtype=np.float32).reshape(n, 8) / (n * 8)
    good = np.array([n - 1, 0, n // 2], np.int64)
    np.testing.assert_allclose(prog.run(t=tv, ids=good)[0], np.exp(tv[good] * 2), rtol=1e-6)
    native = prog._last.plan.native
    assert native and any(c.status_at is not None for cs in native.call_steps for c in cs)
    for bad in ([1, n, 0], [-1, 0, 0]):
        with pytest.raises(lc.IndexOutOfBounds, match="index_select"):
            prog.run(t=tv, ids=np.array(bad, np.int64))
    np.testing.assert_allclose(prog.run(t=tv, ids=good)[0], np.exp(tv[good] * 2), rtol=1e-6)


def test_generated_plan_binder_gives_the_recipe_walks_binding():
    prog = _mixed_program()
    for n in (5, 6):
        prog.run(**_feeds(n))
    plan = prog._last.plan.plan
    for n in (2, 17, 1000):
        pb = prog._traced.binders[0]
        dims, layout = pb.fn({"n": n})[:2]
        _, q = pb.binder.fn(*dims)
        walked, generated = plan._bind_walk(q), plan.bind_values(q)
        assert generated.steps == walked.steps and generated.read_offsets == walked.read_offsets
        assert generated.numels == walked.numels


def test_program_binder_span_check_agrees_with_the_elements_a_view_reads():
    from lazycandle.symbolic_plan import _span_check
    rng = np.random.default_rng(3)
    for _ in range(300):
        rank = int(rng.integers(1, 4))
        shape = tuple(int(x) for x in rng.integers(0, 4, rank))
        strides = tuple(int(x) for x in rng.integers(-6, 7, rank))
        offset, numel = int(rng.integers(0, 30)), int(rng.integers(1, 40))
        reads = [offset + sum(i * s for i, s in zip(idx, strides)) for idx in np.ndindex(*shape)]
        inside = all(0 <= r < numel for r in reads)
        check = _span_check(shape, strides, offset, numel, {})
        assert (check == "True" or eval(check)) == inside, (shape, strides, offset, numel, check)


def test_concurrent_runs_at_different_bindings_share_the_program_safely(monkeypatch):
    prog = _mixed_program()
    sizes = [3, 17, 40, 200, 1000]
    want = {n: _run(prog, _feeds(n), "python", monkeypatch) for n in sizes}
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")

    def work(seed):
        for r in range(12):
            n = sizes[(seed + r) % len(sizes)]
            for a, b in zip(prog.run(**_feeds(n)), want[n]):
                assert np.array_equal(a, b), n
    with lc.num_threads(2):
        errors = run_in_threads(work, 4)
    assert errors == []
