"""Steps of the index / data-movement ops (registered by op name; the executor builds one per
plan).  Their kernels take sizes and strides at run time (codegen/index.py), so the steps bind
layouts: `run_node` gets this binding's operand Layouts, makes (once per shapes and strides)
the kernel spec and its sizes array, folds the run-time offsets into pointers, runs the kernel
over the thread pool and, for the index ops, turns the kernel's status word into
IndexOutOfBounds.  Single-call steps say their pointers in `kernel_buffers` (steps.SizedStep), so the
native program calls their kernels in its segments.  One plan serves every size of its size class (symbolic_plan.py)."""
from __future__ import annotations

import ctypes
from math import prod

import numpy as np

from ..codegen import index as K
from ..errors import IndexOutOfBounds
from ..layout import Layout, contiguous_strides
from .buffers import address
from .steps import Launch, NodeStep, Reads, SizedStep, operand_address, register


def _kernel(op, dim, dtype, id_dtype, layouts):
    """(spec, sizes, whether it runs, bound) of an index op's kernel at these operand layouts."""
    t_lay, ids_lay = layouts[0], layouts[1]

    def ids_over(shape):
        if op in K.VECTOR_IDS:
            return tuple(ids_lay.strides[0] if d == dim else 0 for d in range(len(shape)))
        return ids_lay.strides

    if op in K.GATHER_OPS:
        S = ids_lay.shape if op == "gather" else t_lay.shape[:dim] + ids_lay.shape + t_lay.shape[dim + 1:]
        bound = t_lay.shape[dim]
        spec, sizes = K.index_kernel(op, dtype, id_dtype, S, dim, bound, t_lay.strides, ids_over(S),
                                     contiguous_strides(S))
        return spec, sizes, prod(S) > 0, bound
    src_lay = layouts[2]
    S, bound = src_lay.shape, t_lay.shape[dim]
    spec, sizes = K.index_kernel(op, dtype, id_dtype, S, dim, bound, src_lay.strides, ids_over(S),
                                 contiguous_strides(t_lay.shape), t_lay.strides)
    return spec, sizes, prod(t_lay.shape) > 0 or prod(S) > 0, bound


@register("index_select", "gather", "scatter", "scatter_add", "index_add")
class IndexStep(SizedStep):
    def setup(self, cap):
        self.op, self.dim = cap.nodes[self.out].op.name, self.arg
        self.id_dtype = self.operands[1][4]
        data, ids, *base = (0, 1) if self.op in K.GATHER_OPS else (2, 1, 0)
        self.kernel_buffers = (("node", self.out), ("operand", data), ("operand", ids), ("status",)) + \
            tuple(("operand", n) for n in base)
        super().setup(cap)

    @classmethod
    def ahead(cls, kernel, cap):
        """The kernel at the plan's own operand layouts (make's spec)."""
        try:
            j = kernel.nodes[0]
            node, ops = cap.nodes[j], cap.operands[j]
            ids = ops[1]
            id_dtype = cap.inputs[ids.src].dtype if ids.kind == "in" else cap.nodes[ids.index].dtype
            layouts = [Layout(o.shape, o.strides, o.offset) for o in ops]
            spec, _, runs, _ = _kernel(node.op.name, node.arg, node.dtype, id_dtype, layouts)
            return [spec] if runs else ()
        except Exception:   # noqa: BLE001  (the step's setup raises what is wrong)
            return ()

    def make(self, layouts):
        """(launch, bound) of the kernel at these operand layouts."""
        spec, sizes, runs, bound = _kernel(self.op, self.dim, self.dtype, self.id_dtype, layouts)
        return Launch.of_spec(spec, sizes, runs), bound

    def describe(self, prepared) -> str:
        launch, bound = prepared
        return (f"{self.op} along dim {self.dim}: {launch.units} units, sizes at run time; "
                f"ids {self.id_dtype.name} checked < {bound}")

    def launch_of(self, prepared):
        return prepared[0]

    def raise_status(self, bad: int, layouts=None):
        layouts = self.layouts(layouts)
        raise IndexOutOfBounds(
            f"{self.op}: index {bad} out of range for dim {self.dim} of size {layouts[0].shape[self.dim]} "
            f"(tensor shape {layouts[0].shape}, ids {self.id_dtype.name} shape {layouts[1].shape})")


@register("cat")
class CatStep(SizedStep):
    """One strided copy per non-empty input into its slab of the output."""

    def make(self, layouts):
        """[(operand, element offset in the output, launch)] of the non-empty inputs."""
        dim = self.arg
        shape = list(layouts[0].shape)
        shape[dim] = sum(lay.shape[dim] for lay in layouts)
        out_strides = contiguous_strides(tuple(shape))
        parts, start = [], 0
        for k, lay in enumerate(layouts):
            if prod(lay.shape) > 0:
                spec, sizes = K.copy_kernel(self.operands[k][4].size_in_bytes, lay.shape, lay.strides, out_strides)
                parts.append((k, start * out_strides[dim], Launch.of_spec(spec, sizes)))
            start += lay.shape[dim]
        return parts

    def launches(self, prepared):
        return [ln for _, _, ln in prepared]

    def describe(self, prepared) -> str:
        return f"cat along dim {self.arg}: {len(prepared)} strided copies, sizes at run time"

    def run_node(self, in_bufs, offsets, bufs, layouts=None):
        layouts = self.layouts(layouts)
        out = bufs[self.out]
        for k, off, launch in self.prepare(layouts):
            buf, lay = self.operand(k, in_bufs, offsets, bufs, layouts)
            launch.run([address(out) + off * out.itemsize, operand_address(buf, lay)])


@register("im2col")
class Im2colStep(SizedStep):
    def setup(self, cap):
        self.kernel_buffers = (("node", self.out), ("operand", 0))
        super().setup(cap)

    def make(self, layouts):
        lay = layouts[0]
        spec, sizes = K.im2col_kernel(self.operands[0][4].size_in_bytes, lay.shape, lay.strides, self.arg)
        return Launch.of_spec(spec, sizes, prod(lay.shape) > 0 and sizes[4] > 0 and sizes[5] > 0)

    def describe(self, prepared) -> str:
        kh, kw, ph, pw, sh, sw, dh, dw = self.arg
        return (f"im2col {self.operands[0][3].shape} -> {self.shape}: kernel ({kh}, {kw}), padding ({ph}, {pw}), "
                f"stride ({sh}, {sw}), dilation ({dh}, {dw}); sizes at run time")


@register("nonzero")
class NonzeroStep(NodeStep):
    """Ids of the nonzero elements of a 1-D mask; the node's length (counted by the Tensor API
    from the realized mask, so the size of the output buffer) caps how many the kernel writes."""
    binds_layouts = True

    def setup(self, cap):
        lay, dt = self.operands[0][3], self.operands[0][4]
        self.reads = Reads(self.operands)
        self.module, self.fn = K.get_kernel(K.nonzero_kernel(dt.size_in_bytes, lay.shape[0], lay.strides[0], 0)[0])
        self.detail = f"nonzero ids of a {dt.name} mask (sizes at run time)"

    def run_node(self, in_bufs, offsets, bufs, layouts=None):
        m, lm = self.operand(0, in_bufs, offsets, bufs, layouts)
        out = bufs[self.out]
        spec, sizes = K.nonzero_kernel(self.operands[0][4].size_in_bytes, lm.shape[0], lm.strides[0], out.shape[0])
        _, fn = K.get_kernel(spec)
        params = np.array(sizes, np.int64)
        ptrs = (ctypes.c_void_p * 2)(address(out), operand_address(m, lm))
        fn(ctypes.addressof(ptrs), address(params), None, 0, 1)
