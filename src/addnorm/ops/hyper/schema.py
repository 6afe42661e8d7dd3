"""The operators of hyper-connections without a mixing matrix:

    addnorm::hyper_read(x, weight, scale, base, eps, pre_eps, post_scale, post_eps) -> (h, h_pre, h_post)
    addnorm::hyper_write(x, y, h_post, rounding) -> x2
    addnorm::hyper_stream_norm(x, weight, eps, weight_offset) -> normed
    addnorm::hyper_gated_collapse(x, gates, rounding) -> h

See ``formulas``; the conventions' numbers (``convention``) are the float arguments. No kernel takes them yet: each
operator is registered as a composite of its formulas (CompositeImplicitAutograd), so that its backward, its fake
tensors and what torch.compile traces are those of the formulas on every device. (The stream family's C and
Triton write kernels mix by a full H_res; given an identity they would spread one stream's inf or NaN into the
others, 0 * inf, which HF's X + H_post y never does -- so the write without a mixing matrix is its own.)
"""

from __future__ import annotations

from ..norm.schema import LIB
from . import formulas

LIB.define("hyper_read(Tensor x, Tensor weight, Tensor scale, Tensor base, float eps, float pre_eps, "
           "float post_scale, float post_eps) -> (Tensor, Tensor, Tensor)")
LIB.define("hyper_write(Tensor x, Tensor y, Tensor h_post, str rounding) -> Tensor")
LIB.define("hyper_stream_norm(Tensor x, Tensor weight, float eps, float weight_offset) -> Tensor")
LIB.define("hyper_gated_collapse(Tensor x, Tensor gates, str rounding) -> Tensor")

LIB.impl("hyper_read", formulas.read, "CompositeImplicitAutograd")
LIB.impl("hyper_write", formulas.write, "CompositeImplicitAutograd")
LIB.impl("hyper_stream_norm", formulas.stream_norm, "CompositeImplicitAutograd")
LIB.impl("hyper_gated_collapse", formulas.gated_collapse, "CompositeImplicitAutograd")
