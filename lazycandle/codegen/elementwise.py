"""Fused elementwise kernels.  One kernel evaluates a DAG of elementwise ops over N strided
inputs and writes M contiguous outputs of the same shape.

Kernels are compiled per shape CLASS, not per shape: the spec holds the merged rank, each input's
stride class per dim (0 broadcast, 1 unit, or "n": a runtime stride) and the tiling choice; the
sizes of the merged dims and the runtime strides arrive in the `sizes` array (i64), so a new
length of the same computation reuses the kernel.

Loop nest (after merging dims that are contiguous for every operand):
  rank 1:  i in [lo, hi): vector body of W lanes, then a scalar tail;
  rank>1:  rows r in [lo, hi) of the flattened outer dims (row -> outer index by div/mod),
           then the inner dim as a vector body + scalar tail.
Each input is read through its own strides: inner stride 1 -> vector load, 0 -> one scalar load
splatted, otherwise per-lane loads.  Scalars (constants and scalar args) are runtime arguments:
loaded once at entry from the scalars array, converted to their compute type and splatted.  f16/bf16/f8 values are decoded on load, rounded after every
op (so fusion never changes a value) and encoded on store.
"""
from __future__ import annotations

import llvmlite.ir as ir

from .. import dtype as D
from ..ir.ops import OPS
from . import codecs, jit
from .fused import bits as _bits, ew_lanes as lanes
from .llvmutil import I8, I32, I64, F64, VOID, intrinsic, type_suffix, ltype, vec, splat, const, width_of, scalar_type
from .loops import new_module, kernel_function, arg_pointer, counted_loop, unit_range
from ..ir.kernels import RUNTIME, TILE_SUPER, EwSpec
from .ops_emit import EMIT


def _cast(b, v, src: D.DType, dst: D.DType):
    """Convert a compute value of `src` to the compute type of `dst` (one rounding)."""
    w = width_of(v.type)
    dst_t = vec(ltype(dst.compute), w)
    if src.is_float:
        if dst.is_float:
            if dst.codec:
                if isinstance(scalar_type(v.type), ir.FloatType):
                    return codecs.roundtrip(b, dst.codec, v)
                return codecs.decode(b, dst.codec, codecs.encode(b, dst.codec, v))
            if v.type == dst_t:
                return v
            sw, dw = _bits(src), _bits(dst)
            return b.fpext(v, dst_t) if dw > sw else b.fptrunc(v, dst_t)
        wide = b.call(_sat_fn(b, v.type, w), [v])   # saturating: NaN/out-of-range never trap
        return wide if dst_t == wide.type else b.trunc(wide, dst_t)
    # src integer
    if dst.is_float:
        mid_t = vec(ltype("double"), w) if dst.codec or dst.compute == "double" else dst_t
        f = b.sitofp(v, mid_t) if src.is_signed else b.uitofp(v, mid_t)
        if dst.codec:
            return codecs.decode(b, dst.codec, codecs.encode(b, dst.codec, f))
        return f
    sw, dw = _bits(src), _bits(dst)
    if dw == sw:
        return v
    if dw < sw:
        return b.trunc(v, dst_t)
    return b.sext(v, dst_t) if src.is_signed else b.zext(v, dst_t)


def _sat_fn(b, src_t, w):
    from .llvmutil import intrinsic, type_suffix
    ret = vec(I64, w)
    return intrinsic(b.module, f"llvm.fptosi.sat.{type_suffix(ret)}.{type_suffix(src_t)}", ret, [src_t])


def _ref_dtype(spec, dtypes, ref):
    """The dtype of an instruction operand: input ("i", k), runtime scalar ("s", k, dtype) or value."""
    if ref[0] == "i":
        return D.DType.from_name(spec.inputs[ref[1]][0])
    return D.DType.from_name(ref[2]) if ref[0] == "s" else dtypes[ref]


def load_scalars(b, ptr, dtype_names):
    """Entry-block loads of the runtime scalars: slot k of `ptr` (i64*) in the compute type of
    dtype_names[k] (float scalars are stored as f64 bits, exact in their dtype)."""
    out = []
    for k, dtn in enumerate(dtype_names):
        dt = D.DType.from_name(dtn)
        raw = b.load(b.gep(ptr, [I64(k)], inbounds=True), align=8)
        t = ltype(dt.compute)
        if dt.is_float:
            v = b.bitcast(raw, F64)
            out.append(v if t == F64 else b.fptrunc(v, t))
        else:
            out.append(raw if t == I64 else b.trunc(raw, t))
    return out


def _emit_instrs(b, spec, load, w, scalar, decode_outputs=False):
    """Evaluate the instruction list.  `load(k)` returns input k's raw storage value and
    `scalar(k, w)` runtime scalar k splatted to w lanes.  Returns the list of values to store
    (storage representation) per output."""
    raw = {}        # ref -> raw storage value (inputs, or copies of them)
    comp = {}       # ref -> compute value
    dtypes = {}

    def get(ref, want_raw=False):
        if ref[0] == "i":
            k = ref[1]
            if ref not in raw:
                raw[ref] = load(k)
                dtypes[ref] = D.DType.from_name(spec.inputs[k][0])
        if ref[0] == "s":
            return scalar(ref[1], w)
        if want_raw and ref in raw:
            return raw[ref]
        if ref not in comp:
            dt = dtypes[ref]
            comp[ref] = codecs.decode(b, dt.codec, raw[ref]) if dt.codec else raw[ref]
        return comp[ref]

    for j, (op, arg, dtn, odtn, refs) in enumerate(spec.instrs):
        dt, odt = D.DType.from_name(dtn), D.DType.from_name(odtn)
        me = ("v", j)
        dtypes[me] = odt
        if op == "copy" and refs[0][0] == "i":
            get(refs[0], want_raw=True)          # load the input, so the copy moves its storage bits
        if op == "copy" and refs[0] in raw:
            raw[me] = raw[refs[0]]
            continue
        if op == "where" and odt.codec and all(_ref_dtype(spec, dtypes, r) is odt for r in refs[1:]):
            # select storage bits: decoding and re-encoding would rewrite NaN payloads
            picks = [get(r, want_raw=True) if r in raw or r[0] == "i" else codecs.encode(b, odt.codec, get(r))
                     for r in refs[1:]]
            m = get(refs[0])
            raw[me] = b.select(b.icmp_unsigned("!=", m, const(m.type, 0)), *picks)
            continue
        vals = [get(r) for r in refs]
        kind = OPS[op]
        if op == "cast":
            src = dtypes.get(refs[0]) or D.DType.from_name(refs[0][2])
            out = _cast(b, vals[0], src, odt)
        else:
            out = EMIT[op](b, dt, vals, arg)
            if kind.out_dtype == "u8":
                out = b.zext(out, vec(I8, width_of(out.type)))
            elif odt.codec:
                out = codecs.roundtrip(b, odt.codec, out)
        comp[me] = out

    stores = []
    for j, odtn in spec.outputs:
        ref = ("v", j)
        odt = D.DType.from_name(odtn)
        if decode_outputs:
            stores.append(get(ref))
        elif ref in raw:
            stores.append(raw[ref])
        else:
            v = comp[ref]
            stores.append(codecs.encode(b, odt.codec, v) if odt.codec else v)
    return stores


def _transpose(b, rows):
    """Transpose a W x W block held as W vectors (W a power of two): swap each bit of the row
    index with the same bit of the lane index, one shufflevector pair per row pair."""
    w = len(rows)
    rows = list(rows)
    p = 1
    while p < w:
        out = list(rows)
        for r in range(w):
            if r & p:
                continue
            r2 = r | p
            lo = [c if not c & p else w + (c & ~p) for c in range(w)]
            hi = [c | p if not c & p else w + c for c in range(w)]
            out[r] = b.shuffle_vector(rows[r], rows[r2], ir.Constant(ir.VectorType(I32, w), lo))
            out[r2] = b.shuffle_vector(rows[r], rows[r2], ir.Constant(ir.VectorType(I32, w), hi))
        rows = out
        p <<= 1
    return rows


LINE = 64   # cache line bytes: streamed vectors are aligned to min(their size, a line)


def streaming_min_bytes(row: bool = False) -> int:
    """Output bytes of one kernel from which its stores are non-temporal, from the host's
    caches.  An elementwise kernel moves data as fast as the cache it reads, and its output is
    usually read back soon: measured here (Zen 4, 1 MiB L2, 32 MiB shared L3; `a + b` alone and
    followed by a sum of its output: `python -m bench.stream_threshold`) streaming lost up to
    1.5x from 1 to 6 MiB at 1 thread and up to 1.8x to 8 MiB at 2, tied at 8 MiB at 1 thread and
    at 12-16 MiB at 2, and won 1.2x from 12 MiB at 1 thread and 1.4x at 32 MiB at 2: it starts
    at a third of the last-level cache (at least L2).  A row kernel (`row`: softmax, norms)
    computes enough per element that streaming won or tied at every size from 1 MiB: it
    streams from the L2 size, where a plain store's read-for-ownership of each output line
    starts to cost."""
    sizes = jit.cache_bytes()
    return sizes[2] if row else max(sizes[2], sizes[3] // 3)


def opaque(b, value):
    """`value` through an empty inline-asm statement (no instruction): LLVM cannot prove the
    result loop-invariant, so it does not unswitch a loop on it, which would copy the body
    and double the compile time to save one predictable branch per vector."""
    asm = ir.InlineAsm(ir.FunctionType(value.type, [value.type]), "", "=r,0", side_effect=True)
    return b.call(asm, [value])


SUPER = TILE_SUPER  # a tiled kernel's unit spans SUPER x SUPER tiles of W x W (EwSpec.extent)


class _Kernel:
    """IR emission state for one elementwise kernel."""

    def __init__(self, spec: EwSpec, name: str, W: int | None = None):
        self.spec = spec
        self.m = new_module(name)
        self.fn, self.b = kernel_function(self.m, name)
        ptrs = self.fn.args[0]
        self.in_dt = [D.DType.from_name(dt) for dt, _ in spec.inputs]
        self.out_dt = [D.DType.from_name(dt) for _, dt in spec.outputs]
        b = self.b
        self.in_ptr = [arg_pointer(b, ptrs, k, ltype(dt.storage), f"in{k}") for k, dt in enumerate(self.in_dt)]
        n_in = len(self.in_dt)
        self.out_ptr = [arg_pointer(b, ptrs, n_in + k, ltype(dt.storage), f"out{k}") for k, dt in enumerate(self.out_dt)]
        self.W = lanes(spec) if W is None else W
        self.load_sizes()
        self.scalar_vals = load_scalars(b, self.fn.args[2], spec.scalars)
        self.scalar_splats = {(k, self.W): splat(b, v, self.W) for k, v in enumerate(self.scalar_vals)}

    def load_sizes(self):
        """Entry-block loads of the runtime sizes: `self.dims[d]` (i64 values), per input the
        stride of each dim (0, 1 or a loaded value) and the output's contiguous strides."""
        b, sizes = self.b, self.fn.args[1]
        pos = [0]

        def nxt():
            v = b.load(b.gep(sizes, [I64(pos[0])], inbounds=True), align=8)
            pos[0] += 1
            return v
        self.dims = [nxt() for _ in range(self.spec.rank)]
        self.strides = [[nxt() if c == RUNTIME else c for c in cls] for _, cls in self.spec.inputs]
        out, acc = [], I64(1)
        for d in reversed(range(self.spec.rank)):
            out.append(acc)
            acc = acc if d == 0 else b.mul(acc, self.dims[d], flags=("nsw",))
        self.out_strides = out[::-1]

    def smul(self, i, s):
        """i * s for a stride s that is 0, 1 or a runtime value (None for 0)."""
        if isinstance(s, int):
            return None if s == 0 else i if s == 1 else self.b.mul(i, I64(s))
        return self.b.mul(i, s)

    def sadd(self, base, i, s):
        """base + i * s."""
        t = self.smul(i, s)
        return base if t is None else self.b.add(base, t)

    def scalar(self, k, w):
        """Runtime scalar k splatted to w lanes (splats made at entry, so loops only read them)."""
        if w == 1:
            return self.scalar_vals[k]
        return self.scalar_splats[(k, w)]

    # -- loads and stores ----------------------------------------------------------------
    def load(self, k, off, stride, w, mask=None):
        """Raw storage value(s) of input k: w lanes starting at element offset `off`, `stride`
        elements apart (stride 0: one load splatted).  With `mask` (a tail), only the lanes it
        sets are read: a masked vector load, or per-lane loads clamped to the last valid lane."""
        b, dt = self.b, self.in_dt[k]
        al = dt.size_in_bytes
        st = ltype(dt.storage)
        if stride == 0 or w == 1:
            x = b.load(b.gep(self.in_ptr[k], [off], inbounds=True), align=al)
            return splat(b, x, w)
        vt = ir.VectorType(st, w)
        if stride == 1:
            p = b.bitcast(b.gep(self.in_ptr[k], [off], inbounds=True), vt.as_pointer())
            if mask is None:
                return b.load(p, align=al)
            fn = intrinsic(self.m, f"llvm.masked.load.{type_suffix(vt)}.p0{type_suffix(vt)}", vt,
                           [vt.as_pointer(), I32, mask.type, vt])
            return b.call(fn, [p, I32(al), mask, ir.Constant(vt, None)])
        v = ir.Constant(vt, ir.Undefined)
        for lane in range(w):
            idx = I64(lane)
            if mask is not None:
                idx = b.select(b.extract_element(mask, I32(lane)), I64(lane), I64(0))
            p = b.gep(self.in_ptr[k], [self.sadd(off, idx, stride)], inbounds=True)
            v = b.insert_element(v, b.load(p, align=al), I64(lane))
        return v

    def eval_store(self, in_off, out_off, strides, w, given=None, mask=None, streaming=False):
        """Evaluate the DAG for w lanes and store every output at `out_off`.  `given` maps an
        input index to an already loaded raw value; `mask` limits loads and stores to a tail;
        `streaming`: non-temporal stores, each vector aligned to min(its size, 64) bytes."""
        b = self.b
        given = given or {}

        def load(k):
            if k in given:
                return given[k]
            return self.load(k, in_off[k], strides[k], w, mask)

        for k, v in enumerate(_emit_instrs(b, self.spec, load, w, self.scalar)):
            p = b.gep(self.out_ptr[k], [out_off], inbounds=True)
            al = self.out_dt[k].size_in_bytes
            if w == 1:
                b.store(v, p, align=al)
            elif mask is None and streaming is not False:
                vp = b.bitcast(p, v.type.as_pointer())
                with b.if_else(streaming) as (nt, plain):
                    with nt:
                        st = b.store(v, vp, align=min(w * al, LINE))
                        st.set_metadata("nontemporal", self.m.add_metadata([I32(1)]))
                    with plain:
                        b.store(v, vp, align=al)
            elif mask is None:
                b.store(v, b.bitcast(p, v.type.as_pointer()), align=al)
            else:
                vt = v.type
                fn = intrinsic(self.m, f"llvm.masked.store.{type_suffix(vt)}.p0{type_suffix(vt)}", VOID,
                               [vt, vt.as_pointer(), I32, mask.type])
                b.call(fn, [v, b.bitcast(p, vt.as_pointer()), I32(al), mask])

    # -- loops ---------------------------------------------------------------------------
    def inner_loop(self, start, stop, in_base, out_base, strides, stream=None):
        """Lanes [start, stop) of the inner dim: W-wide vector body, then one masked vector
        step for the tail (no scalar copy of the expression).  With `stream` (an i1: the
        outputs are large, see streaming_wanted) and every output vector-aligned at `start`,
        the body's stores bypass the cache.  Runs that start unaligned keep plain stores: the
        pool splits on multiples of W and buffers.alloc blocks are line aligned, so only
        foreign buffers and odd row lengths do, and a masked head step to align them would
        cost a third copy of the expression in compile time."""
        b, W = self.b, self.W
        given = {}
        for k, s in enumerate(strides):      # broadcast inputs are loop-invariant: load once
            if s == 0:
                given[k] = splat(b, self.load(k, in_base[k], 0, 1), W)

        def offsets_at(i):
            return [self.sadd(base, i, s) for base, s in zip(in_base, strides)]

        vec_stop = b.add(start, b.mul(b.sdiv(b.sub(stop, start), I64(W)), I64(W)))
        flag = None if stream is None else b.zext(self.stream_aligned(stream, b.add(out_base, start)), I8)
        with counted_loop(b, start, vec_stop, W, "v") as i:
            nt = False if flag is None else b.icmp_unsigned("!=", opaque(b, flag), I8(0))
            self.eval_store(offsets_at(i), b.add(out_base, i), strides, W, given, streaming=nt)
        rem = b.sub(stop, vec_stop)
        with b.if_then(b.icmp_signed(">", rem, I64(0))):
            lanes = ir.Constant(ir.VectorType(I64, W), [I64(x) for x in range(W)])
            mask = b.icmp_signed("<", lanes, splat(b, rem, W))
            self.eval_store(offsets_at(vec_stop), b.add(out_base, vec_stop), strides, W, given, mask)

    # -- non-temporal stores ---------------------------------------------------------------
    def can_stream(self) -> bool:
        """Streaming needs whole vector stores of >= 16 bytes (a power of two) per output."""
        return bool(self.out_dt) and all(self.W * dt.size_in_bytes >= 16 and dt.size_in_bytes & (dt.size_in_bytes - 1) == 0
                                         for dt in self.out_dt)

    ROW_STREAMING = False       # which threshold of streaming_min_bytes applies

    def streaming_wanted(self):
        """i1 at entry: the outputs of the whole kernel (not this call's range) span at least
        streaming_min_bytes(), so they will not stay in cache for the next kernel anyway and
        need not be read into it first (read-for-ownership)."""
        b = self.b
        n = self.dims[0]
        for d in self.dims[1:]:
            n = b.mul(n, d)
        total = b.mul(n, I64(sum(dt.size_in_bytes for dt in self.out_dt)))
        return b.icmp_signed(">=", total, I64(streaming_min_bytes(self.ROW_STREAMING)))

    def store_fence(self):
        """sfence on x86 (a seq_cst fence there is a locked add, which Intel does not promise
        orders write-combining stores), else a seq_cst fence."""
        if self.m.triple.startswith(("x86_64", "i686", "i386")):
            self.b.call(intrinsic(self.m, "llvm.x86.sse.sfence", VOID, []), [])
        else:
            self.b.fence("seq_cst")

    def stream_aligned(self, stream, first):
        """stream and every output's element `first` on its streamed-store alignment,
        min(W * element size, LINE) bytes."""
        b = self.b
        bad = I64(0)
        for p, dt in zip(self.out_ptr, self.out_dt):
            e = dt.size_in_bytes
            addr = b.add(b.ptrtoint(p, I64), b.mul(first, I64(e)))
            bad = b.or_(bad, b.and_(addr, I64(min(self.W * e, LINE) - 1)))
        return b.and_(stream, b.icmp_unsigned("==", bad, I64(0)))

    def unravel(self, u, dims):
        """Index of each dim in `dims` (last fastest) for flat unit index u."""
        b = self.b
        idx = {}
        for d in reversed(dims[1:]):
            idx[d] = b.urem(u, self.dims[d])
            u = b.udiv(u, self.dims[d])
        if dims:
            idx[dims[0]] = u
        return idx

    def offsets(self, idx):
        in_base = []
        for st in self.strides:
            acc = I64(0)
            for d, i in idx.items():
                acc = self.sadd(acc, i, st[d])
            in_base.append(acc)
        out = I64(0)
        for d, i in idx.items():
            out = self.sadd(out, i, self.out_strides[d])
        return in_base, out

    def build_rows(self):
        lo, hi = unit_range(self.fn)
        rank, n_in = self.spec.rank, len(self.in_dt)
        stream = self.streaming_wanted() if self.can_stream() else None
        if rank == 1:
            self.inner_loop(lo, hi, [I64(0)] * n_in, I64(0), [s[0] for s in self.strides], stream)
        else:
            with counted_loop(self.b, lo, hi, 1, "row") as r:
                in_base, out_base = self.offsets(self.unravel(r, list(range(rank - 1))))
                self.inner_loop(I64(0), self.dims[-1], in_base, out_base, [s[-1] for s in self.strides], stream)
        if stream is not None:
            with self.b.if_then(stream):
                self.store_fence()          # the streamed stores are visible before we return

    def build_tiled(self, t):
        """Units are blocks of SB rows of dim t by SB columns of the inner dim (times the other
        outer dims), so a unit touches few pages of every operand (TLB) and reuses each cache
        line it loads.  Inside, full W x W tiles read inputs transposed w.r.t. the output as W
        contiguous vectors and transpose them in registers; the rest reads row by row; edges
        use the row path with its masked tail."""
        b, W, spec = self.b, self.W, self.spec
        lo, hi = unit_range(self.fn)
        j = spec.rank - 1
        SB = SUPER * W
        out_strides = self.out_strides
        others = [d for d in range(j) if d != t]
        dim_t, dim_j = self.dims[t], self.dims[j]
        n_ib = b.udiv(b.add(dim_t, I64(SB - 1)), I64(SB))
        n_jb = b.udiv(b.add(dim_j, I64(SB - 1)), I64(SB))
        jstr = [s[j] for s in self.strides]
        transposed = [k for k, (_, c) in enumerate(spec.inputs) if c[t] == 1 and c[j] == RUNTIME]
        with counted_loop(b, lo, hi, 1, "unit") as u:
            ib = b.urem(u, n_ib)
            rest = b.udiv(u, n_ib)
            jb = b.urem(rest, n_jb)
            idx = self.unravel(b.udiv(rest, n_jb), others) if others else {}
            i_lo = b.mul(ib, I64(SB))
            idx[t] = i_lo
            in_base, out_base = self.offsets(idx)
            i_n = b.select(b.icmp_signed("<", b.sub(dim_t, i_lo), I64(SB)), b.sub(dim_t, i_lo), I64(SB))
            j_lo = b.mul(jb, I64(SB))
            j_n = b.select(b.icmp_signed("<", b.sub(dim_j, j_lo), I64(SB)), b.sub(dim_j, j_lo), I64(SB))
            j_hi = b.add(j_lo, j_n)
            i_full = b.mul(b.sdiv(i_n, I64(W)), I64(W))
            j_vec = b.add(j_lo, b.mul(b.sdiv(j_n, I64(W)), I64(W)))
            with counted_loop(b, I64(0), i_full, W, "ib") as c0:
                base = [self.sadd(x, c0, s[t]) for x, s in zip(in_base, self.strides)]
                ob = self.sadd(out_base, c0, out_strides[t])
                with counted_loop(b, j_lo, j_vec, W, "j") as j0:
                    tiles = {}
                    for k in transposed:
                        rows = [self.load(k, self.sadd(base[k], b.add(j0, I64(r)), jstr[k]), 1, W)
                                for r in range(W)]
                        tiles[k] = _transpose(b, rows)
                    for c in range(W):
                        offs = [self.sadd(self.sadd(x, I64(c), s[t]), j0, s[j]) for x, s in zip(base, self.strides)]
                        oo = b.add(self.sadd(ob, I64(c), out_strides[t]), j0)
                        self.eval_store(offs, oo, jstr, W, {k: tiles[k][c] for k in transposed})
                with b.if_then(b.icmp_signed("<", j_vec, j_hi)):
                    with counted_loop(b, I64(0), I64(W), 1, "c") as c:
                        self._row(base, ob, c, t, out_strides, j_vec, j_hi)
            with counted_loop(b, i_full, i_n, 1, "r") as c:
                self._row(in_base, out_base, c, t, out_strides, j_lo, j_hi)

    def _row(self, in_base, out_base, c, t, out_strides, jstart, jstop):
        base = [self.sadd(x, c, s[t]) for x, s in zip(in_base, self.strides)]
        ob = self.sadd(out_base, c, out_strides[t])
        self.inner_loop(jstart, jstop, base, ob, [s[-1] for s in self.strides])


def build(spec: EwSpec, name: str = "ew") -> str:
    """LLVM IR text of the kernel `name` for `spec`."""
    k = _Kernel(spec, name)
    if spec.tile is None:
        k.build_rows()
    else:
        k.build_tiled(spec.tile)
    k.b.ret_void()
    return str(k.m)

