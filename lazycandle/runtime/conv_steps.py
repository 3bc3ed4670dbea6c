"""Step of col2im (conv_transpose's sum of columns into an image): its kernel takes sizes and
the columns' strides at run time (codegen/conv_transpose.py), so the step binds layouts like
the index steps: one launch per operand shapes and strides, the run-time offset folded into
the pointer, output rows split over the thread pool."""
from __future__ import annotations

from math import prod

from ..codegen import conv_transpose as CT
from .steps import Launch, SizedStep, register


@register("col2im")
class Col2imStep(SizedStep):
    def setup(self, cap):
        self.kernel_buffers = (("node", self.out), ("operand", 0))
        super().setup(cap)

    def make(self, layouts):
        lay = layouts[0]
        spec, sizes = CT.col2im_kernel(self.operands[0][4], lay.shape, lay.strides, self.arg)
        return Launch.of_spec(spec, sizes, prod(self.shape_at(lay)) > 0)

    def shape_at(self, lay):
        """The image shape (b, c, oh, ow) for columns of layout `lay`."""
        return (lay.shape[0], lay.shape[1], self.arg[0], self.arg[1])

    def describe(self, prepared) -> str:
        oh, ow, kh, kw, ph, pw, sh, sw, dh, dw = self.arg
        return (f"col2im {self.operands[0][3].shape} -> {self.shape}: kernel ({kh}, {kw}), padding ({ph}, {pw}), "
                f"stride ({sh}, {sw}), dilation ({dh}, {dw}); sizes at run time")
