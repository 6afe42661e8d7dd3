"""The operators of hyper-connections without a mixing matrix:

    addnorm::hyper_read(x, weight, scale, base, eps, pre_eps, post_scale, post_eps) -> (h, h_pre, h_post)
    addnorm::hyper_write(x, y, h_post, rounding) -> x2
    addnorm::hyper_stream_norm(x, weight, eps, weight_offset) -> normed
    addnorm::hyper_gated_collapse(x, gates, rounding) -> h

See ``formulas``; the conventions' numbers (``convention``) are the float arguments. ``hyper_read`` is mHC's pre step
without the comb matrix: a composite of ``mhc_pre`` with the convention's numbers and groups 2 (or 1 for a head,
weight (n, nC)) (``mhc_args``), so it runs where mhc_pre runs -- the C kernels on the CPU, the formulas elsewhere --
and its backward, fake tensors and what torch.compile traces are mhc_pre's. The others are registered as composites
of their formulas (CompositeImplicitAutograd): no kernel takes them yet. (The stream family's C and Triton write
kernels mix by a full H_res; given an identity they would spread one stream's inf or NaN into the others, 0 * inf,
which HF's X + H_post y never does -- so the write without a mixing matrix is its own: ``ops.mhc.write`` computes it
fused with the read after it.)
"""

from __future__ import annotations

import torch

from ..norm.schema import LIB
from . import formulas

LIB.define("hyper_read(Tensor x, Tensor weight, Tensor scale, Tensor base, float eps, float pre_eps, "
           "float post_scale, float post_eps) -> (Tensor, Tensor, Tensor)")
LIB.define("hyper_write(Tensor x, Tensor y, Tensor h_post, str rounding) -> Tensor")
LIB.define("hyper_stream_norm(Tensor x, Tensor weight, float eps, float weight_offset) -> Tensor")
LIB.define("hyper_gated_collapse(Tensor x, Tensor gates, str rounding) -> Tensor")


def mhc_args(x, weight, scale, base, eps, pre_eps, post_scale, post_eps) -> tuple:
    """``addnorm::mhc_pre``'s arguments for a hyper read: phi = weight^T, (a_pre, a_post) = scale, (b_pre, b_post)
    = base, no H_res (groups 2: a_res zero, b_res empty), or for a head (weight (n, nC)) no H_post either
    (groups 1); eps and the gates' numbers as the convention (``convention.ProjectedGates``) gives them."""
    n = x.size(-2)
    groups = weight.size(0) // n
    s = scale.reshape(-1)
    zero = s.new_zeros(())
    return (x, weight.t(), s[0], s[-1] if groups == 2 else zero, zero, base[:n], base[n:], base.new_zeros(0), None,
            float(eps), 0, float(pre_eps), 0.0, False, float(post_scale), float(post_eps), groups)


def _read(x, weight, scale, base, eps, pre_eps, post_scale, post_eps):
    return tuple(torch.ops.addnorm.mhc_pre(*mhc_args(x, weight, scale, base, eps, pre_eps, post_scale, post_eps))[:3])


LIB.impl("hyper_read", _read, "CompositeImplicitAutograd")
LIB.impl("hyper_write", formulas.write, "CompositeImplicitAutograd")
LIB.impl("hyper_stream_norm", formulas.stream_norm, "CompositeImplicitAutograd")
LIB.impl("hyper_gated_collapse", formulas.gated_collapse, "CompositeImplicitAutograd")
