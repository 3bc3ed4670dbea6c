"""The benchmark cases: the seed's cpu_bench table and the fusion cases of issue 5.

A `Case` says how to make its inputs (NumPy arrays), how lazycandle computes it (a function of
`lc` and realized tensors that builds the graph afresh), the NumPy baseline (`ref`, written
against an array namespace `xp` so that jax.numpy can run the same code), optional numexpr and
torch versions, its work (flops and compulsory bytes) and the tolerance of the correctness check.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

MODES = ("full", "quick", "tiny")
GELU_C = 0.7978845608
LN_EPS = 1e-5


@dataclass(frozen=True)
class Case:
    """One benchmark case.  `sizes[mode]` is the size parameter handed to `make`, `title` and
    `work`."""
    name: str
    group: str                      # "seed" (the seed's cpu_bench table) or "fusion"
    title: Callable                 # size -> display text
    sizes: dict                     # mode -> size
    make: Callable                  # (rng, size) -> {name: np.ndarray}
    lc: Callable                    # (lc, **tensors) -> lc.Tensor (lazy)
    ref: Callable                   # (xp, **arrays) -> array: NumPy's baseline, also run by jax
    work: Callable                  # size -> (flops, bytes)
    metric: str = "bytes"           # "flops" (GFLOP/s vs FMA peak) or "bytes" (GB/s vs bandwidth)
    rtol: float = 1e-5              # check: see runner.check (bound rtol*|exact| + atol*rms(exact)
    atol: float = 1e-6              #   + 2*|NumPy - exact|, exact = the NumPy code run in f64)
    numexpr: Optional[Callable] = None      # (ne, **arrays) -> array
    torch: Optional[Callable] = None        # (torch, **tensors) -> tensor; default: ref(torch, ...)
    jax: Optional[Callable] = None          # (jax, **arrays) -> array; default: ref(jax.numpy, ...)
    note: str = ""
    seed_label: str = ""            # row label in the seed's table


# ---- inputs ------------------------------------------------------------------------------
def _normal(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(dtype)


def _vec(names, scale=1.0):
    """Inputs: one f32 vector of `size` elements per name."""
    return lambda rng, n: {k: _normal(rng, (n,), scale=scale) for k in names}


def _square(names, dtype=np.float32):
    return lambda rng, n: {k: _normal(rng, (n, n), dtype) for k in names}


# ---- work ---------------------------------------------------------------------------------
def _ew_work(n_in, flops_per_elem):
    """Elementwise on f32 vectors: compulsory traffic = inputs read once + output written once."""
    return lambda n: (flops_per_elem * n, (n_in + 1) * 4 * n)


def _mm_work(itemsize):
    return lambda n: (2 * n ** 3, 3 * itemsize * n * n)


# ---- the seed's cpu_bench table -------------------------------------------------------
def _matmul_f32(n_full, quick, tiny):
    return Case(
        name=f"matmul_f32_{n_full}", group="seed", title=lambda n: f"matmul f32 {n}x{n}",
        sizes={"full": n_full, "quick": quick, "tiny": tiny},
        make=_square("ab"), lc=lambda lc, a, b: a.matmul(b), ref=lambda xp, a, b: a @ b,
        work=_mm_work(4), metric="flops", rtol=1e-4, atol=1e-4,
        seed_label=f"f32 matmul {n_full}")


def _lowp_ref(xp, a, b):
    """NumPy has no fast f16/bf16 matmul: the user's way is an f32 product, rounded back."""
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(a.dtype)


def _matmul_lowp(dtname, quick, tiny, n_full=1024):
    import ml_dtypes
    npdt = np.float16 if dtname == "f16" else ml_dtypes.bfloat16
    tol = 2e-3 if dtname == "f16" else 1.6e-2
    return Case(
        name=f"matmul_{dtname}_{n_full}", group="seed", title=lambda n: f"matmul {dtname} {n}x{n}",
        sizes={"full": n_full, "quick": quick, "tiny": tiny},
        make=_square("ab", npdt), lc=lambda lc, a, b: a.matmul(b), ref=_lowp_ref,
        work=_mm_work(2), metric="flops", rtol=tol, atol=tol,
        torch=lambda torch, a, b: a @ b,
        note=f"NumPy/jax: {dtname} inputs, f32 product, rounded to {dtname}; torch: native {dtname}",
        seed_label=f"{dtname} matmul {n_full}")


N4M = 4_194_304
_EW_SIZES = {"full": N4M, "quick": 1_048_576, "tiny": 1003}

SEED_CASES = [
    _matmul_f32(256, 256, 16),
    _matmul_f32(1024, 512, 24),
    _matmul_f32(2048, 1024, 32),
    _matmul_lowp("f16", 512, 16),
    _matmul_lowp("bf16", 512, 16),
    _matmul_lowp("bf16", 1024, 32, 2048),       # issue 43: AMX where the host has it
    Case(name="exp", group="seed", title=lambda n: f"exp, {n:,} f32", sizes=_EW_SIZES,
         make=_vec("a"), lc=lambda lc, a: a.exp(), ref=lambda xp, a: xp.exp(a),
         work=_ew_work(1, 1), numexpr=lambda ne, a: ne.evaluate("exp(a)"),
         seed_label="exp, 4,194,304 f32"),
    Case(name="add", group="seed", title=lambda n: f"add, {n:,} f32", sizes=_EW_SIZES,
         make=_vec("ab"), lc=lambda lc, a, b: a + b, ref=lambda xp, a, b: a + b,
         work=_ew_work(2, 1), numexpr=lambda ne, a, b: ne.evaluate("a + b"),
         seed_label="add, 4,194,304 f32"),
    Case(name="mul", group="seed", title=lambda n: f"mul, {n:,} f32", sizes=_EW_SIZES,
         make=_vec("ab"), lc=lambda lc, a, b: a * b, ref=lambda xp, a, b: a * b,
         work=_ew_work(2, 1), numexpr=lambda ne, a, b: ne.evaluate("a * b"),
         seed_label="mul, 4,194,304 f32"),
]


# ---- the fusion cases -------------------------------------------------------------------
def _gelu_ref(xp, x):
    return 0.5 * x * (1 + xp.tanh(GELU_C * (x + 0.044715 * x * x * x)))


def _gelu_numexpr(ne, x):
    """numexpr computes in float64 when given float64 constants: pass them as float32."""
    consts = {k: np.float32(v) for k, v in (("h", 0.5), ("k", GELU_C), ("c", 0.044715))}
    return ne.evaluate("h*x*(1+tanh(k*(x+c*x*x*x)))", local_dict={"x": x, **consts})


def _softmax_ref(xp, x):
    e = xp.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm_ref(xp, x, g, b):
    xc = x - x.mean(-1, keepdims=True)
    var = (xc * xc).mean(-1, keepdims=True)
    return xc / xp.sqrt(var + LN_EPS) * g + b


def _log_softmax_ref(xp, x):
    s = x - x.max(-1, keepdims=True)
    return s - xp.log(xp.exp(s).sum(-1, keepdims=True))


def _rms_norm_ref(xp, x, g):
    return x / xp.sqrt((x * x).mean(-1, keepdims=True) + LN_EPS) * g


def _rms_norm_make(rng, size):
    r, c = size
    return {"x": _normal(rng, (r, c), scale=2.0), "g": _normal(rng, (c,))}


ATTN_SCALE = 0.125       # 1/sqrt(64), a GPT-2 head


def _attn_make(rng, size):
    """Attention scores (heads, L, L) and the causal mask (True above the diagonal = masked)."""
    h, n = size
    return {"x": _normal(rng, (h, n, n), scale=8.0), "m": np.triu(np.ones((n, n), bool), 1)}


def _attn_ref(xp, x, m):
    s = xp.where(m != 0, -np.inf, x * ATTN_SCALE)
    e = xp.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _attn_work(size):
    h, n = size
    return (h * n * n, 4 * 2 * h * n * n + n * n)


def _layer_norm_make(rng, size):
    r, c = size
    return {"x": _normal(rng, (r, c), scale=2.0) + np.float32(0.5),
            "g": _normal(rng, (c,)), "b": _normal(rng, (c,))}


def _rows_work(passes_out):
    """(rows, cols) f32 input read once, output of `passes_out` x (rows, cols) or (rows,)."""
    def work(size):
        r, c = size
        out = r * c if passes_out else r
        return (r * c, 4 * (r * c + out))
    return work


_ROWS = {"full": (4096, 1024), "quick": (1024, 1024), "tiny": (7, 33)}
_ATTN = {"full": (16, 512), "quick": (8, 256), "tiny": (2, 9)}
_T2D = {"full": 2048, "quick": 1024, "tiny": 33}
_BMM = {"full": (16, 256), "quick": (8, 128), "tiny": (3, 8)}


def _bmm_make(bcast_lhs):
    def make(rng, size):
        b, n = size
        return {"a": _normal(rng, (n, n) if bcast_lhs else (b, n, n)), "b": _normal(rng, (b, n, n))}
    return make


def _bmm_work(size):
    b, n = size
    return (2 * b * n ** 3, 4 * (3 * b * n * n))


FUSION_CASES = [
    Case(name="exp_fma", group="fusion", title=lambda n: f"exp(a*b+c), {n:,} f32", sizes=_EW_SIZES,
         make=_vec("abc", 1.5), lc=lambda lc, a, b, c: (a * b + c).exp(),
         ref=lambda xp, a, b, c: xp.exp(a * b + c), work=_ew_work(3, 3), rtol=2e-5,
         numexpr=lambda ne, a, b, c: ne.evaluate("exp(a*b+c)")),
    Case(name="gelu", group="fusion", title=lambda n: f"gelu (tanh), {n:,} f32", sizes=_EW_SIZES,
         make=_vec("x", 2.0), lc=lambda lc, x: x.gelu(), ref=_gelu_ref, work=_ew_work(1, 9),
         numexpr=_gelu_numexpr,
         torch=lambda torch, x: torch.nn.functional.gelu(x, approximate="tanh"),
         jax=lambda jax, x: jax.nn.gelu(x, approximate=True),
         note="NumPy: 0.5*x*(1+tanh(0.7978845608*(x+0.044715*x^3))); jax: jax.nn.gelu(approximate=True)"),
    Case(name="transpose_add", group="fusion", title=lambda n: f"(A.T+B)*2, {n}x{n} f32", sizes=_T2D,
         make=_square("AB"), lc=lambda lc, A, B: (A.t() + B) * 2, ref=lambda xp, A, B: (A.T + B) * 2,
         work=lambda n: (2 * n * n, 12 * n * n),
         numexpr=lambda ne, A, B: ne.evaluate("(AT + B) * 2", local_dict={"AT": A.T, "B": B})),
    Case(name="fma_chain", group="fusion", title=lambda n: f"(a*b+c)*d-a, {n:,} f32", sizes=_EW_SIZES,
         make=_vec("abcd"), lc=lambda lc, a, b, c, d: (a * b + c) * d - a,
         ref=lambda xp, a, b, c, d: (a * b + c) * d - a, work=_ew_work(4, 4),
         numexpr=lambda ne, a, b, c, d: ne.evaluate("(a*b+c)*d-a")),
    Case(name="sum_last", group="fusion", title=lambda s: f"sum(-1), {s[0]}x{s[1]} f32", sizes=_ROWS,
         make=lambda rng, s: {"x": _normal(rng, s)}, lc=lambda lc, x: x.sum(-1),
         ref=lambda xp, x: x.sum(-1), work=_rows_work(False), rtol=1e-5, atol=1e-5),
    Case(name="sum_first", group="fusion", title=lambda s: f"sum(0), {s[0]}x{s[1]} f32", sizes=_ROWS,
         make=lambda rng, s: {"x": _normal(rng, s)}, lc=lambda lc, x: x.sum(0),
         ref=lambda xp, x: x.sum(0), work=lambda s: (s[0] * s[1], 4 * (s[0] * s[1] + s[1])),
         rtol=1e-5, atol=1e-5),
    Case(name="softmax", group="fusion", title=lambda s: f"softmax(-1), {s[0]}x{s[1]} f32", sizes=_ROWS,
         make=lambda rng, s: {"x": _normal(rng, s, scale=3.0)}, lc=lambda lc, x: lc.nn.softmax_last_dim(x),
         ref=_softmax_ref, work=_rows_work(True), rtol=1e-5, atol=1e-6,
         torch=lambda torch, x: torch.softmax(x, -1), jax=lambda jax, x: jax.nn.softmax(x, axis=-1),
         note="lc.nn.softmax_last_dim; jax: jax.nn.softmax; torch: torch.softmax"),
    Case(name="layer_norm", group="fusion", title=lambda s: f"layer_norm, {s[0]}x{s[1]} f32", sizes=_ROWS,
         make=_layer_norm_make, lc=lambda lc, x, g, b: lc.nn.layer_norm(x, g, b, LN_EPS),
         ref=_layer_norm_ref, work=_rows_work(True), rtol=1e-4, atol=1e-5,
         torch=lambda torch, x, g, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b, LN_EPS),
         note="lc.nn.layer_norm, eps 1e-5; torch: F.layer_norm"),
    Case(name="log_softmax", group="fusion", title=lambda s: f"log_softmax(-1), {s[0]}x{s[1]} f32",
         sizes=_ROWS, make=lambda rng, s: {"x": _normal(rng, s, scale=3.0)},
         lc=lambda lc, x: lc.nn.log_softmax(x, -1), ref=_log_softmax_ref, work=_rows_work(True),
         rtol=1e-5, atol=1e-5,
         torch=lambda torch, x: torch.log_softmax(x, -1), jax=lambda jax, x: jax.nn.log_softmax(x, axis=-1),
         note="lc.nn.log_softmax; torch: torch.log_softmax; jax: jax.nn.log_softmax"),
    Case(name="rms_norm", group="fusion", title=lambda s: f"rms_norm, {s[0]}x{s[1]} f32", sizes=_ROWS,
         make=_rms_norm_make, lc=lambda lc, x, g: lc.nn.rms_norm(x, g, LN_EPS),
         ref=_rms_norm_ref, work=_rows_work(True), rtol=1e-4, atol=1e-5,
         torch=lambda torch, x, g: torch.nn.functional.rms_norm(x, (x.shape[-1],), g, LN_EPS),
         note="lc.nn.rms_norm, eps 1e-5; torch: F.rms_norm"),
    Case(name="attn_softmax", group="fusion",
         title=lambda s: f"causal softmax(x*{ATTN_SCALE}), {s[0]}x{s[1]}x{s[1]} f32", sizes=_ATTN,
         make=_attn_make, lc=lambda lc, x, m: lc.nn.softmax((x * ATTN_SCALE).masked_fill(m, float("-inf")), -1),
         ref=_attn_ref, work=_attn_work, rtol=1e-5, atol=1e-6,
         torch=lambda torch, x, m: torch.softmax((x * ATTN_SCALE).masked_fill(m, float("-inf")), -1),
         note="attention's scale + causal mask + softmax over the last dim (mask: a (L, L) bool input)"),
    Case(name="bmm", group="fusion", title=lambda s: f"bmm ({s[0]},{s[1]},{s[1]})@({s[0]},{s[1]},{s[1]}) f32",
         sizes=_BMM, make=_bmm_make(False), lc=lambda lc, a, b: a.matmul(b), ref=lambda xp, a, b: a @ b,
         work=_bmm_work, metric="flops", rtol=1e-4, atol=1e-4),
    Case(name="bmm_bcast", group="fusion",
         title=lambda s: f"broadcast-lhs bmm ({s[1]},{s[1]})@({s[0]},{s[1]},{s[1]}) f32",
         sizes=_BMM, make=_bmm_make(True), lc=lambda lc, a, b: a @ b, ref=lambda xp, a, b: a @ b,
         work=_bmm_work, metric="flops", rtol=1e-4, atol=1e-4,
         note="the case candle 0.11 gets silently wrong"),
]

ALL_CASES = SEED_CASES + FUSION_CASES


def select(cases, only) -> list:
    """Cases whose name matches one of the comma-separated patterns in `only` (exact name, a
    shell-style glob, or a substring); all cases when `only` is empty."""
    import fnmatch
    if not only:
        return list(cases)
    pats = [p.strip() for p in only.split(",") if p.strip()]
    exact = [c for c in cases if c.name in pats]
    fuzzy = [c for c in cases if any(fnmatch.fnmatch(c.name, p) or p in c.name for p in pats)]
    return exact if exact and len(exact) == len(pats) else fuzzy


def size_of(case: Case, mode: str, overrides: Optional[dict] = None):
    """The size of `case` in `mode`, unless `overrides[case.name]` gives one."""
    if overrides and case.name in overrides:
        return overrides[case.name]
    return case.sizes[mode]
