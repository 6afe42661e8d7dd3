"""Attention Residuals' depth mix as one function, on the backend ``functional.core`` picks (``use_backend`` /
``backend=``):

    attn_res(sources, query, weight=None, eps=None) -> h = sum_s softmax_s(q^T RMSNorm(v_s)) v_s

Kimi Team 2026, Attention Residuals, arXiv:2603.15031, eqs. 2-4: each sub-layer's input is a softmax over depth
of the earlier layers' outputs (or, in Block AttnRes, of block sums), the keys the RMS-normalised sources and the
query a learned vector per layer. ``addnorm.model`` builds the placement ``attn_res`` from it. One pass over the
sources each way on the "cpu" backend; the "torch" backend is the same math in torch ops.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..ops import plain
from ..ops.attn_res import formulas as af
from ..ops.attn_res.autograd import DirectAttnRes
from ..ops.attn_res.schema import CPU
from ..ops.norm.autograd import c_apply as _c_apply
from . import core

__all__ = ["attn_res"]

_DIRECT = _c_apply(DirectAttnRes)


def _check(sources, query, weight):
    if isinstance(sources, torch.Tensor) or not isinstance(sources, Sequence):
        got = (f"a tensor of shape {tuple(sources.shape)}" if isinstance(sources, torch.Tensor)
               else type(sources).__name__)
        raise TypeError(f"sources must be a list or tuple of tensors (..., C), one per earlier layer, got {got}; "
                        f"a stacked (S, ..., C) tensor is list(stack)")
    if len(sources) == 0:
        raise ValueError("sources must hold at least one tensor: the softmax over depth needs a source")
    v0 = sources[0]
    for s, v in enumerate(sources):
        core.check_float_tensor(f"sources[{s}]", v)
        if v.shape != v0.shape:
            raise ValueError(f"sources[{s}] must have sources[0]'s shape {tuple(v0.shape)}, got {tuple(v.shape)}")
        if not (v.is_cpu and v0.is_cpu) and v.device != v0.device:
            raise ValueError(f"sources[{s}] is on {v.device} but sources[0] is on {v0.device}")
    if v0.dim() < 1 or v0.shape[-1] < 1:
        raise ValueError(f"sources must end in a channel axis C >= 1 (the RMS of an empty vector is undefined), "
                         f"got shape {tuple(v0.shape)}")
    C = v0.shape[-1]
    for name, t in (("query", query), ("weight", weight)):
        if name == "weight" and t is None:
            continue
        core.check_float_tensor(name, t)
        if tuple(t.shape) != (C,):
            raise ValueError(f"{name} must have shape ({C},) (one per channel of the sources), got {tuple(t.shape)}")
        if not (t.is_cpu and v0.is_cpu) and t.device != v0.device:
            raise ValueError(f"{name} is on {t.device} but the sources are on {v0.device}")
    if not torch.compiler.is_compiling() and not core.functorch_active():
        for name, t in ((f"sources[{s}]", v) for s, v in enumerate(sources)):
            core.check_storage(name, t)
        core.check_storage("query", query)
        core.check_storage("weight", weight)


def attn_res(sources: Sequence[torch.Tensor], query: torch.Tensor, weight: torch.Tensor | None = None,
             eps: float | None = None, *, backend: str | None = None) -> torch.Tensor:
    """h = sum_s alpha_s v_s, alpha = softmax_s(q^T RMSNorm(v_s)): Attention Residuals (eqs. 2-4).

    ``sources``: S >= 1 tensors of one shape (..., C), the values and (RMS-normalised) keys; their dtypes may
    differ (a float32 embedding beside bf16 layer outputs), h takes the promoted one. ``query``: the learned
    pseudo-query (C,) (zero gives the uniform average). ``weight``: the key RMSNorm's weight (C,), or None.
    ``eps``: the RMSNorm's; None is ``torch.nn.functional.rms_norm``'s default (the float32 machine epsilon).
    The statistics and the softmax are computed in float32 (float64 for float64 inputs).
    """
    _check(sources, query, weight)
    sources = list(core.uninferred(tuple(sources), (query, weight)))
    eps = core.default_rms_eps(sources[0]) if eps is None else core.check_eps(eps)
    v0 = sources[0]
    which = core.choose_backend(backend, v0, tuple(v0.shape[-1:]))
    w = torch.ones_like(query) if weight is None else weight  # q * 1 is q exactly: one operator for both
    if which == "torch":
        return af.forward(sources, query, w, eps)[0]
    if which == "cpu" and plain(v0) and not core.functorch_active():
        if core.any_needs_autograd(query, weight, *sources):
            return _DIRECT(query, w, eps, *sources)[0]
        return CPU[0](sources, query, w, eps)[0]
    return torch.ops.addnorm.attn_res(sources, query, w, eps)[0]  # its Autograd kernel is AttnRes
