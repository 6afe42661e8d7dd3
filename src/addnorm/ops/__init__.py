"""addnorm's operators (``torch.ops.addnorm.*``): one place where what PyTorch's transforms see is defined.

One package per family -- ``norm`` (Add & Norm), ``fused`` (norm-then-add, the parallel block), ``pointwise``
(DyT, Derf), ``stream`` (the widened stream's read and write), ``mhc`` (mHC's pre step, and a write with it),
``hyper`` (hyper-connections without a mixing matrix: HY-V4's, Qwen4-exp's; the read a composite of mhc_pre, the
rest of their formulas), ``attn_res`` (Attention Residuals' depth mix) -- each with ``schema`` (the operators and their device and fake implementations),
``autograd`` (backward, double backward and jvp) and ``formulas`` (the math in torch ops that the last two and
the non-CPU devices use). Shared by all of them: ``last`` (which backend ran) and ``native_nodes`` (the C++
autograd nodes of the eager fast path). ``addnorm.functional`` calls them.
"""

# importing a family registers its operators
from . import attn_res, fused, hyper, mhc, norm, pointwise, stream  # noqa: F401
from .norm import formulas
from .norm.autograd import AddNorm, DirectAddNorm, EagerAddNorm, TritonAddNorm, direct_forward, eager_inference, plain

__all__ = ["AddNorm", "DirectAddNorm", "EagerAddNorm", "TritonAddNorm", "direct_forward", "eager_inference", "formulas",
           "plain"]
