"""HuggingFace hyper-connections without a mixing matrix, on addnorm's hyper operators (``functional.hyper``).

A hyper-connection module is recognised by what it holds, then confirmed by running it beside addnorm's call on a
probe stream (as a norm's convention is found by probing it, ``patch.probe_convention``):

    "ihc"       HY-V4's ``HYV4HyperConnection``: fn (2n, nC), base (2n,), scale (2,), hc_mult, hc_eps,
                hc_post_magnitude, input_norm.eps                   X -> (H_post, h)
    "ihc_head"  HY-V4's ``HYV4HyperHead``: hc_fn (n, nC), hc_base (n,), hc_scale (1,), eps, input_norm.eps
                                                                    X -> h (the final collapse)
    "gated"     Qwen4-exp's ``Qwen4ExpTextGatedResidual``: hc_norm (grouped, weight nC), input_mix_weight_down/up,
                block_inject_weight, hc_count, hidden_size          X -> (h, X, a)
    "gated_mixer"  the same without block_inject_weight (the model's final mixer)     X -> h

A patched module's forward runs its read on one operator (``hyper_read``: the RMS of vec(X), the gates and the
collapse; or ``stream_rms_norm``, its own Linear layers for the low-rank gate up to its logits,
``sigmoid_gated_collapse``), unless the write before it already computed that read (``write``, the hand-off of
``interop.handoff``).

``write`` is what a rewritten decoder layer calls in place of a write of its stream, ``X + H_post^T y`` however
the layer spells it (``interop.hyper_rewrite``): one ``hyper_write``, or, where a probe run found the next read
of its result (the same layer's second hyper-connection, the next layer's first, the final collapse), the write
and that read together (``hyper_write_read`` / ``hyper_write_norm``), the read's output left for its module.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import functional as AF
from ..functional.hyper import PRODUCTS, ProjectedGates, Rounding, StreamNorm
from . import handoff

_STREAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # float64: HF's modules compute in float32 there


@dataclass(frozen=True)
class HyperPlan:
    kind: str  # "ihc" | "ihc_head" | "gated" | "gated_mixer"
    n: int  # streams
    C: int  # channels per stream
    convention: ProjectedGates | StreamNorm

    @property
    def final(self) -> bool:
        """A final collapse: it returns h alone, and nothing is written after it."""
        return self.kind in ("ihc_head", "gated_mixer")


def _param(module, name, shape) -> bool:
    t = getattr(module, name, None)
    return isinstance(t, torch.Tensor) and t.is_floating_point() and tuple(t.shape) == tuple(shape)


def _number(module, name):
    v = getattr(module, name, None)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def _int(module, name):
    v = getattr(module, name, None)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None


def _ihc(module) -> HyperPlan | None:
    n, eps = _int(module, "hc_mult"), _number(getattr(module, "input_norm", None), "eps")
    fn = getattr(module, "fn", None)
    if n is None or eps is None or not isinstance(fn, torch.Tensor) or fn.dim() != 2 or fn.shape[1] % n:
        return None
    C = fn.shape[1] // n
    hc_eps, magnitude = _number(module, "hc_eps"), _number(module, "hc_post_magnitude")
    if (hc_eps is None or magnitude is None or not _param(module, "fn", (2 * n, n * C))
            or not _param(module, "base", (2 * n,)) or not _param(module, "scale", (2,))):
        return None
    return HyperPlan("ihc", n, C, ProjectedGates(eps, pre_eps=hc_eps, post_scale=magnitude, post_eps=hc_eps))


def _ihc_head(module) -> HyperPlan | None:
    n, eps = _int(module, "hc_mult"), _number(getattr(module, "input_norm", None), "eps")
    fn = getattr(module, "hc_fn", None)
    if n is None or eps is None or not isinstance(fn, torch.Tensor) or fn.dim() != 2 or fn.shape[1] % n:
        return None
    C = fn.shape[1] // n
    hc_eps = _number(module, "eps")
    if (hc_eps is None or not _param(module, "hc_fn", (n, n * C)) or not _param(module, "hc_base", (n,))
            or not _param(module, "hc_scale", (1,))):
        return None
    return HyperPlan("ihc_head", n, C, ProjectedGates(eps, pre_eps=hc_eps))


def _gated(module) -> HyperPlan | None:
    n, C = _int(module, "hc_count"), _int(module, "hidden_size")
    norm = getattr(module, "hc_norm", None)
    down, up = getattr(module, "input_mix_weight_down", None), getattr(module, "input_mix_weight_up", None)
    inject = getattr(module, "block_inject_weight", "absent")
    if n is None or C is None or not isinstance(norm, nn.Module) or getattr(norm, "group_size", None) != C:
        return None
    eps = _number(norm, "eps")
    if eps is None or not _param(norm, "weight", (n * C,)) or not all(isinstance(m, nn.Linear) for m in (down, up)):
        return None
    if down.in_features != n * C or up.out_features != n * C or up.in_features != down.out_features:
        return None
    if inject is None:
        kind = "gated_mixer"
    elif isinstance(inject, nn.Linear) and inject.in_features == n * C and inject.out_features == n:
        kind = "gated"
    else:
        return None
    return HyperPlan(kind, n, C, StreamNorm(eps, weight_offset=1.0))


RECOGNISERS = (_ihc, _ihc_head, _gated)  # each: module -> HyperPlan | None, by what the module holds


def looks_like_hyper(name: str, module: nn.Module) -> bool:
    """A module that names itself a hyper-connection (its class, or the attribute it is held under): one that no
    recogniser takes is refused by name rather than left to compute on a stream the patched layers reshape."""
    leaf = name.rsplit(".", 1)[-1]
    return ("hyper" in type(module).__name__.lower() or "hyper_connection" in leaf or leaf.endswith("_hc")
            or leaf == "hc_head")


@torch.no_grad()
def probe_hyper(module: nn.Module) -> HyperPlan | None:
    """The plan whose addnorm call reproduces ``module`` on a probe stream, in float32 to HF's rounding (a 16-bit
    module: a float32 copy of it), or None."""
    for recognise in RECOGNISERS:
        plan = recognise(module)
        if plan is None:
            continue
        try:  # in float32, where only rounding separates the right plan from the module: a copy where it is not
            if any(p.dtype != torch.float32 for p in module.parameters()):
                module = copy.deepcopy(module).float()
            device = next(module.parameters()).device
            g = torch.Generator().manual_seed(0)
            x = (torch.randn(2, 3, plan.n, plan.C, generator=g) * 2 + 0.5).to(device)
            x[1] *= 1e-3  # tokens whose RMS is near eps: a wrong eps shows there
            stream = x.flatten(-2) if plan.kind.startswith("gated") else x
            want = type(module).forward(module, stream)
            got = _read(module, plan, stream, None)
        except Exception:  # noqa: BLE001  (a module that cannot run on a probe -- meta weights -- is not reproduced)
            continue
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        if len(got) == len(want) and all(
                isinstance(w, torch.Tensor) and a.shape == w.shape and a.dtype == w.dtype
                and torch.allclose(a.float(), w.float(), atol=1e-5, rtol=1e-5) for a, w in zip(got, want)):
            return plan
    return None


def _stream_view(plan: HyperPlan, x) -> torch.Tensor | None:
    """x as (..., n, C), or None where addnorm does not take it (HF's module then runs its own forward)."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _STREAM_DTYPES or x.dim() < 2:
        return None
    if plan.kind.startswith("gated"):
        return x.unflatten(-1, (plan.n, plan.C)) if x.shape[-1] == plan.n * plan.C and x.dim() >= 1 else None
    return x if tuple(x.shape[-2:]) == (plan.n, plan.C) else None


def _ihc_params(module, plan):
    if plan.kind == "ihc":
        return module.fn, module.scale, module.base
    return module.hc_fn, module.hc_scale, module.hc_base


def _gated_tail(module, plan, x, normed):
    """Qwen4-exp's read after its norm: the low-rank gate on the module's own Linear layers up to its logits, the
    sigmoid and the gated collapse in one pass (rounded where eager's ``(sigmoid(U) * N).mean`` rounds), and the
    injection weights -- as HF computes them."""
    flat = normed.flatten(-2)
    logits = module.input_mix_weight_up(F.silu(module.input_mix_weight_down(flat) / plan.n))
    h = AF.sigmoid_gated_collapse(normed, logits.unflatten(-1, (plan.n, plan.C)), rounding=PRODUCTS)
    if plan.kind == "gated_mixer":
        return h
    return h, x, 2 * torch.sigmoid(module.block_inject_weight(flat) / plan.n)


def _read(module, plan: HyperPlan, x, pending):
    """The module's output, from the read the write handed over (``pending``) or from one read of x."""
    x4 = _stream_view(plan, x)
    if plan.kind.startswith("gated"):
        norm = module.hc_norm
        if pending is None and (norm._forward_hooks or norm._forward_pre_hooks):
            pending = norm(x).unflatten(-1, (plan.n, plan.C))  # a hook on the norm still sees its call
        normed = pending if pending is not None else AF.stream_rms_norm(x4, norm.weight, convention=plan.convention)
        return _gated_tail(module, plan, x, normed)
    h, _, post = pending if pending is not None else AF.hyper_read(x4, *_ihc_params(module, plan),
                                                                   convention=plan.convention)
    return h if plan.kind == "ihc_head" else (post, h)


def hyper_forward(module: nn.Module, x, *args, **kwargs):
    """A patched hyper-connection: its read on addnorm's operators, or the module's own forward where they do
    not take the call."""
    plan: HyperPlan = module._addnorm_hyper
    pending = handoff.take(module, x)
    if args or kwargs or _stream_view(plan, x) is None:
        return type(module).forward(module, x, *args, **kwargs)
    return _read(module, plan, x, pending)


def _write_form(stream, y, coeff, to_dtype):
    """(n, C) where one hyper_write computes ``stream + coeff^T y`` as the layer does, else None: float tensors
    on one device, coeff (..., n), y (..., C), the stream (..., n, C) or flattened (..., nC), and the result in the
    stream's dtype (the layer's ``.to(dtype)``, or no promotion by y or coeff)."""
    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in (stream, y, coeff)):
        return None
    if stream.dtype not in _STREAM_DTYPES or not (stream.device == y.device == coeff.device) or coeff.dim() < 1:
        return None
    n, C = coeff.shape[-1], y.shape[-1]
    lead = tuple(coeff.shape[:-1])
    if tuple(y.shape[:-1]) != lead or tuple(stream.shape) not in (lead + (n, C), lead + (n * C,)):
        return None
    want = to_dtype if to_dtype is not None else torch.promote_types(stream.dtype,
                                                                     torch.promote_types(y.dtype, coeff.dtype))
    return (n, C) if want == stream.dtype else None


def _usable_reader(reader, x4) -> HyperPlan | None:
    """The plan of the hyper-connection found to read the write's result, where its read can be computed here: no
    pre-hook that could change its input, and (Qwen4-exp's) no hook on the norm the write would compute for it."""
    plan = reader.__dict__.get("_addnorm_hyper")
    if plan is None or reader._forward_pre_hooks or tuple(x4.shape[-2:]) != (plan.n, plan.C):
        return None
    if plan.kind.startswith("gated") and (reader.hc_norm._forward_hooks or reader.hc_norm._forward_pre_hooks):
        return None
    return plan


def write_and_read_to_hand_over(reader: nn.Module, x4: torch.Tensor, y, h_post, h_res):
    """A write of another family's stream (DeepSeek-V4's mix, X' = H_res X + H_post^T y: ``interop.deepseek_hc``)
    computed together with the read that ``reader``, the patched hyper-connection found to read X' next, makes of it
    -- DeepSeek-V4's final collapse is HY-V4's head form -- in one pass: (X', the read as ``hyper_forward`` takes
    it), or None where the read would not be handed over (a pre-hook on the reader, another shape, Qwen4-exp's
    flattened stream)."""
    plan = _usable_reader(reader, x4)
    if plan is None or plan.kind.startswith("gated"):
        return None
    x2, *read = AF.hyper_write_read(x4, y, h_post, *_ihc_params(reader, plan), convention=plan.convention,
                                    h_res=h_res)
    return x2, tuple(read)


def write(layer, site, stream, y, coeff, to_dtype, rounding, eager):
    """``eager()`` -- the layer's own ``stream + coeff^T y`` -- on one hyper_write (rounded as the layer's spelling
    rounds: ``hyper_rewrite``), fused with the next read of its result where a probe run found that read
    (``handoff``)."""
    rounding = Rounding(rounding)
    form = _write_form(stream, y, coeff, to_dtype)
    if form is None:
        s = eager()
        handoff.record(layer, site, s)
        return s
    x4 = stream if stream.dim() == y.dim() + 1 else stream.unflatten(-1, form)
    readers = handoff.readers(layer, site)
    reader = readers[0] if len(readers) == 1 and handoff.enabled(layer) else None
    plan = _usable_reader(reader, x4) if reader is not None else None
    if plan is None:
        x2 = AF.hyper_write(x4, y, coeff, rounding=rounding)
        s = x2 if x2.shape == stream.shape else x2.flatten(-2)
        handoff.record(layer, site, s)
        return s
    if plan.kind.startswith("gated"):
        x2, pending = AF.hyper_write_norm(x4, y, coeff, reader.hc_norm.weight, convention=plan.convention,
                                          rounding=rounding)
    else:
        x2, *pending = AF.hyper_write_read(x4, y, coeff, *_ihc_params(reader, plan), convention=plan.convention,
                                           rounding=rounding)
        pending = tuple(pending)
    s = x2 if x2.shape == stream.shape else x2.flatten(-2)
    handoff.give(reader, s, pending)
    return s
