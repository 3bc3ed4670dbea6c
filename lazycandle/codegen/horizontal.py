"""Horizontal kernels (ir/horizontal.py HSpec): segments of one rank-1 elementwise kernel run
over their concatenated index space.  A call's range [lo, hi) counts elements of all segments
in order; the kernel walks the segment table (sizes: count, then each length), and for each
segment overlapping the range loads that segment's pointers and scalars and runs the rank-1
elementwise loop (codegen/elementwise.py: W-wide vector body and one masked tail) over its
part of the range.  So every segment computes exactly what its own kernel would, element for
element, and the pool's split balances the total, not each segment.  A segment whose outputs
are large streams its stores as its own kernel would (elementwise.streaming_min_bytes)."""
from __future__ import annotations

from .. import dtype as D
from ..ir.horizontal import HSpec
from .elementwise import _Kernel, load_scalars, streaming_min_bytes
from .fused import ew_lanes
from .llvmutil import I1, I64, ltype, splat
from .loops import counted_loop, kernel_function, new_module, unit_range


class _Segments(_Kernel):
    """An elementwise kernel whose pointers, scalars and length change per segment."""

    def __init__(self, spec: HSpec, name: str):
        ew = self.spec = spec.ew
        self.m = new_module(name)
        self.fn, self.b = kernel_function(self.m, name)
        self.in_dt = [D.DType.from_name(dt) for dt, _ in ew.inputs]
        self.out_dt = [D.DType.from_name(dt) for _, dt in ew.outputs]
        self.W = ew_lanes(ew)

    def _segment_args(self, s, count):
        """Point the emitter at segment s: its input and output pointers and its scalars."""
        b, (bufs, _, scalars) = self.b, self.fn.args[:3]
        n_in, n_out, n_sc = len(self.in_dt), len(self.out_dt), len(self.spec.scalars)

        def ptr(at, dt):
            raw = b.load(b.gep(bufs, [at], inbounds=True))
            return b.bitcast(raw, ltype(dt.storage).as_pointer())
        first_in, first_out = b.mul(s, I64(n_in)), b.add(b.mul(count, I64(n_in)), b.mul(s, I64(n_out)))
        self.in_ptr = [ptr(b.add(first_in, I64(k)), dt) for k, dt in enumerate(self.in_dt)]
        self.out_ptr = [ptr(b.add(first_out, I64(k)), dt) for k, dt in enumerate(self.out_dt)]
        if n_sc:
            own = b.gep(scalars, [b.mul(s, I64(n_sc))], inbounds=True)
            self.scalar_vals = load_scalars(b, own, self.spec.scalars)
            self.scalar_splats = {(k, self.W): splat(b, v, self.W) for k, v in enumerate(self.scalar_vals)}

    def build_segments(self):
        b, sizes = self.b, self.fn.args[1]
        lo, hi = unit_range(self.fn)
        count = b.load(sizes, align=8)
        start_at = b.alloca(I64)
        b.store(I64(0), start_at)
        strides = [cls[0] for _, cls in self.spec.inputs]
        streamed = b.alloca(I1) if self.can_stream() else None
        if streamed is not None:
            b.store(I1(0), streamed)
        with counted_loop(b, I64(0), count, 1, "seg") as s:
            start = b.load(start_at)
            n = b.load(b.gep(sizes, [b.add(s, I64(1))], inbounds=True), align=8)
            b.store(b.add(start, n), start_at)
            first, stop = b.sub(lo, start), b.sub(hi, start)
            first = b.select(b.icmp_signed(">", first, I64(0)), first, I64(0))
            stop = b.select(b.icmp_signed("<", stop, n), stop, n)
            with b.if_then(b.icmp_signed("<", first, stop)):
                self._segment_args(s, count)
                stream = None
                if streamed is not None:
                    stream = self.segment_streams(n)
                    b.store(b.or_(b.load(streamed), stream), streamed)
                self.inner_loop(first, stop, [I64(0)] * len(self.in_dt), I64(0), strides, stream)
        if streamed is not None:
            with b.if_then(b.load(streamed)):
                self.store_fence()          # the streamed stores are visible before we return
        b.ret_void()

    def segment_streams(self, n):
        """i1: a segment of n elements writes at least streaming_min_bytes() (its own kernel
        would stream its stores)."""
        nbytes = self.b.mul(n, I64(sum(dt.size_in_bytes for dt in self.out_dt)))
        return self.b.icmp_signed(">=", nbytes, I64(streaming_min_bytes()))


def build(spec: HSpec, name: str = "hew") -> str:
    """LLVM IR text of the kernel `name` for `spec`."""
    k = _Segments(spec, name)
    k.build_segments()
    return str(k.m)
