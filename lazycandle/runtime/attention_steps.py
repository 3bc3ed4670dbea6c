"""Steps of flash_attention, flash_attention_lse (its rows' log-sum-exp) and flash_attention_grad.
Their kernels take every size, stride and the scale at run time (the `sizes` array), so the steps
bind layouts (steps.SizedStep): `make` picks the kernel for the operands' dtype, head dims, mask
kind and query-length regime and fills the sizes array from one binding's layouts; one plan
serves every sequence length, and the native program calls the kernels in its segments
(units: (batch, head, query block) forward, (batch, head) backward)."""
from __future__ import annotations

import struct
from dataclasses import replace

from ..codegen import attention as A
from ..codegen import attention_grad as AG
from .steps import Launch, SizedStep, register


def _f64_bits(x) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _launch(spec, vals, names, scale, units, cost, runs, get_kernel):
    fn = get_kernel(spec)[1] if runs and units else None
    return Launch(spec, [vals[n] for n in names] + [_f64_bits(scale)], units if fn else 0, cost, fn)


_FORWARD_SIZES = ("H", "L", "S", "nqb", "q_b", "q_h", "q_l", "q_e", "k_b", "k_h", "k_s", "k_e", "v_b", "v_h", "v_s",
                  "m_b", "m_h", "m_l", "m_s", "o_b", "o_h", "o_l")
assert A.SIZES == _FORWARD_SIZES, "FlashAttentionStep.make writes the sizes in this order"


def _spec(dt, q_shape, v_shape, causal, mask_kind, with_lse, with_out):
    """The forward kernel's spec for these operand shapes."""
    spec = A.attention_spec(dt, q_shape[3], v_shape[3], causal, mask_kind, q_shape[2])
    return replace(spec, lse=True, out=with_out) if with_lse else spec


@register("flash_attention", "flash_attention_lse")
class FlashAttentionStep(SizedStep):
    """The forward, its log-sum-exp alone (flash_attention_lse), or both in one pass when the
    scheduler put the two nodes of one attention in one kernel (ir/schedule.py)."""

    @classmethod
    def ahead(cls, kernel, cap):
        """The kernel of the plan's own sizes (make's spec)."""
        try:
            ops = {cap.nodes[j].op.name for j in kernel.nodes}
            j = kernel.nodes[0]
            q, v = cap.operands[j][0], cap.operands[j][2]
            dt = cap.inputs[q.src].dtype if q.kind == "in" else cap.nodes[q.index].dtype
            causal, mask_kind, _ = cap.nodes[j].arg
            spec = _spec(dt, q.shape, v.shape, causal, mask_kind,
                         "flash_attention_lse" in ops, "flash_attention" in ops)
            return [(A._kernels, spec)]
        except Exception:   # noqa: BLE001  (the step's setup raises what is wrong)
            return ()

    def setup(self, cap):
        by_op = {cap.nodes[j].op.name: j for j in self.kernel.nodes}
        self.lse_out = None
        if "flash_attention" in by_op:
            self.out = by_op["flash_attention"]
            self.lse_out = by_op.get("flash_attention_lse")
            self.shape = cap.nodes[self.out].shape
        self.with_lse, self.with_out = "flash_attention_lse" in by_op, "flash_attention" in by_op
        n_ops = 4 if self.arg[1] is not None else 3
        self.kernel_buffers = (("node", self.out),) + tuple(("operand", n) for n in range(n_ops)) + \
            ((("node", self.lse_out),) if self.lse_out is not None else ())
        self._specs, self.scale_bits = {}, _f64_bits(self.arg[2])
        super().setup(cap)

    def make(self, layouts):
        causal, mask_kind, _ = self.arg
        lq, lk, lv = layouts[:3]
        B, H, L, E = lq.shape
        S, EV = lk.shape[2], lv.shape[3]
        spec = self._specs.get(L)           # per query length (its regime): a new key length finds it
        if spec is None:
            spec = _spec(self.operands[0][4], lq.shape, lv.shape, causal, mask_kind, self.with_lse, self.with_out)
            if len(self._specs) >= 64:
                self._specs.clear()
            self._specs[L] = spec
        if (lv.strides[3] != 1 and EV > 1) or (lk.strides[3] != 1 and E > 1):
            raise ValueError(f"flash_attention: k and v need a contiguous last dim, got strides {lk.strides} "
                             f"and {lv.strides}")
        nqb = -(-L // spec.bq)
        q, k, v = lq.strides, lk.strides, lv.strides
        m = layouts[3].strides if mask_kind else (0, 0, 0, 0)
        words = [H, L, S, nqb, q[0], q[1], q[2], q[3], k[0], k[1], k[2], k[3], v[0], v[1], v[2],   # A.SIZES
                 m[0], m[1], m[2], m[3], L * H * EV, EV, H * EV, self.scale_bits]     # (the output is (B, L, H, Ev))
        runs = B * H * L * (EV if self.with_out else 1) > 0
        units = B * H * nqb
        fn = A.get_kernel(spec)[1] if runs and units else None
        return Launch(spec, words, units if fn else 0, float(spec.bq * max(S, 1) * (E + EV) * 2), fn)

    def sizes_source(self, i, layouts, own):
        """make's words, units and cost as lines of the shape and stride tokens, for bindings
        whose head dims and query-length regime are the program's (`own`: its Launch)."""
        spec = own.spec
        (q_sh, q), (k_sh, k), (v_sh, v) = [([f"({t})" for t in sh], [f"({t})" for t in st]) for sh, st in layouts[:3]]
        m = [f"({t})" for t in layouts[3][1]] if self.arg[1] else ["0"] * 4
        B, H, L, E = q_sh
        S, EV = k_sh[2], v_sh[3]
        lo, hi = A.query_regime(self.operands[0][4], int(own.sizes[1]))
        ok = [f"{E} == {spec.e}", f"{EV} == {spec.ev}", f"{L} >= {lo}", f"{B} * {H} > 0",
              f"({v[3]} == 1 or {EV} <= 1)", f"({k[3]} == 1 or {E} <= 1)"] + [f"{L} <= {hi}"] * (hi is not None)
        nqb = f"(-(-{L} // {spec.bq}))"
        words = [H, L, S, nqb, *q, *k, *v[:3], *m, f"{L} * {H} * {EV}", EV, f"{H} * {EV}", str(self.scale_bits)]
        return [f"    if not ({' and '.join(ok)}):\n        return None",
                f"    s{i} = ({', '.join(words)},)", f"    e{i} = {B} * {H} * {nqb}",
                f"    c{i} = {2.0 * spec.bq} * max({S}, 1) * ({E} + {EV})"]

    def describe(self, launch) -> str:
        causal, mask_kind = self.arg[:2]
        s, lq, lk = launch.spec, self.operands[0][3], self.operands[1][3]
        (B, H, L, E), S, EV = lq.shape, lk.shape[2], self.operands[2][3].shape[3]
        tiles = (f"score vectors of {s.width} keys, dot products over E in {s.we} lanes" if s.mode == "keys" else
                 f"score tiles {s.bq // s.width}x{s.width} rows x {s.cb} keys")
        what = "" if not s.lse else " and its log-sum-exp" if s.out else " log-sum-exp"
        return (f"flash attention{what} {s.dtype} (b, h)=({B}, {H}) L={L} S={S} E={E} Ev={EV}"
                f"{' causal' if causal else ''}{f' mask {mask_kind}' if mask_kind else ''}: {launch.units} units "
                f"of {s.bq} query rows, key blocks of {s.bk}, {tiles}; sizes at run time")


@register("flash_attention_grad")
class FlashAttentionGradStep(SizedStep):
    """Operands q, k, v, dO, lse, O (, mask), each (b, h, ., .) (lse: (b, h, L) contiguous; O the
    forward's output); the output is flat, dq, dk and dv at codegen/attention_grad.output_strides."""

    def setup(self, cap):
        n_ops = 7 if self.arg[1] is not None else 6
        self.kernel_buffers = (("node", self.out),) + tuple(("operand", n) for n in range(n_ops))
        super().setup(cap)

    def make(self, layouts):
        causal, mask_kind, scale, _ = self.arg
        lq, lk, lv, lo, ll, lO = layouts[:6]
        dt = self.operands[0][4]
        B, H, L, E = lq.shape
        S, EV = lk.shape[2], lv.shape[3]
        for name, lay, last in (("q", lq, E), ("dO", lo, EV), ("O", lO, EV)):
            if lay.strides[3] != 1 and last > 1:
                raise ValueError(f"flash_attention_grad: {name} needs a contiguous last dim, got strides {lay.strides}")
        contiguous = all(n == 1 or st == want for n, st, want in zip(ll.shape, ll.strides, (H * L, L, 1)))
        if ll.shape != (B, H, L) or not contiguous:
            raise ValueError(f"flash_attention_grad: lse must be ({B}, {H}, {L}) contiguous, got {ll.shape} "
                             f"strides {ll.strides}")
        vals = {"H": H, "L": L, "S": S, **AG.output_strides(B, H, L, S, E, EV, self.arg[3])}
        for p, st in (("q", lq.strides), ("k", lk.strides), ("v", lv.strides)):
            vals[f"{p}_b"], vals[f"{p}_h"] = st[0], st[1]
        vals["q_l"], vals["q_e"], vals["k_s"], vals["k_e"] = lq.strides[2], lq.strides[3], lk.strides[2], lk.strides[3]
        vals["v_s"], vals["v_e"] = lv.strides[2], lv.strides[3]
        vals["o_b"], vals["o_h"], vals["o_l"] = lo.strides[:3]
        vals["O_b"], vals["O_h"], vals["O_l"] = lO.strides[:3]
        vals["m_b"], vals["m_h"], vals["m_l"], vals["m_s"] = tuple(layouts[6].strides) if mask_kind else (0, 0, 0, 0)
        pairs = L * S / (2 if causal else 1)
        spec = AG.grad_spec(dt, E, EV, causal, mask_kind)
        return _launch(spec, vals, AG.SIZES, scale, B * H, float(pairs * (3 * E + 2 * EV) * 2),
                       B * H * (L * E + S * (E + EV)) > 0, AG.get_kernel)

    def describe(self, launch) -> str:
        causal, mask_kind = self.arg[:2]
        s, lq, lk = launch.spec, self.operands[0][3], self.operands[1][3]
        (B, H, L, E), S, EV = lq.shape, lk.shape[2], self.operands[2][3].shape[3]
        return (f"flash attention backward {s.dtype} (b, h)=({B}, {H}) L={L} S={S} E={E} Ev={EV}"
                f"{' causal' if causal else ''}{f' mask {mask_kind}' if mask_kind else ''}: {launch.units} units "
                f"of one head, blocks of {s.bq} query rows x {s.bk} keys recomputed")
