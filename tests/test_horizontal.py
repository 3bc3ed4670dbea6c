"""Horizontal fusion (ir/horizontal.py, codegen/horizontal.py): an optimizer update over many
parameters of odd sizes is one kernel per (dtype, structure), equal to the per-parameter
kernels bit for bit and to NumPy's formula, on the native program and the per-kernel path,
serial and split over threads, with fixed and named sizes."""
import numpy as np
import pytest

import lazycandle as lc
from lazycandle.ir import horizontal as H
from lazycandle.ir.horizontal import HSpec

SIZES = (0, 1, 17, 1000, 4097)
LR, B1, B2, EPS, WD = 0.01, 0.9, 0.999, 1e-8, 0.1


def _feeds(dtypes, seed=0, sizes=SIZES):
    rng = np.random.default_rng(seed)
    feeds = {}
    for i, (n, dt) in enumerate((n, dt) for dt in dtypes for n in sizes):
        feeds[f"p{i}"] = rng.standard_normal(n).astype(dt)
        feeds[f"g{i}"] = rng.standard_normal(n).astype(dt)
        feeds[f"m{i}"] = (rng.standard_normal(n) * 0.1).astype(dt)
        feeds[f"v{i}"] = rng.random(n).astype(dt)
    feeds["b1t"], feeds["b2t"] = np.array(B1 ** 3), np.array(B2 ** 3)
    return feeds


def _adamw_program(dtypes, named=False, sizes=SIZES):
    """lc.compile of AdamW.update over placeholders: params, grads and moments of each size in
    each dtype (named: every size above 1 a named dim), then beta1^t and beta2^t."""
    opt = lc.optim.AdamW(lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD)
    ph = {k: [] for k in "pgmv"}
    for i, (n, dt) in enumerate((n, dt) for dt in dtypes for n in sizes):
        shape = (f"n{n}",) if named and n > 1 else (n,)
        for k in "pgmv":
            ph[k].append(lc.placeholder(f"{k}{i}", shape, dt))
    state = tuple(ph["m"]) + tuple(ph["v"]) + (lc.placeholder("b1t", (), "f64"), lc.placeholder("b2t", (), "f64"))
    new_p, new_s = opt.update(ph["p"], ph["g"], state)
    return lc.compile(list(new_p) + list(new_s[:-2]))


def _numpy_adamw(feeds, count):
    """The update in float64 from the same inputs: (params, m, v)."""
    b1t, b2t = feeds["b1t"] * B1, feeds["b2t"] * B2
    out_p, out_m, out_v = [], [], []
    for i in range(count):
        p, g, m, v = (feeds[f"{k}{i}"].astype(np.float64) for k in "pgmv")
        m = m * B1 + g * (1 - B1)
        v = v * B2 + g * g * (1 - B2)
        out_p.append(p * (1 - LR * WD) - m * (LR / (1 - b1t)) / (np.sqrt(v / (1 - b2t)) + EPS))
        out_m.append(m)
        out_v.append(v)
    return out_p + out_m + out_v


def _run(prog, feeds, monkeypatch, mode, threads):
    monkeypatch.setenv("LAZYCANDLE_EXEC", mode)
    with lc.num_threads(threads):
        return prog.run(**feeds)


def _plan_kernels(prog):
    inst = prog._fixed if prog._fixed is not None else prog._last
    return inst.plan.kernels


@pytest.fixture
def unfused(monkeypatch):
    """Within the test: horizontal fusion off (and no plan compiled with it on reused)."""
    def switch(on):
        lc.clear_caches()
        monkeypatch.setattr(H, "ENABLED", on)
    yield switch
    lc.clear_caches()


@pytest.mark.parametrize("mode", ["native", "python"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("named", [False, True])
def test_adamw_update_over_odd_sizes_matches_numpy_and_the_unfused_update(mode, threads, named, monkeypatch,
                                                                          unfused):
    dtypes = (np.float32, np.float64)
    feeds = _feeds(dtypes)
    count = len(SIZES) * len(dtypes)
    prog = _adamw_program(dtypes, named)
    got = _run(prog, feeds, monkeypatch, mode, threads)
    got = _run(prog, feeds, monkeypatch, mode, threads)        # (the native program builds at the 2nd run)
    updates = [k for k in _plan_kernels(prog) if isinstance(k.spec, HSpec)]
    assert sorted(k.sizes[0] for k in updates) == [len(SIZES)] * 2      # one kernel per dtype
    assert all(len(k.outputs) == 3 * len(SIZES) for k in updates)
    for i, (g, want) in enumerate(zip(got, _numpy_adamw(feeds, count))):
        tol = 1e-6 if g.dtype == np.float32 else 1e-13
        np.testing.assert_allclose(g, want, rtol=tol, atol=tol, err_msg=f"output {i}")
    unfused(False)
    ref_prog = _adamw_program(dtypes, named)
    ref = _run(ref_prog, feeds, monkeypatch, mode, threads)
    ref = _run(ref_prog, feeds, monkeypatch, mode, threads)
    assert not any(isinstance(k.spec, HSpec) for k in _plan_kernels(ref_prog))
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.tobytes() == r.tobytes(), f"output {i} differs from the per-parameter kernel"


def test_named_sizes_bind_by_formula(monkeypatch):
    """Segment lengths that are named sizes: other lengths bind the first plan's horizontal
    kernel by the size class's formulas (one binder, then the direct path), no new schedule."""
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    names = ("n3", "n40", "n700")
    prog = _adamw_program((np.float32,), named=True, sizes=(3, 40, 700))
    for i, sizes in enumerate(((3, 40, 700), (5, 33, 1029), (4, 64, 9), (2, 2, 2))):
        feeds = _feeds((np.float32,), seed=sum(sizes), sizes=sizes)
        for _ in range(2):
            got = prog.run(**feeds)
        for g, want in zip(got, _numpy_adamw(feeds, 3)):
            np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6)
        assert sum(isinstance(k.spec, HSpec) for k in _plan_kernels(prog)) == 1
        assert len(prog._traced.binders) == 1
        if i:
            assert any(r.bound_sizes() == dict(zip(names, sizes)) for r in prog._traced.direct), sizes


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_update_is_one_kernel_per_dtype(momentum):
    """Not an AdamW special case: SGD's update (with and without momentum) fuses the same way."""
    rng = np.random.default_rng(1)
    shapes = [(3, 5), (17,), (1,), (0, 4), (33, 2)]
    ps = [lc.placeholder(f"p{i}", s) for i, s in enumerate(shapes)]
    gs = [lc.placeholder(f"g{i}", s) for i, s in enumerate(shapes)]
    opt = lc.optim.SGD([], lr=0.5, momentum=momentum)
    state = tuple(lc.placeholder(f"b{i}", s) for i, s in enumerate(shapes)) if momentum else ()
    new_p, new_s = opt.update(ps, gs, state)
    prog = lc.compile(list(new_p) + list(new_s))
    feeds = {f"{k}{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes) for k in
             ("pgb" if momentum else "pg")}
    got = prog.run(**feeds)
    for i in range(len(shapes)):
        b = feeds[f"b{i}"] * np.float32(momentum) + feeds[f"g{i}"] if momentum else feeds[f"g{i}"]
        np.testing.assert_allclose(got[i], feeds[f"p{i}"] - b * np.float32(0.5), rtol=1e-6, atol=1e-6)
    kernels = _plan_kernels(prog)
    assert sum(isinstance(k.spec, HSpec) for k in kernels) == 1
    assert all(k.sizes == (1,) for k in kernels if not isinstance(k.spec, HSpec))     # lr cast to f32


def test_dependent_kernels_of_one_structure_stay_apart():
    """Kernels of one structure where one feeds another (through a reduction) are not merged:
    they are at different ALAP levels, so the schedule stays a DAG; the independent ones are."""
    a, b = lc.placeholder("a", (50,)), lc.placeholder("b", (70,))
    x = a * 3.0 + 1.0
    y = x.reshape((5, 10)).sum(1) * 3.0 + 1.0       # x -> sum -> y: y's kernel is x's structure
    z = b * 3.0 + 1.0
    prog = lc.compile([x, y, z])
    av, bv = np.arange(50, dtype=np.float32), np.arange(70, dtype=np.float32)
    got = prog.run(a=av, b=bv)
    np.testing.assert_allclose(got[0], av * 3 + 1)
    np.testing.assert_allclose(got[1], (av * 3 + 1).reshape(5, 10).sum(1) * 3 + 1)
    np.testing.assert_allclose(got[2], bv * 3 + 1)
    assert [k.sizes for k in _plan_kernels(prog) if isinstance(k.spec, HSpec)] == [(2, 5, 70)]


def test_eager_adamw_step_over_many_parameters_matches_the_unfused_step(unfused):
    """The eager optimizer (one graph for all parameters): bitwise equal to per-parameter kernels."""
    def steps():
        rng = np.random.default_rng(2)
        shapes = [(0,), (1,), (17,), (1000,), (4097,), (4, 3)]
        vs = [lc.Var(rng.standard_normal(s).astype(dt)) for s in shapes for dt in (np.float32, np.float64)]
        opt = lc.optim.AdamW(vs, lr=0.01)
        for _ in range(3):
            opt.backward_step(sum((v.sqr().sum_all().to_dtype("f64") for v in vs[1:]), vs[0].sum_all().to_dtype("f64")))
        return [v.numpy() for v in vs]
    got = steps()
    unfused(False)
    for g, r in zip(got, steps()):
        assert g.tobytes() == r.tobytes()


FMA = (("mul", None, "f32", "f32", (("i", 0), ("s", 0, "f32"))), ("add", None, "f32", "f32", (("v", 0), ("i", 1))))


@pytest.mark.parametrize("min_bytes", [0, 1 << 40], ids=["streamed", "plain"])
def test_segment_kernel_over_any_split_and_alignment(min_bytes, monkeypatch):
    """The kernel called directly: segments of 0, 5, 1000, 37 and 1 elements, a broadcast
    input, a scalar per segment, outputs off the line, every unit range a pool could hand out
    (whole, cut inside and between segments), streaming stores on (threshold 0) and off."""
    import ctypes
    from lazycandle.codegen import horizontal as CH, jit
    from lazycandle.codegen.loops import KERNEL_FN
    from lazycandle.ir.kernels import EwSpec
    monkeypatch.setattr(CH, "streaming_min_bytes", lambda row=False: min_bytes)
    spec = HSpec(EwSpec(1, (("f32", (1,)), ("f32", (0,))), FMA, ((1, "f32"),), ("f32",), None))
    text = CH.build(spec, "hew")
    assert "!nontemporal" in text and "sfence" in text    # chosen per segment at run time
    fn = KERNEL_FN(jit.compile_ir(text, ["hew"], f"hstream{min_bytes}").address("hew"))
    lens = [0, 5, 1000, 37, 1]
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(n).astype(np.float32) for n in lens]
    cs = [np.array([rng.standard_normal()], np.float32) for _ in lens]
    scales = np.array([float(np.float32(s)) for s in rng.standard_normal(len(lens))])
    total = sum(lens)
    for cuts in ([], [16], [3, 5, 6, 500, 1005, 1040], list(range(0, total, 64))):
        outs = []
        for i, n in enumerate(lens):
            raw = np.zeros(4 * n + 128, np.uint8)
            off = (-raw.ctypes.data) % 64 + 4 * (i % 2)       # line-aligned (streamable) or not
            outs.append(raw[off:off + 4 * n].view(np.float32))
        bufs = (ctypes.c_void_p * (3 * len(lens)))(*[a.ctypes.data for x, c in zip(xs, cs) for a in (x, c)],
                                                   *[o.ctypes.data for o in outs])
        sizes = (ctypes.c_int64 * (1 + len(lens)))(len(lens), *lens)
        scal = (ctypes.c_double * len(lens))(*scales)
        bounds = [0] + sorted(set(cuts) - {0}) + [total]
        for lo, hi in zip(bounds, bounds[1:]):
            fn(ctypes.addressof(bufs), ctypes.addressof(sizes), ctypes.addressof(scal), lo, hi)
        for x, c, s, o in zip(xs, cs, scales, outs):
            np.testing.assert_allclose(o, x * np.float32(s) + c[0], rtol=1e-6, atol=1e-7)   # (may contract to FMA)


def test_schedule_dump_and_profile_name_the_segments():
    a, b = lc.placeholder("a", (5,)), lc.placeholder("b", (7,))
    prog = lc.compile([a * 2.0 + 1.0, b * 2.0 + 1.0])
    feeds = {"a": np.ones(5, np.float32), "b": np.ones(7, np.float32)}
    prog.run(**feeds)
    assert "horizontal: 2 segments of one kernel" in prog.dump("schedule")
    assert "2 x (mul+add)" in prog.profile(runs=1, **feeds)
