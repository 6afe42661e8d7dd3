"""addnorm's operators (``torch.ops.addnorm.*``): one place where what PyTorch's transforms see is defined.

``schema`` defines the operators and their device and fake implementations, ``autograd`` their
backward, double backward and jvp, ``formulas`` the math in torch ops that the last two and the
non-CPU devices use. ``addnorm.functional`` calls them.
"""

from . import formulas, schema  # noqa: F401  (schema defines the operators; autograd registers on them)
from .autograd import AddNorm, DirectAddNorm, EagerAddNorm, TritonAddNorm, direct_forward, eager_inference, plain

__all__ = ["AddNorm", "DirectAddNorm", "EagerAddNorm", "TritonAddNorm", "direct_forward", "eager_inference", "formulas",
           "plain"]
from . import fused_autograd, fused_formulas, fused_schema  # noqa: E402,F401  (the fused forms' operators)
from . import stream_autograd, stream_formulas, stream_schema  # noqa: E402,F401  (the widened stream's operators)
from . import pointwise_autograd, pointwise_formulas, pointwise_schema  # noqa: E402,F401  (DyT / Derf + add)
from . import mhc_autograd, mhc_formulas, mhc_schema  # noqa: E402,F401  (mHC's pre step)
