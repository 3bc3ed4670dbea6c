"""Step of flash_attention: `setup` compiles the kernel for the operands' dtype, head dims and
mask kind (once per structure: sizes and strides go in the run-time `sizes` array) and builds
that array from the plan's layouts; `run_node` folds the operands' offsets into the pointers and
runs the (batch, head, query block) units over the thread pool."""
from __future__ import annotations

import ctypes
import struct
from math import prod

import numpy as np

from ..codegen import attention as A
from . import pool
from .buffers import address
from .steps import NodeStep, register


@register("flash_attention")
class FlashAttentionStep(NodeStep):
    def setup(self, cap):
        causal, mask_kind, scale = self.arg
        (_, _, _, lq, dt), (_, _, _, lk, _), (_, _, _, lv, _) = self.operands[:3]
        B, H, L, E = lq.shape
        S, EV = lk.shape[2], lv.shape[3]
        self.spec = A.attention_spec(dt, E, EV, causal, mask_kind, L)
        nqb = -(-L // self.spec.bq)
        lm = self.operands[3][3] if mask_kind is not None else None
        mstr = tuple(lm.strides) if lm is not None else (0, 0, 0, 0)
        if (lv.strides[3] != 1 and EV > 1) or (lk.strides[3] != 1 and E > 1):
            raise ValueError(f"flash_attention: k and v need a contiguous last dim, got strides {lk.strides} "
                             f"and {lv.strides}")
        vals = {"H": H, "L": L, "S": S, "nqb": nqb}
        for p, st in (("q", lq.strides), ("k", lk.strides), ("v", lv.strides)):
            vals[f"{p}_b"], vals[f"{p}_h"] = st[0], st[1]
        vals["q_l"], vals["q_e"], vals["k_s"], vals["k_e"], vals["v_s"] = (lq.strides[2], lq.strides[3],
                                                                            lk.strides[2], lk.strides[3], lv.strides[2])
        vals["m_b"], vals["m_h"], vals["m_l"], vals["m_s"] = mstr
        self.sizes = np.array([vals[n] for n in A.SIZES], np.int64)
        self.scalars = np.array(struct.unpack("<q", struct.pack("<d", float(scale))), np.int64)
        self.units = B * H * nqb
        self.cost = float(self.spec.bq * max(S, 1) * (E + EV) * 2)
        self.fn = None
        if prod(self.shape) > 0:
            self.module, self.fn = A.get_kernel(self.spec)
        s = self.spec
        tiles = (f"score vectors of {s.width} keys, dot products over E in {s.we} lanes" if s.mode == "keys" else
                 f"score tiles {s.bq // s.width}x{s.width} rows x {s.cb} keys")
        self.detail = (f"flash attention {dt.name} (b, h)=({B}, {H}) L={L} S={S} E={E} Ev={EV}"
                       f"{' causal' if causal else ''}{f' mask {mask_kind}' if mask_kind else ''}: {self.units} units "
                       f"of {s.bq} query rows, key blocks of {s.bk}, {tiles}")

    def run_node(self, in_bufs, offsets, bufs):
        if self.fn is None:
            return
        addrs = [address(bufs[self.out])]
        for i in range(len(self.operands)):
            x, lx = self.operand(i, in_bufs, offsets, bufs)
            addrs.append(address(x) + lx.offset * x.itemsize)
        ptrs = (ctypes.c_void_p * len(addrs))(*addrs)
        base, sizes, scalars = ctypes.addressof(ptrs), address(self.sizes), address(self.scalars)
        fn = self.fn
        pool.parallel_for(lambda a, b: fn(base, sizes, scalars, a, b), 0, self.units, cost_per_item=self.cost)
        del ptrs
