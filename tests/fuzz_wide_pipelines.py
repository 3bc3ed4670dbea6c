"""Pipelines for tests/test_fuzz_wide.py: the ops of fuzz_wide_ops chained in one graph
(conv -> activation -> pool -> flatten -> sort / cumsum / topk -> slice_set / index_add), with
intermediate values realized as extra outputs, so the scheduler groups them together and
in-place updates meet values that are still read.  f32 / f64 against NumPy in f64; every stage
is Lipschitz with a small constant, so the error stays within a fixed fraction of 1 + |ref|.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import lazycandle as lc
from fuzz_wide_ops import np_conv2d, np_pool

# stage name -> (lazycandle on (b, f) rows, NumPy on (b, f) rows); each keeps the shape (b, f)
ROW_STAGES = {
    "sort": (lambda x, e: x.sort_last_dim()[0], lambda x, e: np.sort(x, -1)),
    "sort_desc": (lambda x, e: x.sort_last_dim(False)[0], lambda x, e: -np.sort(-x, -1)),
    "cumsum": (lambda x, e: x.cumsum(1) * 0.25, lambda x, e: np.cumsum(x, 1) * 0.25),
    "topk_pad": (lambda x, e: lc.cat([x.topk(1)[0], x.narrow(1, 1, x.shape[1] - 1)], 1),
                 lambda x, e: np.concatenate([x.max(1, keepdims=True), x[:, 1:]], 1)),
    "slice_set": (lambda x, e: x.slice_set(x.narrow(1, 0, 1) * 2.0, 1, x.shape[1] - 1),
                  lambda x, e: np.concatenate([x[:, :-1], x[:, :1] * 2.0], 1)),
    "index_add": (lambda x, e: x.index_add(e["ids"], x * 0.5, 1),
                  lambda x, e: _np_index_add(x, e["ids_np"], x * 0.5)),
    "softmax": (lambda x, e: lc.nn.softmax(x, -1), lambda x, e: _np_softmax(x)),
    "tanh": (lambda x, e: x.tanh(), lambda x, e: np.tanh(x)),
}


def _np_index_add(x, ids, src):
    out = x.copy()
    np.add.at(out.T, ids, src.T)
    return out


def _np_softmax(x):
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


@st.composite
def pipelines(draw):
    return dict(pool=draw(st.sampled_from(["max", "avg", None])), act=draw(st.sampled_from(["relu", "tanh", "id"])),
                rows=draw(st.lists(st.sampled_from(sorted(ROW_STAGES)), min_size=1, max_size=4)),
                extra=draw(st.lists(st.integers(0, 5), max_size=2)), dt=draw(st.sampled_from([lc.f32, lc.f64])),
                batch=draw(st.integers(1, 3)), hw=(draw(st.integers(4, 7)), draw(st.integers(4, 7))),
                stride=draw(st.integers(1, 2)), mode=draw(st.sampled_from(["eager", "compiled", "together"])),
                seed=draw(st.integers(0, 2**32 - 1)))


ACTS = {"relu": (lambda t: t.relu(), lambda a: np.maximum(a, 0)), "tanh": (lambda t: t.tanh(), np.tanh),
        "id": (lambda t: t, lambda a: a)}


def _stages(case, x, k, e, lib):
    """Every intermediate value of the pipeline, in `lib` ("lc" or "np")."""
    i = 0 if lib == "lc" else 1
    vals = []
    if lib == "lc":
        y = x.conv2d(k, padding=1, stride=case["stride"])
    else:
        y = np_conv2d(x, k, (1, 1), (case["stride"],) * 2, (1, 1), 1)
    vals.append(y * 0.2)
    vals.append(ACTS[case["act"]][i](vals[-1]))
    if case["pool"]:
        vals.append(vals[-1].max_pool2d(2) if lib == "lc" and case["pool"] == "max" else
                    vals[-1].avg_pool2d(2) if lib == "lc" else np_pool(vals[-1], (2, 2), (2, 2), case["pool"]))
    b = vals[-1].shape[0]
    vals.append(vals[-1].reshape((b, -1)))
    for s in case["rows"]:
        vals.append(ROW_STAGES[s][i](vals[-1], e))
    return vals


def _width(case):
    """Row width after the conv (padding 1, 3x3 kernel, 3 channels) and the 2x2 pool."""
    oh, ow = ((d - 1) // case["stride"] + 1 for d in case["hw"])
    if case["pool"]:
        oh, ow = oh // 2, ow // 2
    return 3 * oh * ow


def run_pipeline(case):
    rng = np.random.default_rng(case["seed"])
    dt = case["dt"]
    xa = rng.uniform(-1, 1, (case["batch"], 2) + case["hw"]).astype(dt.numpy)
    ka = rng.uniform(-1, 1, (3, 2, 3, 3)).astype(dt.numpy)
    width = _width(case)
    ids = rng.integers(0, width, width)
    refs = _stages(case, xa.astype(np.float64), ka.astype(np.float64), {"ids_np": ids}, "np")
    picks = sorted({len(refs) - 1} | {j % len(refs) for j in case["extra"]})
    if case["mode"] == "compiled":
        env = {"ids": lc.placeholder("ids", (width,), lc.i64)}
        outs = _stages(case, lc.placeholder("x", xa.shape, dt), lc.placeholder("k", ka.shape, dt), env, "lc")
        prog = lc.compile([outs[j] for j in picks])
        used = {n for n, _, _ in prog.inputs}
        got = prog.run(**{n: v for n, v in {"x": xa, "k": ka, "ids": ids}.items() if n in used})
    else:
        outs = _stages(case, lc.tensor(xa), lc.tensor(ka), {"ids": lc.tensor(ids)}, "lc")
        if case["mode"] == "together":
            lc.realize(*[outs[j] for j in picks])
        got = [outs[j].numpy() for j in picks]
    tol = 1e-10 if dt is lc.f64 else 3e-4
    for j, g in zip(picks, got):
        ref = refs[j]
        what = f"pipeline {case} stage {j}"
        assert g.shape == ref.shape and g.dtype == dt.numpy, f"{what}: {g.shape} {g.dtype} vs {ref.shape}"
        bad = ~(np.abs(g - ref) <= tol * (1 + np.abs(ref)))
        assert not bad.any(), f"{what}: got {g[bad][:4]} expected {ref[bad][:4]}"
