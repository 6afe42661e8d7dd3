"""Hyper-connections without a mixing matrix, as functions on the widened stream X (..., n, C):

    hyper_read(x, weight, scale, base, convention=ProjectedGates)  -> (h, H_pre, H_post)
        the gates from a projection of the RMS-normed vec(X) and the collapse h = sum_i H_pre[i] X_i in one call
        (HY-V4's iHC; with weight (n, nC) and one scale, its head: H_post empty)
    hyper_write(x, y, h_post, rounding=ONCE)                       -> X' = X + H_post^T y  (the expand)
    stream_rms_norm(x, weight, convention=StreamNorm)               -> each stream RMS-normed with its own weight
    gated_collapse(x, gates, rounding=ONCE)                        -> h = (1/n) sum_i G_i * X_i  (gates per element)
    sigmoid_gated_collapse(x, logits, rounding=ONCE)               -> h = (1/n) sum_i sigmoid(U_i) * X_i  (from the
        gates' logits: Qwen4-exp's read after its low-rank gate, the sigmoid computed in the same pass)
    hyper_write_read(x, y, h_post, weight, scale, base, convention) -> (X', h, H_pre, H_post): one sub-layer's
        write and the next one's read, one pass over the stream (HY-V4's layers hand them over so:
        ``addnorm.interop``; with h_res, a write that mixes the streams first: DeepSeek-V4's before its head)
    hyper_write_norm(x, y, h_post, weight, convention)             -> (X', N'): the write and the next read's norm
        (Qwen4-exp's gated read: N' feeds its low-rank gate, then ``sigmoid_gated_collapse``)

``hyper_read`` is mHC's pre step without the comb matrix (``functional.mhc.mhc_pre`` with the convention's numbers
and groups 2, or 1 for a head) and ``hyper_write_read`` is ``functional.mhc.mhc_write_pre`` without a mixing matrix.
``stream_rms_norm``, ``hyper_write_norm`` and ``sigmoid_gated_collapse`` have C kernels of their own
(``torch.ops.addnorm.hyper_*``, ``addnorm.ops.hyper``): one walk over the stream forward and one backward, the
norm's statistics and the gates recomputed there rather than saved. Each function runs on the backend
``functional.core`` picks (``backend=`` / ``use_backend``): the C kernels on the CPU, the exact torch formulas
elsewhere (on Triton, ``stream_rms_norm`` is the norm family's RMSNorm per stream). ``hyper_write`` and
``gated_collapse`` run their formulas on every device: ``last_backend()`` says "torch". The conventions are frozen
dataclasses (``addnorm.ops.hyper.convention``): what differs between models is a value passed to the same operator
-- HY-V4's magnitude and eps, Qwen4-exp's (1 + w), and where a 16-bit result is rounded (``Rounding``: once,
addnorm's way and HY-V4's; or after each product, as Qwen4-exp's eager bfloat16 code).
"""

from __future__ import annotations

import torch

from ..ops.hyper import autograd as hyper_autograd
from ..ops.hyper import formulas as hyper_formulas
from ..ops.hyper import schema as hyper_schema
from ..ops.hyper.convention import ONCE, PRODUCTS, ProjectedGates, Rounding, StreamNorm
from ..ops.hyper.schema import mhc_args
from ..ops.norm.autograd import c_apply
from . import core, mhc, norm

__all__ = ["ProjectedGates", "StreamNorm", "Rounding", "ONCE", "PRODUCTS", "hyper_read", "hyper_write", "stream_rms_norm",
           "gated_collapse", "sigmoid_gated_collapse", "hyper_write_read", "hyper_write_norm"]

# the operators on the CPU kernels: (their autograd called directly, their implementation, the operator), for calls
# with nothing between the tensors and the kernels (``run``)
_NORM = (c_apply(hyper_autograd.DirectHyperStreamNorm), hyper_schema.norm_impl, torch.ops.addnorm.hyper_stream_norm)
_WRITE_NORM = (c_apply(hyper_autograd.DirectHyperWriteNorm), hyper_schema.write_norm_impl,
               torch.ops.addnorm.hyper_write_norm)
_GATE = (c_apply(hyper_autograd.DirectSigmoidGatedCollapse), hyper_schema.gate_impl,
         torch.ops.addnorm.hyper_sigmoid_gated_collapse)


def _run_cpu(kernel, args: tuple, n_tensors: int):
    """One operator on the CPU kernels (``mhc.run_direct``: directly where nothing stands between the tensors and
    them, else through the dispatcher)."""
    return mhc.run_direct(*kernel, args, args[:n_tensors])


def _stream(x) -> tuple[tuple[int, ...], int, int]:
    core.check_float_tensor("x", x)
    if x.dim() < 2 or x.shape[-2] < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must be a widened stream (..., n >= 1, C >= 1), got shape {tuple(x.shape)}")
    _stored(x=x)
    return tuple(x.shape[:-2]), x.shape[-2], x.shape[-1]


def _stored(**tensors) -> None:
    """Each tensor's storage is there (freed by FSDP's resize_(0), a kernel would read unmapped memory)."""
    if not torch.compiler.is_compiling() and not core.functorch_active():
        for name, t in tensors.items():
            core.check_storage(name, t)


def _tensor(name, t, x, shape=None, numel=None):
    core.check_float_tensor(name, t)
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} for x of shape {tuple(x.shape)}, got {tuple(t.shape)}")
    if numel is not None and t.numel() != numel:
        raise ValueError(f"{name} must have {numel} elements for x of shape {tuple(x.shape)}, got shape "
                         f"{tuple(t.shape)}")
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    _stored(**{name: t})


def _convention(convention, kind, name="convention"):
    if not isinstance(convention, kind):
        raise TypeError(f"{name} must be an addnorm.functional.{kind.__name__}, got {type(convention).__name__}")
    return convention


def _check_read(x, weight, scale, base, convention):
    _, n, C = _stream(x)
    _convention(convention, ProjectedGates)
    core.check_float_tensor("weight", weight)
    if weight.dim() != 2 or weight.shape[1] != n * C or weight.shape[0] not in (n, 2 * n):
        raise ValueError(f"weight must have shape ({2 * n}, {n * C}) (H_pre's and H_post's projections) or "
                         f"({n}, {n * C}) (H_pre's alone: a head) for x of shape {tuple(x.shape)}, "
                         f"got {tuple(weight.shape)}")
    groups = weight.shape[0] // n
    _tensor("weight", weight, x)
    _tensor("scale", scale, x, numel=groups)
    _tensor("base", base, x, numel=groups * n)
    if base.dim() != 1:
        raise ValueError(f"base must be one-dimensional ({groups * n},), got shape {tuple(base.shape)}")


def hyper_read(x, weight, scale, base, *, convention: ProjectedGates, backend: str | None = None):
    """One read of the stream X (..., n, C) (HY-V4's iHC): with v = vec(X) and m = (v weight^T) / RMS(v),

        H_pre  = sigmoid(scale[0] m[:n] + base[:n]) + convention.pre_eps
        H_post = convention.post_scale sigmoid(scale[1] m[n:] + base[n:]) + convention.post_eps
        h      = sum_i H_pre[i] X_i

    weight (2n, nC) (HF's ``fn``), scale (2,), base (2n,); or weight (n, nC), scale (1,), base (n,) for a head,
    whose H_post is empty (..., 0). Returns (h, H_pre, H_post): h in X's dtype, the gates in float32 (float64 if X
    or a parameter is float64)."""
    c = convention  # checks and call in C++ where no gradient is wanted (mhc.run_fast)
    if type(c) is ProjectedGates and (r := mhc.run_fast(backend, "fast_hyper_read", x, None, None, None, False, weight,
                                                          scale, base, c.eps, c.pre_eps, c.post_scale,
                                                          c.post_eps)) is not None:
        return r
    x, weight = core.uninferred((x, weight), (scale, base))
    _check_read(x, weight, scale, base, convention)
    which = core.choose_backend(backend, x, tuple(x.shape[-1:]))
    c = convention
    return mhc.run_pre(which, mhc_args(x, weight, scale, base, c.eps, c.pre_eps, c.post_scale, c.post_eps))[:3]


def _check_write(x, y, h_post):
    lead, n, C = _stream(x)
    _tensor("y", y, x, shape=lead + (C,))
    _tensor("h_post", h_post, x, shape=lead + (n,))


def hyper_write(x, y, h_post, *, rounding: Rounding = ONCE):
    """X' = X + H_post^T y (row i: X_i + H_post[i] y) in X's dtype, from float32 sums (float64 if an input is)
    rounded once, or with ``rounding=PRODUCTS`` each product H_post[i] y first rounded to the inputs' dtype as eager
    16-bit code rounds it; y (..., C), h_post (..., n). No mixing matrix: each stream keeps its own values."""
    _check_write(x, y, h_post)
    core.choose_backend("torch", x, tuple(x.shape[-1:]))
    return torch.ops.addnorm.hyper_write(x, y, h_post, _convention(rounding, Rounding, "rounding").where)


def _norm_weight(weight, x):
    _, n, C = _stream(x)
    _tensor("weight", weight, x, numel=n * C)
    if tuple(weight.shape) not in ((n, C), (n * C,)):
        raise ValueError(f"weight must have shape ({n}, {C}) or ({n * C},) (one weight per stream) for x of shape "
                         f"{tuple(x.shape)}, got {tuple(weight.shape)}")
    return weight.reshape(n, C)


def stream_rms_norm(x, weight, *, convention: StreamNorm, backend: str | None = None):
    """N_i = X_i / sqrt(mean(X_i^2) + eps) * (weight_offset + w_i): each stream of X (..., n, C) over its C
    channels, weight (n, C) (or HF's flat (nC,)); in float32, rounded once to X's dtype (Qwen4-exp's hc_norm).

    On the CPU kernels one walk over the stream each way (``torch.ops.addnorm.hyper_stream_norm``: dX and dw in one
    backward pass, each row's rstd recomputed from X); on Triton the norm family's RMSNorm with Gemma's convention
    per stream on the strided rows X[..., i, :], stacked; on the torch backend (and for a float64 weight, whose
    formulas compute in float64) the formulas (``ops.hyper``)."""
    if type(convention) is StreamNorm and (r := mhc.run_fast(backend, "fast_hyper_gated", 0, x, None, None, weight,
                                                             convention.eps, convention.weight_offset,
                                                             False)) is not None:
        return r
    w = _norm_weight(weight, x)
    c = _convention(convention, StreamNorm)
    which = core.resolve(backend, x, tuple(x.shape[-1:]), None)
    if which == "torch" or w.dtype == torch.float64:
        core.choose_backend("torch", x, tuple(x.shape[-1:]))
        return hyper_formulas.stream_norm(x, w, c.eps, c.weight_offset)
    core.choose_backend(which, x, tuple(x.shape[-1:]))
    if which == "cpu":
        x, w = core.uninferred((x, w))
        return _run_cpu(_NORM, (x, w, c.eps, c.weight_offset), 2)
    # unbind, not x[..., i, :]: its backward stacks the n gradients in one pass, where n selects' would each
    # scatter into a zero tensor of X's size
    return torch.stack([norm.rms_norm(xi, xi.shape[-1:], wi, c.eps, weight_offset=c.weight_offset, backend=which)
                        for xi, wi in zip(x.unbind(-2), w.unbind(0), strict=True)], -2)


def gated_collapse(x, gates, *, rounding: Rounding = ONCE):
    """h = (1/n) sum_i G_i * X_i: X and the gates G (..., n, C) -> (..., C) in X's dtype (Qwen4-exp's read); with
    ``rounding=PRODUCTS`` each product G_i * X_i first rounded to the inputs' dtype, as eager's."""
    _stream(x)
    _tensor("gates", gates, x, shape=x.shape)
    core.choose_backend("torch", x, tuple(x.shape[-1:]))
    return torch.ops.addnorm.hyper_gated_collapse(x, gates, _convention(rounding, Rounding, "rounding").where)


def sigmoid_gated_collapse(x, logits, *, rounding: Rounding = ONCE, backend: str | None = None):
    """h = (1/n) sum_i sigmoid(U_i) * X_i: X and the gates' logits U (..., n, C) -> (..., C) in X's dtype
    (Qwen4-exp's read, U its low-rank gate's up-projection); the gates in float32 then, rounded once with the mean.
    With ``rounding=PRODUCTS`` where eager 16-bit code rounds ``(sigmoid(U) * X).mean(-2)``: the gates and each
    product G_i * X_i rounded to the inputs' dtype, the mean summed in float32 and rounded once.

    On the CPU kernels one walk over X and U forward (the sigmoid in the same pass) and one backward, the gates
    recomputed from U there: dX_i = (dh / n) G_i, dU_i = (dh / n) X_i G_i (1 - G_i); elsewhere the formulas
    (``ops.hyper``)."""
    if type(rounding) is Rounding and (r := mhc.run_fast(backend, "fast_hyper_gated", 4, x, None, None, logits, 0.0,
                                                         0.0, rounding.where == "products")) is not None:
        return r
    _stream(x)
    _tensor("logits", logits, x, shape=x.shape)
    where = _convention(rounding, Rounding, "rounding").where
    which = core.choose_backend(backend, x, tuple(x.shape[-1:]))
    if which != "cpu" or logits.dtype == torch.float64:
        core.choose_backend("torch", x, tuple(x.shape[-1:]))
        return hyper_formulas.sigmoid_gated_collapse(x, logits, where)
    x, logits = core.uninferred((x, logits))
    return _run_cpu(_GATE, (x, logits, where), 2)


def hyper_write_read(x, y, h_post, weight, scale, base, *, convention: ProjectedGates, rounding: Rounding = ONCE,
                     h_res=None, backend: str | None = None):
    """(X', h, H_pre, H_post): ``hyper_write(x, y, h_post)`` and the next sub-layer's ``hyper_read`` of X', in one
    pass over the stream on the C kernels (``functional.mhc.mhc_write_pre`` without a mixing matrix). With ``h_res``
    (..., n, n) the write is the stream family's, X' = H_res X + H_post^T y (DeepSeek-V4's, whose final collapse is
    this read's head form), rounded once."""
    c = convention
    if type(c) is ProjectedGates and type(rounding) is Rounding and (r := mhc.run_fast(
            backend, "fast_hyper_read", x, y, h_post, h_res, rounding.where == "products", weight, scale, base, c.eps,
            c.pre_eps, c.post_scale, c.post_eps)) is not None:
        return r
    x, weight = core.uninferred((x, weight), (y, h_post, h_res, scale, base))
    _check_write(x, y, h_post)
    _check_read(x, weight, scale, base, convention)
    products = _convention(rounding, Rounding, "rounding").where == "products"
    mhc.check_write(x, y, h_post, h_res, products)
    which = core.choose_backend(backend, x, tuple(x.shape[-1:]))
    c = convention
    read = mhc_args(x, weight, scale, base, c.eps, c.pre_eps, c.post_scale, c.post_eps)
    return mhc.run_write_pre(which, (x, y, h_post, h_res, products, *read[1:]))[:4]


def hyper_write_norm(x, y, h_post, weight, *, convention: StreamNorm, rounding: Rounding = ONCE,
                     backend: str | None = None):
    """(X', N'): ``hyper_write(x, y, h_post)`` and ``stream_rms_norm`` of X' (as stored), the next gated read's
    norm. On the CPU kernels one walk over each token both ways (``torch.ops.addnorm.hyper_write_norm``): X' is
    written and normed while its rows are in cache, and the backward adds the norm's gradient of X' to X''s own in
    float32 before the write's (dX = g, dy = sum_i H_post[i] g_i, dH_post[i] = <g_i, y>); elsewhere the two
    functions."""
    if type(convention) is StreamNorm and type(rounding) is Rounding and (r := mhc.run_fast(
            backend, "fast_hyper_gated", 2, x, y, h_post, weight, convention.eps, convention.weight_offset,
            rounding.where == "products")) is not None:
        return r
    _check_write(x, y, h_post)
    w = _norm_weight(weight, x)
    c = _convention(convention, StreamNorm)
    r = _convention(rounding, Rounding, "rounding")
    which = core.resolve(backend, x, tuple(x.shape[-1:]), None)
    if which != "cpu" or w.dtype == torch.float64 or torch.float64 in (y.dtype, h_post.dtype):
        x2 = hyper_write(x, y, h_post, rounding=r)
        return x2, stream_rms_norm(x2, weight, convention=c, backend=backend)
    core.choose_backend(which, x, tuple(x.shape[-1:]))
    x, y, h_post, w = core.uninferred((x, y, h_post, w))
    return tuple(_run_cpu(_WRITE_NORM, (x, y, h_post, w, c.eps, c.weight_offset, r.where), 4))
