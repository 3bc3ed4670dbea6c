"""The AMX form of the tiled bf16 GEMM (codegen/gemm.py), for hosts with amx-tile and amx-bf16.

`tdpbf16ps` multiplies a 16 x 32 bf16 tile of A by a 16 x 16-pair tile of B (k in pairs, as
`vdpbf16ps`'s panels: gemm_pairs.py) into a 16 x 16 f32 tile of C: 16 384 flops a call.  The
micro-kernel holds a 32 x 32 block of C in four tiles (C00 C01 / C10 C11), two A tiles and two
B tiles: per 32 k, 4 tile loads and 4 products.  The driver, its blocking, the shared-B plan,
W's partial sums, the rounding to bf16 and the epilogue are gemm.py's; this module gives

  * the tile configuration (all eight tiles 16 rows x 64 bytes, palette 1), loaded once per
    driver call (`configure`) and released at its end (`release`);
  * A's packer (`emit_pack_a`): per 32-k block, the panel's MR rows of 32 bf16 each, so an A
    tile is 1 KB read at a 64-byte stride; a row-major A whose K is whole 32-k steps is not
    packed (but for a last partial row block): the tiles read its rows in place, at its row
    stride.  B is packed by gemm_pairs.emit_pack (per k-pair the NR columns' pair words: a B
    tile is 16 pair rows at a stride of NR words);
  * the micro-kernel (`micro_tiles`): C tiles start at zero (first KC block) or from W's
    partial sums, the k loop runs in the tiles, and they go back to W (whole tiles) or, after
    the last KC block, to an f32 scratch from which gemm.store_tile rounds and writes the
    outputs as the vector forms do (edges, epilogue).

Products are exact in f32 and added in f32 (in an order of the hardware's; the result rounds
to bf16 once, as the other forms do).  AMX treats bf16 denormal inputs as 0 and flushes
denormal f32 results to 0 (as torch's oneDNN does); NaN and Inf propagate.

Measured on a 2-vCPU Xeon (AMX, load ~6, thread CPU time, bench/amx_bf16.py): 1024^2 at 1
thread 2.3-2.5 ms, 2048^2 17.8-20 ms, torch (oneDNN, AMX) 1.6-2.4 / 17.2-20 ms; the AVX512-BF16
pair form it replaces here 24 / 190 ms.  What is left against oneDNN at 1024^2 is per C block:
the tiles' drain and the rounded stores of 32 x 32 outputs (software-pipelining those behind
the next block's products measured no faster).

Linux hands the tile data state to a process only when asked (arch_prctl ARCH_REQ_XCOMP_PERM
for XFEATURE_XTILEDATA): `permission()` asks once, and when it is refused the AVX-512 forms
run instead (`status()` says why; `lazycandle info` prints it)."""
from __future__ import annotations

import ctypes
import sys
import threading

import llvmlite.ir as ir

from .. import config
from ..errors import Error
from . import jit
from .gemm_ir import ONE, ZERO, I64, acc_type, add, define, for_range, gep, i64, imin, mul, storage_type, store, vload, \
    vstore
from .llvmutil import VOID

I8 = ir.IntType(8)
I16 = ir.IntType(16)
P8 = I8.as_pointer()
ROWS, ROW_BYTES = 16, 64        # every tile: 16 rows of 64 bytes
KSTEP = 32                      # bf16 k per tile product
MR = NR = 32                    # the C block: 2 x 2 tiles of 16 x 16 f32
C00, C01, C10, C11, A0, A1, B0, B1 = range(8)
FEATURES = ("amx-tile", "amx-bf16")

ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158


class AMXUnavailable(Error, RuntimeError):
    """LAZYCANDLE_AMX=on on a host (or kernel) that cannot run AMX tiles."""


_lock = threading.Lock()
_perm: dict = {}


def permission() -> str | None:
    """Ask Linux once per process for the tile data state; None when granted, else why not."""
    with _lock:
        if "why" not in _perm:
            _perm["why"] = _ask()
    return _perm["why"]


def _ask() -> str | None:
    if not sys.platform.startswith("linux") or not jit.triple_and_layout()[0].startswith("x86_64"):
        return "not x86-64 Linux"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        rc = libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_REQ_XCOMP_PERM),
                          ctypes.c_ulong(XFEATURE_XTILEDATA))
    except (OSError, AttributeError) as e:
        return f"arch_prctl not callable ({e})"
    if rc != 0:
        return f"arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) refused (errno {ctypes.get_errno()})"
    return None


def status() -> str:
    """One line for `lazycandle info`: whether bf16 matmuls run on AMX here, and if not why."""
    mode = config.amx_mode()
    if mode == "off":
        return "off (LAZYCANDLE_AMX=off): bf16 matmul on AVX-512"
    missing = [f for f in FEATURES if not jit.has_feature(f)]
    if missing:
        return f"unavailable (no {', '.join(missing)})"
    why = permission()
    return f"unavailable ({why})" if why else "on: bf16 matmul on AMX tiles"


def usable(dt) -> bool:
    """Whether the tiled GEMM of `dt` runs on AMX tiles: bf16 on a host with FEATURES whose
    kernel granted the tile state, unless LAZYCANDLE_AMX=off (=on: an error when it cannot)."""
    if dt.name != "bf16":
        return False
    mode = config.amx_mode()
    if mode == "off":
        return False
    missing = [f for f in FEATURES if not jit.has_feature(f)]
    why = f"no {', '.join(missing)}" if missing else permission()
    if why and mode == "on":
        raise AMXUnavailable(f"matmul: LAZYCANDLE_AMX=on but AMX cannot run for bf16 here: {why}")
    return why is None


# ---- tile configuration -----------------------------------------------------------------
def _config_bytes() -> bytes:
    """The 64-byte LDTILECFG block: palette 1, each tile ROWS x ROW_BYTES."""
    cfg = bytearray(64)
    cfg[0] = 1
    for t in range(8):
        cfg[16 + 2 * t:18 + 2 * t] = ROW_BYTES.to_bytes(2, "little")
        cfg[48 + t] = ROWS
    return bytes(cfg)


def _intr(b, name: str, args: list, types: list):
    fn = b.module.globals.get(name) or ir.Function(b.module, ir.FunctionType(VOID, types), name=name)
    return b.call(fn, args)


def configure(b) -> None:
    """ldtilecfg of the module's configuration block (emitted once per module)."""
    m = b.module
    g = m.globals.get("lc_amx_cfg")
    if g is None:
        t = ir.ArrayType(I8, 64)
        g = ir.GlobalVariable(m, t, "lc_amx_cfg")
        g.initializer = ir.Constant(t, bytearray(_config_bytes()))
        g.global_constant, g.linkage, g.align = True, "internal", 64
    _intr(b, "llvm.x86.ldtilecfg", [b.bitcast(g, P8)], [P8])


def release(b) -> None:
    _intr(b, "llvm.x86.tilerelease", [], [])


def _tile(n: int):
    return ir.Constant(I8, n)


def _load(b, t: int, ptr, stride) -> None:
    _intr(b, "llvm.x86.tileloadd64", [_tile(t), ptr, i64(stride) if isinstance(stride, int) else stride],
          [I8, P8, I64])


def _store(b, t: int, ptr, stride: int) -> None:
    _intr(b, "llvm.x86.tilestored64", [_tile(t), ptr, i64(stride)], [I8, P8, I64])


def _dot(b, c: int, a: int, bt: int) -> None:
    _intr(b, "llvm.x86.tdpbf16ps", [_tile(c), _tile(a), _tile(bt)], [I8, I8, I8])


def _zero(b, t: int) -> None:
    _intr(b, "llvm.x86.tilezero", [_tile(t)], [I8])


# ---- micro-kernel -----------------------------------------------------------------------
def micro_tiles(b, rows: int, kbp, ap, bp, tile, w, first, last, a_rs, a_step) -> None:
    """C (rows x NR f32, rows 16 or 32) += A (MR rows) x B panel (NR columns) over kbp (a
    multiple of KSTEP) k, in the tiles; A's rows are a_rs bytes apart and its next 32 k a_step
    bytes on (its packed panel: 64 and MR * 64; a row-major A read in place: its row stride and
    64). C starts at 0 on the first KC block, else from the
    partial sums at w (the block's MR x NR f32 in tile_index order); it goes to `tile` (f32 *,
    same order) after the last block, else back to w.  Whole 1 KB tiles both ways, so a KC
    block costs 4 tile loads and stores more, and a short KC keeps the B panel in L1 across
    the row blocks that read it."""
    cs = (C00, C01, C10, C11)[:2 * rows // ROWS]
    w8 = b.bitcast(w, P8)
    with b.if_else(first) as (zero, partial):
        with zero:
            for c in cs:
                _zero(b, c)
        with partial:
            for n, c in enumerate(cs):
                _load(b, c, gep(b, w8, i64(n * ROWS * ROW_BYTES)), ROW_BYTES)
    a8, b8 = b.bitcast(ap, P8), b.bitcast(bp, P8)
    b_stride = NR * 4                              # a k-pair row of B's panel: NR pair words
    with for_range(b, ZERO, b.sdiv(kbp, i64(KSTEP)), name="ks") as s:
        pa = gep(b, a8, mul(b, s, a_step))
        pb = gep(b, b8, mul(b, s, i64(ROWS * b_stride)))
        _load(b, B0, pb, b_stride)
        _load(b, B1, gep(b, pb, i64(ROW_BYTES)), b_stride)
        _load(b, A0, pa, a_rs)
        _dot(b, C00, A0, B0)
        _dot(b, C01, A0, B1)
        if rows > ROWS:
            _load(b, A1, gep(b, pa, mul(b, a_rs, i64(ROWS))), a_rs)
            _dot(b, C10, A1, B0)
            _dot(b, C11, A1, B1)
    t8 = b.select(last, b.bitcast(tile, P8), w8)
    for n, c in enumerate(cs):       # each tile's 1 KB in one piece: ~3x faster than rows NR apart
        _store(b, c, gep(b, t8, i64(n * ROWS * ROW_BYTES)), ROW_BYTES)


def tile_index(i: int, j: int) -> int:
    """Element of C's (i, j) in micro_tiles' scratch: the C tiles one after another, row-major."""
    return ((i // ROWS) * (NR // ROWS) + j // ROWS) * ROWS * ROWS + (i % ROWS) * ROWS + j % ROWS


def tile_index_ir(b, i, j):
    """tile_index of run-time i, j (i64)."""
    r16, c16 = i64(ROWS), i64(ROWS)
    t = add(b, mul(b, b.udiv(i, r16), i64(NR // ROWS)), b.udiv(j, c16))
    return add(b, mul(b, t, i64(ROWS * ROWS)), add(b, mul(b, b.urem(i, r16), r16), b.urem(j, c16)))


# ---- A's packer -------------------------------------------------------------------------
def emit_pack_a(m: ir.Module, spec, name: str, width: int):
    """pack(src, rs, cs, rows, kb, kbp, dst) into `width`-row panels spaced width x kbp f32 slots
    (the driver's layout) holding, per 32-k block, width rows of 32 bf16 (64 bytes: one tile row).
    cs == 1 (row-major A): the whole 32-k blocks of a row are one 64-byte copy each; the k tail,
    the padding, other strides and the partial panel's missing rows (zeros) one element at a
    time, k outer and rows inner (contiguous reads for a transposed A)."""
    st, at = storage_type(spec.dtype), acc_type(spec.dtype)
    fn, b = define(m, name, VOID, [st.as_pointer(), I64, I64, I64, I64, I64, at.as_pointer()])
    src, rs, cs, rows, kb, kbp, dst = fn.args
    src = b.bitcast(src, I16.as_pointer())
    out = b.bitcast(dst, I16.as_pointer())
    W = width
    panel = mul(b, kbp, i64(2 * W))                 # i16 between panels

    def at_(r, k):
        """i16 index of (row r of the whole block, k)."""
        p, rr = b.sdiv(r, i64(W)), b.srem(r, i64(W))
        blk, kk = b.sdiv(k, i64(KSTEP)), b.srem(k, i64(KSTEP))
        return add(b, add(b, mul(b, p, panel), mul(b, blk, i64(W * KSTEP))), add(b, mul(b, rr, i64(KSTEP)), kk))

    unit = b.icmp_signed("==", cs, ONE)
    kfull = b.select(unit, mul(b, b.sdiv(kb, i64(KSTEP)), i64(KSTEP)), ZERO)
    with b.if_then(unit):
        with for_range(b, ZERO, rows, name="r") as r:
            row = gep(b, src, mul(b, r, rs))
            with for_range(b, ZERO, kfull, i64(KSTEP), name="kv") as k:
                vstore(b, vload(b, row, k, KSTEP, 2), out, at_(r, k), 4)
    npanel = b.sdiv(add(b, rows, i64(W - 1)), i64(W))
    zero16 = ir.Constant(I16, 0)
    with for_range(b, ZERO, npanel, name="p") as p:
        r0 = mul(b, p, i64(W))
        nrows = imin(b, i64(W), b.sub(rows, r0))
        with for_range(b, ZERO, kbp, name="k") as k:
            copied = b.icmp_signed("<", k, kfull)
            with for_range(b, b.select(copied, nrows, ZERO), i64(W), name="rr") as rr:
                ok = b.and_(b.icmp_signed("<", rr, nrows), b.icmp_signed("<", k, kb))
                r = add(b, r0, rr)
                idx = b.select(ok, add(b, mul(b, r, rs), mul(b, k, cs)), ZERO)
                v = b.select(ok, b.load(gep(b, src, idx), align=2), zero16)
                store(b, v, out, at_(r, k), 2)
    b.ret_void()
    return fn
