"""Running one case: make inputs, run lazycandle once (compiling), check it against NumPy, then
time lazycandle, NumPy and the peers side by side.  A case never raises: a failing lazycandle op
gives status ERROR, a wrong result status WRONG (and no timing)."""
from __future__ import annotations

import gc
import os
import sys
import time
import traceback

import numpy as np

from .cases import Case
from .timing import time_alternating

SEED = 1234
MAX_SPREAD = 2.0        # max/min of one implementation's samples above this: the case is timed again
RETRIES = 2


def _as_f64(arrays: dict) -> dict:
    return {k: v.astype(np.float64) for k, v in arrays.items()}


def check(out, base, exact, rtol: float, atol: float) -> tuple[bool, str]:
    """Is `out` right?  Same shape and dtype as NumPy's result `base`, and every element within
    rtol·|exact| + atol·rms(exact) + 2·|base − exact| of `exact` (the NumPy code in float64).
    Returns (ok, detail)."""
    out = np.asarray(out)
    if out.shape != base.shape:
        return False, f"shape {out.shape}, NumPy gives {base.shape}"
    if out.dtype != base.dtype:
        return False, f"dtype {out.dtype}, NumPy gives {base.dtype}"
    o = out.astype(np.float64)
    e = np.asarray(exact, dtype=np.float64)
    b = base.astype(np.float64)
    finite = np.isfinite(e)
    if not np.array_equal(np.isfinite(o), finite) or not np.array_equal(o[~finite], e[~finite], equal_nan=True):
        return False, "non-finite values differ from NumPy"
    if not finite.any():
        return True, ""
    o, e, b = o[finite], e[finite], b[finite]
    rms = float(np.sqrt(np.mean(e * e))) if e.size else 0.0
    err = np.abs(o - e)
    bound = rtol * np.abs(e) + atol * rms + 2 * np.abs(b - e)
    bad = err > bound
    if bad.any():
        i = int(np.argmax(err - bound))
        return False, (f"{int(bad.sum())} of {e.size} elements off; worst: {o[i]:.7g} vs exact {e[i]:.7g} "
                       f"(NumPy {b[i]:.7g})")
    return True, ""


def _peer_fns(case: Case, arrays: dict, mods: dict, threads: int) -> tuple[dict, list]:
    """Callables (no arguments, returning a NumPy array) for each peer that implements `case`.
    jax only at the machine's full thread count: XLA's pool always uses every CPU, so a 1-thread
    row against it would compare different machines."""
    fns, notes = {}, []
    if "numexpr" in mods and case.numexpr is not None:
        ne = mods["numexpr"]
        fns["numexpr"] = lambda: case.numexpr(ne, **arrays)
    if "torch" in mods:
        try:
            fns["torch"] = _torch_fn(case, arrays, mods["torch"])
        except Exception as e:
            notes.append(f"torch: set-up failed ({type(e).__name__}: {e})")
    if "jax" in mods and threads >= (os.cpu_count() or 1):
        try:
            fns["jax"] = _jax_fn(case, arrays, mods["jax"])
        except Exception as e:
            notes.append(f"jax: set-up failed ({type(e).__name__}: {e})")
    return fns, notes


def _torch_fn(case, arrays, torch):
    import ml_dtypes

    def to_t(a):
        if a.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)

    def from_t(t):
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()

    ts = {k: to_t(v) for k, v in arrays.items()}
    body = case.torch or (lambda torch, **kw: case.ref(torch, **kw))

    def run():
        with torch.inference_mode():
            return from_t(body(torch, **ts))
    return run


def _jax_fn(case, arrays, jax):
    import jax.numpy as jnp
    dev = {k: _jax_view(jax, v) for k, v in arrays.items()}
    body = case.jax or (lambda jax, **kw: case.ref(jnp, **kw))
    f = jax.jit(lambda **kw: body(jax, **kw))
    return lambda: np.asarray(f(**dev).block_until_ready())


def _jax_view(jax, arr):
    """jax's input: a zero-copy view of the NumPy array where XLA takes one (DLPack, 64-byte
    aligned data: run_case aligns every input), else a device copy.  A private copy would
    take the last-level cache from the input every other implementation reads: a 16 MB
    input and jax's copy fill a 32 MB L3, and the call after jax's read DRAM (a lazycandle
    sum(0) at 2 threads, (4096, 1024) f32: 0.26 ms without jax in the rotation, 0.39 with it)."""
    try:
        view = jax.dlpack.from_dlpack(arr)
        if view.unsafe_buffer_pointer() == arr.ctypes.data:
            return view
    except Exception:
        pass
    return jax.device_put(arr)


def _aligned(arr: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `arr` whose data starts on a 64-byte boundary."""
    raw = np.empty(arr.nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    out = raw[start:start + arr.nbytes].view(arr.dtype).reshape(arr.shape)
    out[...] = arr
    return out


def _lc_input(lc, arr):
    """lazycandle's view of a case input: zero-copy over the NumPy array (lc.from_dlpack), as
    torch.from_numpy gives torch, so every implementation reads the same memory (a private
    copy would be the one input that is not cache-hot from the previous call); a dtype DLPack
    does not carry is copied (lc.tensor)."""
    try:
        return lc.from_dlpack(arr)
    except (TypeError, BufferError, ValueError, lc.UnsupportedDType):
        return lc.tensor(arr).realize()


def run_case(case: Case, size, threads: int, mods: dict, repeats: int = 9, lc_impl=None) -> dict:
    """Check and time `case` at `size` with the thread count already set.  `lc_impl` replaces
    `case.lc` (the tests inject a wrong implementation this way).  Returns a report row."""
    import lazycandle as lc
    impl = lc_impl or case.lc
    flops, nbytes = case.work(size)
    row = {"name": case.name, "group": case.group, "title": case.title(size), "size": size,
           "seed_label": case.seed_label, "threads": threads, "repeats": repeats,
           "metric": case.metric, "flops": flops, "bytes": nbytes, "status": "ok", "error": "",
           "notes": [case.note] if case.note else [], "impls": {}}
    gc.collect()
    arrays = {k: _aligned(v) for k, v in case.make(np.random.default_rng(SEED), size).items()}
    base = case.ref(np, **arrays)
    exact = case.ref(np, **_as_f64(arrays))
    try:
        tensors = {k: _lc_input(lc, v) for k, v in arrays.items()}
        t0 = time.perf_counter()
        out = impl(lc, **tensors).numpy()
        first = time.perf_counter() - t0
    except Exception as e:
        row.update(status="ERROR", error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
        row["traceback"] = traceback.format_exc(limit=6)
        return row
    ok, detail = check(out, base, exact, case.rtol, case.atol)
    if not ok:
        row.update(status="WRONG", error=detail)
        return row
    del out
    fns = {"lazycandle": lambda: impl(lc, **tensors).numpy(), "numpy": lambda: case.ref(np, **arrays)}
    peers, notes = _peer_fns(case, arrays, mods, threads)
    row["notes"] += notes
    for name, fn in peers.items():
        try:
            res = fn()
            pok, pdetail = check(res, base, exact, max(case.rtol, 1e-4), max(case.atol, 1e-4))
            if not pok and np.asarray(res).dtype != base.dtype and np.asarray(res).shape == base.shape:
                row["notes"].append(f"{name} returns {np.asarray(res).dtype}, NumPy {base.dtype}")
                pok = check(np.asarray(res).astype(base.dtype), base, exact, max(case.rtol, 1e-4),
                            max(case.atol, 1e-4))[0]
            if pok:
                fns[name] = fn
            else:
                row["notes"].append(f"{name}: result differs from NumPy ({pdetail}); left out")
        except Exception as e:
            row["notes"].append(f"{name}: failed ({type(e).__name__}: {str(e).splitlines()[0][:120]}); left out")
    row["loadavg"] = os.getloadavg()[0]
    stats = _timed_with_retries(fns, repeats, row)
    stats["lazycandle"].first = first
    row["impls"] = {k: v.as_dict() for k, v in stats.items()}
    _derive(row, stats)
    return row


def spread(stats: dict) -> tuple[float, str]:
    """The worst max/min ratio over the implementations' samples, and whose it is."""
    worst = max(stats, key=lambda k: stats[k].max / stats[k].min if stats[k].n > 1 else 1.0)
    st = stats[worst]
    return (st.max / st.min if st.n > 1 else 1.0), worst


def _timed_with_retries(fns: dict, repeats: int, row: dict) -> dict:
    """time_alternating, run again (up to RETRIES times) while some implementation's samples
    spread over MAX_SPREAD: a burst of load from another process distorts such a round.  The
    round with the smallest spread is kept; the row notes the reruns and keeps their load."""
    best, spreads = None, []
    for attempt in range(1 + RETRIES):
        stats = time_alternating(fns, repeats=repeats, warmup=1)
        sp, who = spread(stats)
        if best is None or sp < best[0]:
            best = (sp, stats)
        if sp <= MAX_SPREAD:
            break
        spreads.append(f"{who} {sp:.1f}x at load {os.getloadavg()[0]:.1f}")
    if spreads:
        row["notes"].append(f"t={row['threads']}: timed {len(spreads) + (best[0] <= MAX_SPREAD)} times, "
                            f"samples spread over {MAX_SPREAD:g}x ({'; '.join(spreads)}); kept the "
                            f"round with spread {best[0]:.1f}x")
    row["spread"] = best[0]
    return best[1]


def _derive(row: dict, stats: dict) -> None:
    """Ratios and throughput of a timed row."""
    lc_t = stats["lazycandle"].median
    row["x_numpy"] = stats["numpy"].median / lc_t
    peers = {k: v.median for k, v in stats.items() if k != "lazycandle"}
    best = min(peers, key=peers.get)
    row["best_peer"], row["x_best_peer"] = best, peers[best] / lc_t
    work = row["flops"] if row["metric"] == "flops" else row["bytes"]
    row["rate"] = work / lc_t / 1e9            # GFLOP/s or GB/s at the median


def progress(row: dict, done: int, total: int) -> None:
    """One line per case on stderr, named by the size this run measures (the case name keeps
    the full-size figure, e.g. matmul_f32_1024 runs 512x512 under --quick)."""
    head = f"[{done}/{total}] {row['title']:<30} t={row['threads']} "
    if row["status"] != "ok":
        msg = f"{row['status']}: {row['error']}"
    else:
        i = row["impls"]
        msg = (f"lazycandle {i['lazycandle']['median_ms']:.3f} ms, NumPy {i['numpy']['median_ms']:.3f} ms "
               f"({row['x_numpy']:.2f}x), best peer {row['best_peer']} ({row['x_best_peer']:.2f}x)")
    print(head + msg, file=sys.stderr, flush=True)
