"""Steps of flash_attention, flash_attention_lse (its rows' log-sum-exp) and flash_attention_grad:
`setup` compiles the kernel for the operands' dtype, head dims and mask kind (once per
structure: sizes and strides go in the run-time `sizes` array) and builds that array from the
plan's layouts; `run_node` folds the operands' offsets into the pointers and runs the units
((batch, head, query block) forward, (batch, head) backward) over the thread pool."""
from __future__ import annotations

import ctypes
import struct
from dataclasses import replace
from math import prod

import numpy as np

from ..codegen import attention as A
from ..codegen import attention_grad as AG
from . import pool
from .buffers import address
from .steps import NodeStep, register


def _f64_bits(x):
    return np.array(struct.unpack("<q", struct.pack("<d", float(x))), np.int64)


def _run_units(step, in_bufs, offsets, bufs, extra_out=None):
    """The kernel over the step's units: out first, then each operand at its offset, then
    `extra_out`'s buffer (a second output)."""
    if step.fn is None:
        return
    addrs = [address(bufs[step.out])]
    for i in range(len(step.operands)):
        x, lx = step.operand(i, in_bufs, offsets, bufs)
        addrs.append(address(x) + lx.offset * x.itemsize)
    if extra_out is not None:
        addrs.append(address(bufs[extra_out]))
    ptrs = (ctypes.c_void_p * len(addrs))(*addrs)
    base, sizes, scalars = ctypes.addressof(ptrs), address(step.sizes), address(step.scalars)
    fn = step.fn
    pool.parallel_for(lambda a, b: fn(base, sizes, scalars, a, b), 0, step.units, cost_per_item=step.cost)
    del ptrs


@register("flash_attention", "flash_attention_lse")
class FlashAttentionStep(NodeStep):
    """The forward, its log-sum-exp alone (flash_attention_lse), or both in one pass when the
    scheduler put the two nodes of one attention in one kernel (ir/schedule.py)."""

    def setup(self, cap):
        causal, mask_kind, scale = self.arg
        (_, _, _, lq, dt), (_, _, _, lk, _), (_, _, _, lv, _) = self.operands[:3]
        B, H, L, E = lq.shape
        S, EV = lk.shape[2], lv.shape[3]
        self.spec = A.attention_spec(dt, E, EV, causal, mask_kind, L)
        by_op = {cap.nodes[j].op.name: j for j in self.kernel.nodes}
        self.lse_out = None
        if "flash_attention" in by_op:
            self.out = by_op["flash_attention"]
            self.lse_out = by_op.get("flash_attention_lse")
            self.shape = cap.nodes[self.out].shape
        lse = "flash_attention_lse" in by_op
        if lse:
            self.spec = replace(self.spec, lse=True, out="flash_attention" in by_op)
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
        self.scalars = _f64_bits(scale)
        self.units = B * H * nqb
        self.cost = float(self.spec.bq * max(S, 1) * (E + EV) * 2)
        self.fn = None
        if prod(self.shape) > 0:
            self.module, self.fn = A.get_kernel(self.spec)
        s = self.spec
        tiles = (f"score vectors of {s.width} keys, dot products over E in {s.we} lanes" if s.mode == "keys" else
                 f"score tiles {s.bq // s.width}x{s.width} rows x {s.cb} keys")
        what = "" if not lse else " and its log-sum-exp" if self.spec.out else " log-sum-exp"
        self.detail = (f"flash attention{what} {dt.name} (b, h)=({B}, {H}) "
                       f"L={L} S={S} E={E} Ev={EV}"
                       f"{' causal' if causal else ''}{f' mask {mask_kind}' if mask_kind else ''}: {self.units} units "
                       f"of {s.bq} query rows, key blocks of {s.bk}, {tiles}")

    def run_node(self, in_bufs, offsets, bufs):
        _run_units(self, in_bufs, offsets, bufs, self.lse_out)


@register("flash_attention_grad")
class FlashAttentionGradStep(NodeStep):
    """Operands q, k, v, dO, lse, O (, mask), each (b, h, ., .) (lse: (b, h, L) contiguous; O the
    forward's output); the output is [dq | dk | dv] flat."""

    def setup(self, cap):
        causal, mask_kind, scale = self.arg
        (_, _, _, lq, dt), (_, _, _, lk, _), (_, _, _, lv, _), (_, _, _, lo, _) = self.operands[:4]
        (_, _, _, ll, _), (_, _, _, lO, _) = self.operands[4:6]
        B, H, L, E = lq.shape
        S, EV = lk.shape[2], lv.shape[3]
        for name, lay, last in (("q", lq, E), ("dO", lo, EV), ("O", lO, EV)):
            if lay.strides[3] != 1 and last > 1:
                raise ValueError(f"flash_attention_grad: {name} needs a contiguous last dim, got strides {lay.strides}")
        contiguous = all(n == 1 or st == want for n, st, want in zip(ll.shape, ll.strides, (H * L, L, 1)))
        if ll.shape != (B, H, L) or not contiguous:
            raise ValueError(f"flash_attention_grad: lse must be ({B}, {H}, {L}) contiguous, got {ll.shape} "
                             f"strides {ll.strides}")
        self.spec = AG.grad_spec(dt, E, EV, causal, mask_kind)
        lm = self.operands[6][3] if mask_kind is not None else None
        vals = {"H": H, "L": L, "S": S, "dk_off": B * H * L * E, "dv_off": B * H * (L + S) * E}
        for p, st in (("q", lq.strides), ("k", lk.strides), ("v", lv.strides)):
            vals[f"{p}_b"], vals[f"{p}_h"] = st[0], st[1]
        vals["q_l"], vals["q_e"], vals["k_s"], vals["k_e"] = lq.strides[2], lq.strides[3], lk.strides[2], lk.strides[3]
        vals["v_s"], vals["v_e"] = lv.strides[2], lv.strides[3]
        vals["o_b"], vals["o_h"], vals["o_l"] = lo.strides[:3]
        vals["O_b"], vals["O_h"], vals["O_l"] = lO.strides[:3]
        vals["m_b"], vals["m_h"], vals["m_l"], vals["m_s"] = tuple(lm.strides) if lm is not None else (0, 0, 0, 0)
        self.sizes = np.array([vals[n] for n in AG.SIZES], np.int64)
        self.scalars = _f64_bits(scale)
        self.units = B * H
        pairs = L * S / (2 if causal else 1)
        self.cost = float(pairs * (3 * E + 2 * EV) * 2)
        self.fn = None
        if prod(self.shape) > 0:
            self.module, self.fn = AG.get_kernel(self.spec)
        s = self.spec
        self.detail = (f"flash attention backward {dt.name} (b, h)=({B}, {H}) L={L} S={S} E={E} Ev={EV}"
                       f"{' causal' if causal else ''}{f' mask {mask_kind}' if mask_kind else ''}: {self.units} units "
                       f"of one head, blocks of {s.bq} query rows x {s.bk} keys recomputed")

    def run_node(self, in_bufs, offsets, bufs):
        _run_units(self, in_bufs, offsets, bufs)
