"""One KernelSpec interface (issue 9 item 3): every kernel kind's spec has the same protocol
(key, build, compiled, lanes, extent, cost, describe), builds through the codegen registry
(ir never imports codegen), and the runtime never rewrites what the scheduler produced."""
import dataclasses
import inspect
import pathlib
import re

import lazycandle as lc
from lazycandle.codegen import elementwise, gemm, gemm_copy, index, reduce, registry, scan, sort
from lazycandle.ir.kernels import KernelSpec

PKG = pathlib.Path(lc.__file__).parent


def _spec_classes():
    mods = (elementwise, reduce, index, sort, scan, gemm, gemm_copy)
    return {c for m in mods for c in vars(m).values()
            if inspect.isclass(c) and dataclasses.is_dataclass(c) and c.__name__.endswith("Spec")}


def test_every_spec_class_is_a_kernel_spec_with_registered_codegen():
    classes = _spec_classes()
    assert len(classes) >= 10
    for c in classes:
        assert issubclass(c, KernelSpec), c
        assert c in registry.registered(), c
        for name in ("key", "build", "compiled", "lanes", "extent", "cost", "describe"):
            assert hasattr(c, name), (c, name)


def _plan_specs(outs):
    plan = lc.compile(outs)._fixed.plan
    fused = [k.spec for k in plan.kernels if k.spec is not None]
    steps = [s.spec for k, s in zip(plan.kernels, plan.steps) if k.spec is None and getattr(s, "spec", None)]
    return plan, fused + steps


def test_fused_and_node_step_specs_follow_the_protocol():
    a = lc.placeholder("a", (5, 33))
    ids = lc.placeholder("ids", (3,), lc.i64)
    outs = [(a * 2.0).exp(), a.sum(-1), a.index_select(ids, 0), a.cumsum(1)]
    plan, specs = _plan_specs(outs)
    kinds = {type(s).__name__ for s in specs}
    assert {"EwSpec", "RedSpec", "IndexSpec", "ScanSpec"} <= kinds, kinds
    for spec, binding in zip([k.spec for k in plan.kernels if k.spec is not None],
                             [b for k, b in zip(plan.kernels, plan.binding.steps) if k.spec is not None]):
        sizes = tuple(int(x) for x in binding[0])
        assert spec.extent(sizes) == binding[1] > 0
        assert spec.cost(sizes) > 0
    for spec in specs:
        assert hash(spec.key) == hash(spec.key)
        text = spec.build()
        assert "define" in text, type(spec)
        assert callable(spec.compiled()) and spec.lanes() >= 1
        assert isinstance(spec.describe(), str) and "\n" not in spec.describe()


def test_an_empty_kernel_has_extent_zero():
    a = lc.placeholder("a", (0, 7))
    plan, _ = _plan_specs([(a + 1.0).exp(), a.sum(-1)])
    assert all(b[1] == 0 for k, b in zip(plan.kernels, plan.binding.steps) if k.spec is not None)


def test_ir_never_imports_codegen_and_the_runtime_never_rewrites_kernels():
    for path in (PKG / "ir").glob("*.py"):
        src = path.read_text()
        assert not re.search(r"^\s*(from\s+\.\.codegen|from\s+\.\.\s+import\s+codegen|import\s+lazycandle\.codegen)",
                             src, re.M), path
    for path in (PKG / "runtime").glob("*.py"):
        src = path.read_text()
        assert not re.search(r"\b(kernel|k)\.(inputs|outputs|backend|spec|sizes|nodes|loop_shape)\s*=[^=]", src), path


def test_extent_and_cost_sources_equal_extent_and_cost():
    """A spec's extent_source / cost_source (what generated binders inline) evaluate to its
    extent / cost at every size, empty dims included."""
    import itertools
    a, b = lc.placeholder("a", (5, 33)), lc.placeholder("b", (33, 5))
    x = lc.placeholder("x", (4, 6, 7))
    _, specs = _plan_specs([(a * 2 + 1).exp(), a.T + b, lc.nn.softmax_last_dim(x), (x - x.mean(-1, keepdim=True))])
    checked = 0
    for spec in specs:
        n = 6
        tokens = [f"t{i}" for i in range(n)]
        extent, cost = spec.extent_source(tokens), spec.cost_source(tokens)
        for sizes in itertools.product((0, 1, 3, 17), repeat=3):
            sizes = sizes + (1, 2, 5)
            env = dict(zip(tokens, sizes))
            if extent is not None:
                assert eval(extent, {}, env) == spec.extent(sizes), (spec.describe(), sizes)
            if cost is not None:
                assert eval(cost, {}, env) == spec.cost(sizes), (spec.describe(), sizes)
        checked += extent is not None
    assert checked >= 2
