"""A HuggingFace norm's convention, and addnorm's fused calls that reproduce it.

A patched norm carries ``_addnorm_convention`` (found by ``patch.probe_convention``). These functions run
that norm -- alone, after an add, before an add, or after a two- or three-term sum with one or two norms
reading it -- on addnorm's operators, exactly as the module computes it, or return None where the dtypes
leave no single fused call with the module's rounding (the caller then runs the eager code).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import functional as AF
from ..functional import fused as FF

_LOW = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class NormConvention:
    kind: str  # "layer" | "rms"
    eps: float | None  # None: the input dtype's eps (torch's RMSNorm with eps=None)
    weight_offset: float  # 1.0: Gemma's (1 + w), Nemotron's LayerNorm1P
    cast_before_weight: bool  # Llama's order
    promotes_with_weight: bool  # the output dtype is promote(input, weight) (Llama's `weight * x.to(dtype)`)


def convention(norm) -> NormConvention | None:
    """The norm's convention, or None where it must run as a module: not patched, or with hooks of its own
    (a hook registered after patching must still see the call)."""
    if not isinstance(norm, nn.Module) or norm._forward_hooks or norm._forward_pre_hooks:
        return None
    conv = norm.__dict__.get("_addnorm_convention")
    if conv is not None and conv.kind == "layer" and torch.cuda.is_available() and torch.is_autocast_enabled("cuda"):
        return None  # CUDA autocast runs layer_norm in float32 and returns float32: the module's own call does
    return conv


_EPS_NAMES = ("variance_epsilon", "eps", "epsilon")


def declared_eps(norm: nn.Module) -> tuple[bool, float | None]:
    """(found, value) of the module's eps attribute as it is now: the first of ``_EPS_NAMES`` holding a number
    or None (None: the input dtype's eps, as torch's RMSNorm with eps=None)."""
    for name in _EPS_NAMES:
        if name in norm.__dict__ or hasattr(type(norm), name):
            v = getattr(norm, name)
            if v is None or (isinstance(v, float | int) and not isinstance(v, bool)):
                return True, None if v is None else float(v)
    return False, None


def eps(conv: NormConvention, norm: nn.Module):
    """The module's eps as it is now (a user may change it after patching), else the probed one."""
    found, v = declared_eps(norm)
    return v if found else conv.eps


def out_dtype(conv: NormConvention, norm: nn.Module, s_dtype: torch.dtype) -> torch.dtype:
    w = getattr(norm, "weight", None)
    return torch.promote_types(s_dtype, w.dtype) if conv.promotes_with_weight and w is not None else s_dtype


def apply(conv: NormConvention, norm: nn.Module, s: torch.Tensor, out_dtype=None, residual=None):
    """``(norm(residual + s), residual + s)``; with ``residual=None``, ``(norm(s), s)``."""
    w, b = getattr(norm, "weight", None), getattr(norm, "bias", None)
    D = s.shape[-1]
    e = eps(conv, norm)
    if conv.kind == "layer":
        return AF.add_layer_norm(s, residual, D, w, b, e, weight_offset=conv.weight_offset, out_dtype=out_dtype)
    return AF.add_rms_norm(s, residual, D, w, e, weight_offset=conv.weight_offset,
                           cast_before_weight=conv.cast_before_weight, out_dtype=out_dtype)


def _fits(norm, x) -> bool:
    w = getattr(norm, "weight", None)
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() > 0 and (
        w is None or (w.dim() == 1 and x.shape[-1] == w.shape[0]))


def _stream_pair(a, b):
    """(branch, residual) for one fused add of a and b, or None where eager's promotion has no fused form:
    equal dtypes, or a float32 stream beside a 16-bit branch."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape \
            or a.device != b.device:
        return None
    if a.dtype == b.dtype:
        return b, a
    if a.dtype == torch.float32 and b.dtype in _LOW:
        return b, a
    if b.dtype == torch.float32 and a.dtype in _LOW:
        return a, b
    return None


def add_then_norm(norm, a, b):
    """``(norm(a + b), a + b)`` in one pass, or None."""
    conv = convention(norm)
    pair = _stream_pair(a, b)
    if conv is None or pair is None or not _fits(norm, a):
        return None
    branch, residual = pair
    s_dtype = torch.promote_types(a.dtype, b.dtype)
    return apply(conv, norm, branch, out_dtype(conv, norm, s_dtype), residual)


def norm_then_add(norm, branch, other):
    """``other + norm(branch)`` in one pass, or None (the norm's output must be in branch's dtype, as the
    fused operator rounds it, and the add's promotion one the operator has)."""
    conv = convention(norm)
    if conv is None or not _fits(norm, branch) or not isinstance(other, torch.Tensor) \
            or other.shape != branch.shape or other.device != branch.device:
        return None
    if out_dtype(conv, norm, branch.dtype) != branch.dtype:
        return None
    if not (other.dtype == branch.dtype or (other.dtype == torch.float32 and branch.dtype in _LOW)):
        return None
    w, b = getattr(norm, "weight", None), getattr(norm, "bias", None)
    D = branch.shape[-1]
    e = eps(conv, norm)
    if conv.kind == "layer":
        return FF.layer_norm_add(branch, other, D, w, b, e, weight_offset=conv.weight_offset)
    return FF.rms_norm_add(branch, other, D, w, e, weight_offset=conv.weight_offset,
                           cast_before_weight=conv.cast_before_weight)


def _compatible(c1: NormConvention, n1, c2: NormConvention, n2) -> bool:
    return (c1.kind, eps(c1, n1), c1.weight_offset, c1.cast_before_weight) == (
        c2.kind, eps(c2, n2), c2.weight_offset, c2.cast_before_weight)


def sum_then_norms(norms, terms):
    """``(s, [(norm, norm(s)), ...])`` for ``s = (t1 + t2) [+ t3]``, in one pass, or None. One or two norms
    with the same kind and eps (a third reader, or an incompatible second, computes its own); every term of
    one dtype, which each norm's output keeps."""
    norms = [n for n in norms if convention(n) is not None][:2]
    if not norms or len(terms) not in (2, 3):
        return None
    t0 = terms[0]
    if not all(isinstance(t, torch.Tensor) and t.dtype == t0.dtype and t.shape == t0.shape
               and t.device == t0.device for t in terms) or not all(_fits(n, t0) for n in norms):
        return None
    convs = [convention(n) for n in norms]
    if any(out_dtype(c, n, t0.dtype) != t0.dtype for c, n in zip(convs, norms)):
        return None
    if len(norms) == 2 and not _compatible(convs[0], norms[0], convs[1], norms[1]):
        norms, convs = norms[:1], convs[:1]
    if len(norms) == 1 and len(terms) == 2:
        y, s = apply(convs[0], norms[0], terms[1], t0.dtype, terms[0])
        return s, [(norms[0], y)]
    c = convs[0]
    n1 = norms[0]
    n2 = norms[1] if len(norms) == 2 else None
    x, x2, residual = (terms[0], terms[1], terms[2]) if len(terms) == 3 else (terms[1], None, terms[0])
    D = t0.shape[-1]
    w1, w2 = getattr(n1, "weight", None), getattr(n2, "weight", None) if n2 is not None else None
    if n2 is not None and w2 is None and getattr(n2, "bias", None) is None:
        return None  # the operator tells a second output by its parameters
    if c.kind == "layer":
        b1, b2 = getattr(n1, "bias", None), getattr(n2, "bias", None) if n2 is not None else None
        y, y2, s = FF.parallel_add_layer_norm(x, x2, residual, D, w1, b1, w2, b2, eps(c, n1),
                                              weight_offset=c.weight_offset, branches_first=True)
    else:
        y, y2, s = FF.parallel_add_rms_norm(x, x2, residual, D, w1, w2, eps(c, n1), weight_offset=c.weight_offset,
                                            cast_before_weight=c.cast_before_weight, branches_first=True)
    return s, [(n1, y)] if n2 is None else [(n1, y), (n2, y2)]
