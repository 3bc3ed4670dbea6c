"""LLVM kernel of argsort: a stable sort of each row, rows independent (the kernel ABI of
codegen/loops.py over rows; bufs = [ids out, input, workspace]; the row length, the outer
sizes and non-unit strides are run-time values, codegen/sizes_arg.py, and the network is
compiled per power-of-two padded length).

Each element becomes one unsigned integer, the *composite* `key << 32 | index << 1 | z`, where
`key` is an order-preserving unsigned image of the value and z is set for a float -0:
  * unsigned ints: the bits; signed ints: the bits with the sign bit flipped;
  * floats (any sign-magnitude format, read through the dtype's codec for NaN tests): -0 is
    made +0 (they compare equal, so their order must stay the input order), then negative
    values have all bits flipped and positive ones the sign bit set; NaN is the largest key.
  * descending: the key is complemented, so NaN (largest) comes first and ties still keep
    ascending indices.
Composites are all distinct and ties are broken by the index, so ANY correct sort of the
composites is the stable sort of the values.  Keys of <= 32 bits make an i64 composite (rows
shorter than 2**31), the 64-bit dtypes (or longer rows) an i128 one.  The sorted values are
decoded from the composites (the key's inverse; z restores -0); only a NaN, whose payload the
key drops, is read back from the input at its id.

The row is written to the workspace (padded to a power of two N with all-ones composites,
which sort after every real element) and sorted by a bitonic network: compare-exchange is an
unsigned min/max on vectors of W composites (W = vector register / 64 bits; 1 for i128).
Stages whose partners lie more than a register block apart are passes over pairs of vectors;
the rest run on blocks held in registers, one pass per merge size.  With i64 composites and
at least W*W elements the blocks are square (W vectors of W lanes) and are transposed between
stages so that nearly every compare-exchange is a whole-register min/max (see the square-block
notes below); otherwise in-vector stages are lane shuffles.  The low 32 bits of the sorted
composites, shifted down by one, are the ids.  Late merges are unrolled: their long-distance
stages run in register groups of up to three stages, then one square-block pass.  Output rows
whose start is vector aligned are written with non-temporal stores.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import llvmlite.ir as ir

from .. import dtype as D
from . import codecs, jit, registry, sizes_arg as SA
from .llvmutil import I1, I32, I64, ltype
from .loops import KERNEL_FN, new_module, kernel_function, arg_pointer, counted_loop, unit_range
from ..ir.kernels import KernelSpec



@dataclass(frozen=True)
class SortSpec(KernelSpec):
    """Shape class of one argsort kernel (also its cache key): rows over `rank` merged outer
    dims (their stride classes, then the class of the step between a row's elements), rows
    padded to the power of two `padded`; ids are written contiguously, n per row.  Sizes
    (`sort_kernel`): the outer sizes, n, then the RUNTIME strides.  A new row length of the
    same power-of-two class reuses the kernel."""
    dtype: str
    padded: int
    wide: bool                # i128 composites (64-bit keys, or rows of 2**31 or more)
    rank: int
    strides: tuple            # stride classes of the outer dims, then of the row's step
    descending: bool
    id_dtype: str
    vector_bits: int          # the host's widest vectors (part of the key: it shapes the network)
    values: bool = False      # also write the sorted values (ptrs[3]), read back at the ids

    @property
    def comp_bits(self) -> int:
        return 128 if self.wide else 64

    @property
    def width(self) -> int:
        w = self.vector_bits // 64 if self.comp_bits == 64 else 1
        return min(w, self.padded)

    @property
    def workspace_bytes(self) -> int:
        return self.padded * self.comp_bits // 8

    @property
    def row_cost(self) -> float:
        lg = max(self.padded.bit_length() - 1, 1)
        return float(self.padded * lg * (lg + 1) // 2)

    def extent(self, sizes) -> int:
        return prod(sizes[:self.rank])

    def cost(self, sizes) -> float:
        return self.extent(sizes) * self.row_cost

    def describe(self) -> str:
        return (f"argsort of {self.dtype} rows padded to {self.padded}"
                f"{' (descending)' if self.descending else ''}")


def sort_kernel(dt: D.DType, outer, outer_strides, n, step, descending, id_dt: D.DType, values=False):
    """(SortSpec, sizes) of sorting rows of n elements `step` apart over `outer` (sizes, strides)."""
    n = int(n)
    strides = tuple(outer_strides) + (int(step),)
    spec = SortSpec(dt.name, 1 << max(n - 1, 0).bit_length(), dt.bits > 32 or n >= 1 << 31, len(outer),
                    SA.classes(strides), bool(descending), id_dt.name, jit.vector_bits(), bool(values))
    return spec, tuple(outer) + (n,) + SA.runtime_values(strides)


# ---- keys --------------------------------------------------------------------------------
def _key(b, dt: D.DType, stored, descending: bool):
    """(key, negative zero) of one stored value: the order-preserving unsigned key (an integer
    of the dtype's width) and an i1 that is set for a float -0 (whose key is +0's)."""
    it = ir.IntType(dt.bits)
    raw = stored if isinstance(stored.type, ir.IntType) else b.bitcast(stored, it)
    sign = ir.Constant(it, 1 << (dt.bits - 1))
    neg_zero = ir.Constant(I1, 0)
    if dt.is_int:
        key = b.xor(raw, sign) if dt.is_signed else raw
    else:
        value = codecs.decode(b, dt.codec, stored) if dt.codec else stored
        is_nan = b.fcmp_unordered("uno", value, value)
        mag = b.and_(raw, ir.Constant(it, (1 << (dt.bits - 1)) - 1))
        is_zero = b.icmp_unsigned("==", mag, ir.Constant(it, 0))
        neg_zero = b.and_(is_zero, b.icmp_unsigned("!=", raw, ir.Constant(it, 0)))
        raw = b.select(is_zero, ir.Constant(it, 0), raw)
        neg = b.icmp_unsigned("!=", b.and_(raw, sign), ir.Constant(it, 0))
        key = b.select(neg, b.xor(raw, ir.Constant(it, -1)), b.or_(raw, sign))
        key = b.select(is_nan, ir.Constant(it, -1), key)
    return (b.xor(key, ir.Constant(it, -1)) if descending else key), neg_zero


def _composite(b, key, index, neg_zero, ct: ir.IntType):
    """key in the high half, then the index, then the -0 bit (below the distinct indices, so
    it never decides an order; the values are decoded from key and bit)."""
    shift = ct.width // 2
    low = b.or_(b.shl(b.zext(index, ct), ir.Constant(ct, 1)), b.zext(neg_zero, ct))
    return b.or_(b.shl(b.zext(key, ct), ir.Constant(ct, shift)), low)


def _splat(t, value):
    return ir.Constant(t, [ir.Constant(t.element, value)] * t.count) if isinstance(t, ir.VectorType) else ir.Constant(t, value)


def _like(t, elem):
    """`elem` with the lane count of `t` (a vector type or a scalar)."""
    return ir.VectorType(elem, t.count) if isinstance(t, ir.VectorType) else elem


def _decode(b, dt: D.DType, comps, descending: bool):
    """(raw value bits, is NaN) of composites (a scalar or a vector): the inverse of _key; -0
    comes back from its bit, a NaN's payload cannot (the caller reads it from the input)."""
    ct = comps.type
    kt = _like(ct, ir.IntType(dt.bits))
    key = b.trunc(b.lshr(comps, _splat(ct, ct.element.width // 2 if isinstance(ct, ir.VectorType) else ct.width // 2)), kt)
    if descending:
        key = b.xor(key, _splat(kt, -1))
    sign = _splat(kt, 1 << (dt.bits - 1))
    if dt.is_int:
        return (b.xor(key, sign) if dt.is_signed else key), None
    is_nan = b.icmp_unsigned("==", key, _splat(kt, (1 << dt.bits) - 1))
    was_pos = b.icmp_unsigned("!=", b.and_(key, sign), _splat(kt, 0))
    raw = b.select(was_pos, b.xor(key, sign), b.xor(key, _splat(kt, -1)))
    neg_zero = b.trunc(comps, _like(ct, I1))
    return b.select(neg_zero, sign, raw), is_nan


# ---- the network -------------------------------------------------------------------------
# Bitonic merge in its "flip" form, so every compare-exchange puts the minimum first and no
# direction has to be computed: merging two sorted halves of a block of k first compares
# element i with k-1-i, then runs half-cleaners (i with i+j, j = k/4 .. 1).
def _minmax(b, x, y):
    """(min, max); max as x ^ y ^ min, one ternary-logic op that runs on either vector port
    where a 64-bit vector max has only one (15% faster on AVX-512)."""
    mn = b.select(b.icmp_unsigned("<", x, y), x, y)
    return mn, b.xor(b.xor(x, y), mn)


def _lane_const(t, values):
    return ir.Constant(t, [ir.Constant(t.element, v) for v in values])


def _lane_round(b, v, W, partner, lower):
    """Compare-exchange of lane l with lane partner[l]; lanes with lower[l] keep the minimum."""
    other = b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), _lane_const(ir.VectorType(I32, W), partner))
    mn, mx = _minmax(b, v, other)
    return b.select(_lane_const(ir.VectorType(I1, W), [int(x) for x in lower]), mn, mx)


def _lane_merge(b, v, W, k):
    """The stages of a merge of size k that stay inside one vector: the flip when k <= W, then
    the half-cleaners with j < W."""
    if k <= W:
        v = _lane_round(b, v, W, [l ^ (k - 1) for l in range(W)], [(l & (k // 2)) == 0 for l in range(W)])
        j = k // 4
    else:
        j = W // 2
    while j >= 1:
        v = _lane_round(b, v, W, [l ^ j for l in range(W)], [(l & j) == 0 for l in range(W)])
        j //= 2
    return v


def _reverse(b, v, W):
    if W == 1:
        return v
    return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                            _lane_const(ir.VectorType(I32, W), list(range(W - 1, -1, -1))))


def _block_pass(b, ws_v, nvec, W, G, stages):
    """One pass over blocks of G vectors held in registers, running `stages` on each block:
    ("flip", k) / ("half", j) compare-exchange whole vectors inside the block (k, j >= W;
    the flip pairs a vector with the lane-reversed mirror one), ("lanes", k) the in-vector
    stages of a merge of size k."""
    with counted_loop(b, I64(0), I64(nvec // G), 1, "block") as q:
        ps = [b.gep(ws_v, [b.add(b.mul(q, I64(G)), I64(g))], inbounds=True) for g in range(G)]
        v = [b.load(p, align=8) for p in ps]
        for kind, size in stages:
            if kind == "lanes":
                v = [_lane_merge(b, x, W, size) for x in v]
                continue
            span = size // W                     # vectors per group of the stage
            for g0 in range(0, G, span if kind == "flip" else 2 * span):
                pairs = ([(g0 + i, g0 + span - 1 - i) for i in range(span // 2)] if kind == "flip"
                         else [(g0 + i, g0 + i + span) for i in range(span)])
                for lo_i, hi_i in pairs:
                    y = _reverse(b, v[hi_i], W) if kind == "flip" else v[hi_i]
                    mn, mx = _minmax(b, v[lo_i], y)
                    v[lo_i], v[hi_i] = mn, (_reverse(b, mx, W) if kind == "flip" else mx)
        for x, p in zip(v, ps):
            b.store(x, p, align=8)


def _pair_pass(b, ws_v, N, W, shift, flip):
    """Compare-exchange of vectors 2**shift vectors apart, in groups of 2**(shift+1) vectors;
    flip: each vector of a group's first half with the lane-reversed mirror vector of the
    group (element i of a merge block with element k-1-i).  `shift` may be a run-time value."""
    shift = I64(shift) if isinstance(shift, int) else shift
    per_block = b.shl(I64(1), shift)
    with counted_loop(b, I64(0), I64(N // (2 * W)), 1, "pairs") as t:
        base = b.shl(b.lshr(t, shift), b.add(shift, I64(1)))
        off = b.and_(t, b.sub(per_block, I64(1)))
        a_idx = b.add(base, off)
        if flip:
            b_idx = b.sub(b.add(base, b.sub(b.shl(per_block, I64(1)), I64(1))), off)
        else:
            b_idx = b.add(a_idx, per_block)
        pa, pb = b.gep(ws_v, [a_idx], inbounds=True), b.gep(ws_v, [b_idx], inbounds=True)
        x, y = b.load(pa, align=8), b.load(pb, align=8)
        if flip:
            y = _reverse(b, y, W)
        mn, mx = _minmax(b, x, y)
        b.store(mn, pa, align=8)
        b.store(_reverse(b, mx, W) if flip else mx, pb, align=8)


def _log2(x: int) -> int:
    return x.bit_length() - 1


def _late_merges(b, ws_v, N, W, k_from, lowest, in_register):
    """Merges of size k = k_from .. N as ONE run-time loop over log2 k (their code does not
    depend on k, so the kernel's size does not grow with N): the flip and the half-cleaners
    down to distance `lowest` as vector-pair passes, then `in_register()` for the rest."""
    if k_from > N:
        return
    lw, ll = _log2(W), _log2(lowest)
    with counted_loop(b, I64(_log2(k_from)), I64(_log2(N) + 1), 1, "merge") as lk:
        _pair_pass(b, ws_v, N, W, b.sub(lk, I64(1 + lw)), flip=True)
        with counted_loop(b, I64(0), b.sub(lk, I64(1 + ll)), 1, "half") as m:
            _pair_pass(b, ws_v, N, W, b.sub(b.sub(lk, I64(2 + lw)), m), flip=False)
        in_register()


def _in_block_stages(k, W, B):
    """The stages of a merge of size k whose partners lie inside one block of B elements."""
    if k <= W:
        return [("lanes", k)]
    stages = []
    if k <= B:
        stages.append(("flip", k))
        j = k // 4
    else:
        j = B // 2
    while j >= W:
        stages.append(("half", j))
        j //= 2
    return stages + ([("lanes", k)] if W > 1 else [])


# Square blocks (W vectors of W lanes, W*W elements) sit in registers either row-major
# (element e is lane e % W of register e // W) or column-major (lane e // W of register e % W).
# A compare-exchange at element distance d is a whole-register min/max when d is a register
# distance of the current layout, else a lane round (shuffle, min, max, blend).  The first
# pass sorts each block column-major (distances < W are registers) and ends row-major; every
# later merge runs its distances >= W row-major, transposes, runs the rest column-major and
# transposes back, so no lane rounds remain after the first pass.
def _lane_perm(b, v, W, perm):
    return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), _lane_const(ir.VectorType(I32, W), perm))


def _square_stage(b, R, W, kind, size, col_major):
    """One stage on a square block R (a list of W vectors); `size` in elements."""
    reg = size < W if col_major else size >= W          # partners are whole registers
    d = size if size < W else size // W                  # the distance in registers or lanes
    if reg:
        for r in range(W):
            if kind == "flip" and r & (size // 2) == 0:       # only col-major, size <= W
                R[r], R[r ^ (size - 1)] = _minmax(b, R[r], R[r ^ (size - 1)])
            elif kind == "half" and r & d == 0:
                R[r], R[r + d] = _minmax(b, R[r], R[r + d])
        return
    if kind == "half":                                  # partners are lanes of the same register
        for r in range(W):
            R[r] = _lane_round(b, R[r], W, [l ^ d for l in range(W)], [(l & d) == 0 for l in range(W)])
        return
    m = size // W - 1                                   # column-major flip: registers r, W-1-r, lanes l ^ m
    lower = _lane_const(ir.VectorType(I1, W), [int((l & ((m + 1) // 2)) == 0) for l in range(W)])
    perm = [l ^ m for l in range(W)]
    for r in range(W // 2):
        q = W - 1 - r
        mn, mx = _minmax(b, R[r], _lane_perm(b, R[q], W, perm))
        R[r], R[q] = b.select(lower, mn, mx), _lane_perm(b, b.select(lower, mx, mn), W, perm)


def _transpose(b, R, W):
    """Swap register and lane index bits, one bit per round (W * log2 W two-input shuffles)."""
    s = 1
    while s < W:
        for r in range(W):
            if r & s:
                continue
            a, c = R[r], R[r | s]
            lo = [l if not l & s else W + (l ^ s) for l in range(W)]
            hi = [(l ^ s) if not l & s else W + l for l in range(W)]
            R[r] = b.shuffle_vector(a, c, _lane_const(ir.VectorType(I32, W), lo))
            R[r | s] = b.shuffle_vector(a, c, _lane_const(ir.VectorType(I32, W), hi))
        s *= 2


def _run_square(b, R, W, stages, col_major):
    for kind, size in stages:
        if kind == "transpose":
            _transpose(b, R, W)
            col_major = not col_major
        else:
            _square_stage(b, R, W, kind, size, col_major)
    assert not col_major


def _square_pass(b, ws_v, nvec, W, stages, col_major, cross=None):
    """One pass over square blocks; `stages` may contain ("transpose", 0), which flips the
    layout; blocks start in the layout `col_major` says and end row-major.  With `cross`
    ("flip" or "half"), blocks come in pairs that first compare-exchange with each other
    (row-major) at a distance of one block."""
    per = 2 if cross else 1
    with counted_loop(b, I64(0), I64(nvec // (W * per)), 1, "square") as q:
        ps = [b.gep(ws_v, [b.add(b.mul(q, I64(W * per)), I64(g))], inbounds=True) for g in range(W * per)]
        R = [b.load(p, align=8) for p in ps]
        if cross:
            for r in range(W):
                o = W + (W - 1 - r if cross == "flip" else r)
                y = _reverse(b, R[o], W) if cross == "flip" else R[o]
                mn, mx = _minmax(b, R[r], y)
                R[r], R[o] = mn, (_reverse(b, mx, W) if cross == "flip" else mx)
        for blk in range(per):
            part = R[blk * W:(blk + 1) * W]
            _run_square(b, part, W, stages, col_major)
            for x, p in zip(part, ps[blk * W:(blk + 1) * W]):
                b.store(x, p, align=8)


def _merge_in(k, B):
    """Stages of a merge of size k with element distances below B (the flip first if k <= B)."""
    stages = [("flip", k)] if k <= B else []
    j = k // 4 if k <= B else B // 2
    while j >= 1:
        stages.append(("half", j))
        j //= 2
    return stages


def _square_merge(k, W):
    """A later merge's in-register stages: distances >= W row-major, the rest column-major."""
    st = _merge_in(k, W * W)
    wide = [s for s in st if s[1] >= W]
    return wide + [("transpose", 0)] + [s for s in st if s[1] < W] + [("transpose", 0)]


def _grouped_pass(b, ws_v, nvec, W, K, S, s, flip):
    """`s` consecutive long-distance stages of merges of K vectors, in registers: vector
    distances S * 2**(s-1) .. S (with `flip`, the first stage is the merge's flip and the group
    also holds the mirror vectors, S-1-lo + S*g, so the flip pairs stay inside it)."""
    G = 1 << s
    per = S // 2 if flip else S
    count = (nvec // K) * per if flip else (nvec // (S * G)) * S
    with counted_loop(b, I64(0), I64(count), 1, "group") as t:
        q, lo = b.udiv(t, I64(per)), b.urem(t, I64(per))
        base = b.mul(q, I64(K if flip else S * G))
        starts = [b.add(base, lo)] + ([b.add(base, b.sub(I64(S - 1), lo))] if flip else [])
        ps = [[b.gep(ws_v, [b.add(st, I64(S * g))], inbounds=True) for g in range(G)] for st in starts]
        v = [[b.load(p, align=8) for p in part] for part in ps]
        halves = range(s - 1, -1, -1)
        if flip:
            for lo_part, hi_part, gs in ((0, 1, range(G // 2)), (1, 0, range(G // 2))):
                for g in gs:
                    x, y = v[lo_part][g], _reverse(b, v[hi_part][G - 1 - g], W)
                    mn, mx = _minmax(b, x, y)
                    v[lo_part][g], v[hi_part][G - 1 - g] = mn, _reverse(b, mx, W)
            halves = range(s - 2, -1, -1)
        for j in halves:
            for part in v:
                for g in range(G):
                    if not g >> j & 1:
                        part[g], part[g + (1 << j)] = _minmax(b, part[g], part[g + (1 << j)])
        for part, pp in zip(v, ps):
            for x, p in zip(part, pp):
                b.store(x, p, align=8)


def _square_late_merges(b, ws_v, nvec, W, N):
    """Merges of size 4*W*W .. N, each unrolled: its stages at vector distances >= 2W in
    register groups of up to three stages (the flip's group first), then one square pass."""
    k = 4 * W * W
    while k <= N:
        K = k // W
        dists = []
        d = K // 4
        while d >= 2 * W:
            dists.append(d)
            d //= 2
        first = dists[:2]
        _grouped_pass(b, ws_v, nvec, W, K, first[-1] if first else K // 2, 1 + len(first), True)
        rest = dists[2:]
        for c in range(0, len(rest), 3):
            chunk = rest[c:c + 3]
            _grouped_pass(b, ws_v, nvec, W, K, chunk[-1], len(chunk), False)
        _square_pass(b, ws_v, nvec, W, _square_merge(N, W), False, "half")
        k *= 2


def _bitonic(b, ws, ct, N, W):
    """Sort ws[0:N] (N a power of two): one register pass sorts every block of B elements,
    then each larger merge runs its long-distance stages as vector-pair passes and the rest in
    one register pass."""
    if N < 2:
        return
    vt = ct if W == 1 else ir.VectorType(ct, W)
    ws_v = b.bitcast(ws, vt.as_pointer())
    nvec = N // W
    square = W > 1 and nvec >= W
    G = W if square else min(8 if W > 1 else 4, nvec)
    B = G * W
    first, k = [], 2
    while k <= B:
        first += _merge_in(k, B) if square else _in_block_stages(k, W, B)
        k *= 2
    if not square:
        _block_pass(b, ws_v, nvec, W, G, first)
        _late_merges(b, ws_v, N, W, 2 * B, B, lambda: _block_pass(b, ws_v, nvec, W, G, _in_block_stages(N, W, B)))
        return
    _square_pass(b, ws_v, nvec, W, first + [("transpose", 0)], col_major=True)
    if N >= 2 * B:                    # square passes take blocks in pairs: one more stage each
        _square_pass(b, ws_v, nvec, W, _square_merge(2 * B, W), False, "flip")
    _square_late_merges(b, ws_v, nvec, W, N)


# ---- the kernel --------------------------------------------------------------------------
def _vector_bytes(t) -> int:
    return t.count * t.element.width // 8 if isinstance(t, ir.VectorType) else t.width // 8


def _store(b, value, ptr, align, streaming):
    if not streaming:
        b.store(value, ptr, align=align)
        return
    st = b.store(value, ptr, align=_vector_bytes(value.type))
    st.set_metadata("nontemporal", b.module.add_metadata([I32(1)]))


def _write_out(b, spec, dt, id_t, comps, at, ptrs, row_src, step, streaming=False):
    """Ids (and the values, decoded from the keys) of consecutive composites `comps` (one
    vector or one scalar) to output position `at`.  A NaN's bits are read back from the input
    at its id (its payload is not in the key); that branch is taken only where a NaN is.
    `streaming`: non-temporal stores (whole aligned vectors; the outputs are not read soon,
    so they need not be read into the cache first)."""
    ct = comps.type
    lanes = ct.count if isinstance(ct, ir.VectorType) else 1
    out, vals, raw_src = ptrs
    hw = (ct.element.width if lanes > 1 else ct.width) // 2
    half = _like(ct, ir.IntType(hw))
    idx = b.lshr(b.trunc(comps, half), _splat(half, 1))
    it = _like(ct, id_t)
    if id_t.width != hw:
        idx = (b.trunc if id_t.width < hw else b.zext)(idx, it)
    _store(b, idx, b.bitcast(b.gep(out, [at], inbounds=True), it.as_pointer()), id_t.width // 8, streaming)
    if vals is None:
        return
    raw, is_nan = _decode(b, dt, comps, spec.descending)
    rt = _like(ct, ir.IntType(8 * dt.size_in_bytes))
    _store(b, raw, b.bitcast(b.gep(vals, [at], inbounds=True), rt.as_pointer()), dt.size_in_bytes, streaming)
    if is_nan is None:
        return
    any_nan = b.icmp_unsigned("!=", b.bitcast(is_nan, ir.IntType(lanes)), ir.Constant(ir.IntType(lanes), 0))
    with b.if_then(any_nan, likely=False):
        for lane in range(lanes):
            j = b.extract_element(idx, I32(lane)) if lanes > 1 else idx
            j = b.zext(j, I64) if j.type.width < 64 else j
            src_at = b.add(row_src, SA.scaled(b, j, step))
            v = b.load(b.gep(raw_src, [src_at], inbounds=True), align=dt.size_in_bytes)
            b.store(v, b.gep(vals, [b.add(at, I64(lane))], inbounds=True), align=dt.size_in_bytes)


def build_sort(spec: SortSpec, name: str = "argsort") -> str:
    dt, id_dt = D.DType.from_name(spec.dtype), D.DType.from_name(spec.id_dtype)
    ct = ir.IntType(spec.comp_bits)
    index_t = ir.IntType(spec.comp_bits // 2)
    N, W = spec.padded, spec.width
    m = new_module(name)
    fn, b = kernel_function(m, name)
    ptrs, (lo, hi) = fn.args[0], unit_range(fn)
    out = arg_pointer(b, ptrs, 0, ltype(id_dt.storage), "ids")
    src = arg_pointer(b, ptrs, 1, ltype(dt.storage), "src")
    ws = arg_pointer(b, ptrs, 2, ct, "ws")
    raw_t = ir.IntType(8 * dt.size_in_bytes)
    vals = raw_src = None
    if spec.values:
        vals = arg_pointer(b, ptrs, 3, raw_t, "vals")
        raw_src = b.bitcast(src, raw_t.as_pointer())
    sz = SA.SizesReader(b, fn)
    outer, n = sz.many(spec.rank, "outer"), sz.next("n")
    strides = sz.strides(spec.strides)
    step = strides[-1]
    id_t = ltype(id_dt.storage)
    vt = ir.VectorType(ct, W) if W > 1 else ct
    whole = b.udiv(n, I64(W))
    with counted_loop(b, lo, hi, 1, "row") as r:
        base = SA.dot(b, SA.unravel(b, r, outer), strides[:-1])
        with counted_loop(b, I64(0), n, 1, "load") as i:
            at = b.add(base, SA.scaled(b, i, step))
            stored = b.load(b.gep(src, [at], inbounds=True), align=dt.size_in_bytes)
            key, neg_zero = _key(b, dt, stored, spec.descending)
            c = _composite(b, key, b.trunc(i, index_t), neg_zero, ct)
            b.store(c, b.gep(ws, [i], inbounds=True), align=8)
        with counted_loop(b, n, I64(N), 1, "pad") as i:
            b.store(ir.Constant(ct, -1), b.gep(ws, [i], inbounds=True), align=8)
        _bitonic(b, ws, ct, N, W)
        row_out = b.mul(r, n)
        sinks = (out, vals, raw_src)
        ws_v = b.bitcast(ws, vt.as_pointer())
        def store_vectors(streaming):
            with counted_loop(b, I64(0), whole, 1, "store") as j:
                c = b.load(b.gep(ws_v, [j], inbounds=True), align=8)
                _write_out(b, spec, dt, id_t, c, b.add(row_out, b.mul(j, I64(W))), sinks, base, step, streaming)

        if W > 1:
            firsts = [b.gep(out, [row_out])] + ([b.gep(vals, [row_out])] if vals is not None else [])
            widths = [W * id_dt.size_in_bytes] + ([W * dt.size_in_bytes] if vals is not None else [])
            misaligned = I64(0)
            for p_, w_ in zip(firsts, widths):
                misaligned = b.or_(misaligned, b.and_(b.ptrtoint(p_, I64), I64(w_ - 1)))
            if not all(w_ in (16, 32, 64) for w_ in widths):
                misaligned = I64(1)
            with b.if_else(b.icmp_unsigned("==", misaligned, I64(0))) as (aligned, other):
                with aligned:
                    store_vectors(True)
                with other:
                    store_vectors(False)
        else:
            store_vectors(False)
        with counted_loop(b, b.mul(whole, I64(W)), n, 1, "tail") as i:
            c = b.load(b.gep(ws, [i], inbounds=True), align=8)
            _write_out(b, spec, dt, id_t, c, b.add(row_out, i), sinks, base, step)
    b.fence("seq_cst")          # the non-temporal stores are visible before the kernel returns
    b.ret_void()
    return str(m)


@dataclass(frozen=True)
class TakeSpec(SA.OuterRows, KernelSpec):
    """Values of a sort: out[r, i] = row r of the input at ids[r, i] (ids from argsort, so in
    range by construction).  A raw copy of `esize`-byte elements; rows over `rank` merged
    outer dims with stride classes `strides` (outer dims, then the row's step).  Sizes
    (`take_kernel`): the outer sizes, n, then the RUNTIME strides."""
    esize: int
    rank: int
    strides: tuple

    def describe(self) -> str:
        return f"sorted values of {self.esize}-byte elements read at their ids"


def take_kernel(esize, outer, outer_strides, n, step):
    """(TakeSpec, sizes) of reading rows of n elements `step` apart over `outer` at their ids."""
    strides = tuple(outer_strides) + (int(step),)
    return TakeSpec(esize, len(outer), SA.classes(strides)), tuple(outer) + (int(n),) + SA.runtime_values(strides)


def build_take(spec: TakeSpec, name: str = "take") -> str:
    et = ir.IntType(8 * spec.esize)
    m = new_module(name)
    fn, b = kernel_function(m, name)
    ptrs, (lo, hi) = fn.args[0], unit_range(fn)
    out = arg_pointer(b, ptrs, 0, et, "out")
    src = arg_pointer(b, ptrs, 1, et, "src")
    ids = arg_pointer(b, ptrs, 2, I32, "ids")
    sz = SA.SizesReader(b, fn)
    outer, n = sz.many(spec.rank, "outer"), sz.next("n")
    strides = sz.strides(spec.strides)
    with counted_loop(b, lo, hi, 1, "row") as r:
        base = SA.dot(b, SA.unravel(b, r, outer), strides[:-1])
        row_out = b.mul(r, n)
        with counted_loop(b, I64(0), n, 1, "take") as i:
            at = b.add(row_out, i)
            j = b.zext(b.load(b.gep(ids, [at], inbounds=True), align=4), I64)
            v = b.load(b.gep(src, [b.add(base, SA.scaled(b, j, strides[-1]))], inbounds=True), align=spec.esize)
            b.store(v, b.gep(out, [at], inbounds=True), align=spec.esize)
    b.ret_void()
    return str(m)


_BUILDERS = {SortSpec: (build_sort, "argsort"), TakeSpec: (build_take, "take")}


def _build(spec):
    build, name = _BUILDERS[type(spec)]
    return build(spec, name), name


_kernels = jit.KernelCache(_build, KERNEL_FN)


def get_kernel(spec):
    """(CompiledModule, ctypes function) for a spec, from the one kernel cache of jit.py."""
    fn = _kernels(spec)
    return fn._module, fn
for _cls in _BUILDERS:
    registry.register(_cls, lambda spec: _build(spec)[0], _kernels)
