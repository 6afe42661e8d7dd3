"""addnorm's functional API: one module per family over one core that validates input and decides which
backend runs.

    norm       layer_norm(x, normalized_shape, weight, bias, eps)              -> y
               rms_norm(x, normalized_shape, weight, eps)                      -> y
               add_layer_norm(x, residual, normalized_shape, weight, bias, eps) -> (y, residual_sum)
               add_rms_norm(x, residual, normalized_shape, weight, eps)         -> (y, residual_sum)
               tutorial_layer_norm(x, weight, bias, eps)                       -> y (seed 000's formula)
    fused      layer_norm_add, rms_norm_add (norm-then-add), parallel_add_layer_norm, parallel_add_rms_norm
    pointwise  add_dyt, add_derf (DyT / Derf fused with the add)
    stream     stream_read, stream_write (the widened residual stream)
    mhc        mhc_pre (mHC's pre step in one pass; MhcConvention: where a model departs from the paper, DeepSeek-V4's,
               HY-V4's read without the comb matrix), mhc_write_pre (a write of the stream and that read of its result)
    hyper      hyper_read, hyper_write, stream_rms_norm, gated_collapse, sigmoid_gated_collapse and their pairs
               (hyper-connections without a mixing matrix: HY-V4's, Qwen4-exp's), each convention a frozen dataclass
    attn_res   attn_res (Attention Residuals' softmax over depth in one pass)
    core       use_backend, last_backend, BACKENDS, the validation errors; ``buffers``: the out= rules

The ``add_*`` forms are the fused "Add & Norm": ``s = x + residual; y = norm(s)``, returning the
new residual stream ``s`` beside ``y`` (that is their whole point, so there is no flag for it; in
particular nothing here is called "prenorm" -- placement lives in ``addnorm.model.placement``).

Backends (chosen explicitly, never by environment at import time):
    "cpu"    -- the fused C kernels (float32/bfloat16/float16 on the CPU), one pass each way
    "triton" -- the fused Triton kernels (float32/bfloat16/float16 on CUDA; the optional extra
                ``addnorm[gpu]``); on CPU tensors too when TRITON_INTERPRET=1 is set (Triton's
                interpreter: slow, for testing)
    "torch"  -- exact composite of torch ops (any dtype/device, double-differentiable)
    "auto"   -- "cpu" on CPU tensors and "triton" on CUDA ones where they apply, else "torch" (the default)
Set it per call (``backend=``) or for a region (``with addnorm.use_backend("torch"): ...``);
``last_backend()`` says which one ran most recently.

HuggingFace conventions:
    weight_offset=1.0       -- zero-centred weight, scale is ``1 + w`` (Gemma)
    cast_before_weight=True -- Llama's order: normalize in float32, cast to the input dtype, then
                               multiply by the weight (default: multiply in float32, cast once)

Mixed precision (flash-attention's ``residual_in_fp32``): the residual may be float32 beside a
float16/bfloat16 x; the sum is formed and returned in the residual's dtype, the normed output in x's
dtype or ``out_dtype``. ``residual_in_fp32=True`` starts such a stream where there is no residual yet.

Every call goes through addnorm's PyTorch operators (``torch.ops.addnorm.add_norm``, see
``addnorm.ops``) -- under torch.compile, torch.export, make_fx, jit.trace, FakeTensorMode -- except
the eager fast path, which calls the same CPU implementation without the dispatcher's cost.
"""

from .attn_res import attn_res
from .core import (BACKENDS, FLOAT_DTYPES, DtypeError, LayoutError, ShapeError, last_backend,  # noqa: F401
                   use_backend)
from .fused import layer_norm_add, parallel_add_layer_norm, parallel_add_rms_norm, rms_norm_add
from .hyper import (ProjectedGates, Rounding, StreamNorm, gated_collapse, hyper_read, hyper_write, hyper_write_norm,
                    hyper_write_read, sigmoid_gated_collapse, stream_rms_norm)
from .mhc import MhcConvention, mhc_pre, mhc_write_pre
from .norm import add_layer_norm, add_rms_norm, layer_norm, rms_norm, tutorial_layer_norm
from .pointwise import add_derf, add_dyt
from .stream import stream_read, stream_write

__all__ = [
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "tutorial_layer_norm",
    "layer_norm_add",
    "rms_norm_add",
    "parallel_add_layer_norm",
    "parallel_add_rms_norm",
    "add_dyt",
    "add_derf",
    "stream_read",
    "stream_write",
    "mhc_pre",
    "mhc_write_pre",
    "hyper_read",
    "hyper_write",
    "hyper_write_read",
    "hyper_write_norm",
    "stream_rms_norm",
    "gated_collapse",
    "sigmoid_gated_collapse",
    "ProjectedGates",
    "StreamNorm",
    "Rounding",
    "attn_res",
    "MhcConvention",
    "use_backend",
    "last_backend",
    "BACKENDS",
]
