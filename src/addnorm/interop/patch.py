"""Fuse a HuggingFace model's residual adds with the norms that follow them, in place, by structure.

A decoder layer is recognised by what it holds, not by its class name:

    sequential pre-norm   norm1 -> attention -> add -> norm2 -> MLP -> add
                          (GPT-2: ln_1/attn/ln_2/mlp; Llama and every Llama-like -- Mistral, Mixtral, Qwen2/3
                          and their MoE versions, Granite-free Llama clones, SmolLM3, OLMo, Helium, ...:
                          input_layernorm/self_attn/post_attention_layernorm/mlp)
    sandwich              norm -> attention -> norm -> add -> norm -> MLP -> norm -> add
                          (Gemma2, Gemma3: post_attention_layernorm on the branch, pre_feedforward_layernorm
                          after the add)

In both, the add after attention and the norm after it become one ``add_layer_norm`` / ``add_rms_norm``
call. Each norm's convention is read from the norm itself by probing it (not from its class): RMSNorm
with Llama's cast order (normalize in float32, cast, multiply), Gemma's zero-centred ``(1 + w)`` weight
multiplied in float32, or LayerNorm with or without weight and bias. A layer that matches no structure,
or a norm that matches no convention, is refused -- before anything changes -- with the structures that
are supported. Everything else is untouched: the norm modules stay HF's own (same classes, same
Parameter objects, same state_dict keys), so HF Trainer groups weight decay as before, and
``torch.save`` / ``save_pretrained`` see the model they always saw.

The patched forward is an instance attribute (a ``functools.partial`` of a module-level function, so the
model still pickles); ``unpatch_hf_model`` removes it. Patching twice is a no-op. Unless
``verify=False``, the patched model is run once on a few tokens beside the original and the patch is
undone and refused if any output differs beyond float32 rounding.
"""

from __future__ import annotations

import copy
import functools
import inspect
from dataclasses import dataclass

import torch
from torch import nn

from .. import functional as AF

# (structure, attention, the norm before attention, the norm fused with the add, branch norm, MLP, MLP branch norm)
_STRUCTURES = {
    "sequential (GPT-2)": ("attn", "ln_1", "ln_2", None, "mlp", None),
    "sequential (Llama-like)": ("self_attn", "input_layernorm", "post_attention_layernorm", None, "mlp", None),
    "sandwich (Gemma2/3)": ("self_attn", "input_layernorm", "pre_feedforward_layernorm", "post_attention_layernorm",
                            "mlp", "post_feedforward_layernorm"),
}
_SUPPORTED = "; ".join(f"{k}: {', '.join(n for n in v if n)}" for k, v in _STRUCTURES.items())


@dataclass(frozen=True)
class NormConvention:
    kind: str  # "layer" | "rms"
    eps: float
    weight_offset: float  # 1.0: Gemma's (1 + w)
    cast_before_weight: bool  # Llama's order
    promotes_with_weight: bool  # the output dtype is promote(input, weight) (Llama's `weight * x.to(dtype)`)


@dataclass(frozen=True)
class LayerPlan:
    structure: str
    attn: str
    norm1: str
    fused: str
    branch_norm: str | None
    mlp: str
    mlp_norm: str | None
    convention: NormConvention
    signature: inspect.Signature


def _eps(norm: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps", "epsilon"):
        v = getattr(norm, name, None)
        if isinstance(v, float | int) and not isinstance(v, bool):
            return float(v)
    return None


def _candidates(norm: nn.Module, eps: float | None):
    """Conventions to try; a norm with no eps attribute (OLMo's parameter-free LayerNorm) is tried with
    the usual constants."""
    w, b = getattr(norm, "weight", None), getattr(norm, "bias", None)
    for e in (eps,) if eps is not None else (1e-5, 1e-6):
        if isinstance(norm, nn.LayerNorm) or b is not None:
            yield NormConvention("layer", e, 0.0, False, False)
            continue
        yield NormConvention("rms", e, 0.0, True, True)  # Llama
        yield NormConvention("rms", e, 1.0, False, False)  # Gemma
        yield NormConvention("rms", e, 0.0, False, False)
        yield NormConvention("layer", e, 0.0, False, False)  # a LayerNorm without bias or weight (Cohere, OLMo)
        if w is not None:
            yield NormConvention("rms", e, 0.0, True, False)


def _apply(conv: NormConvention, norm: nn.Module, s: torch.Tensor, out_dtype=None, residual=None):
    w, b = getattr(norm, "weight", None), getattr(norm, "bias", None)
    D = s.shape[-1]
    if conv.kind == "layer":
        return AF.add_layer_norm(s, residual, D, w, b, conv.eps, weight_offset=conv.weight_offset,
                                 out_dtype=out_dtype)
    return AF.add_rms_norm(s, residual, D, w, conv.eps, weight_offset=conv.weight_offset,
                           cast_before_weight=conv.cast_before_weight, out_dtype=out_dtype)


def _out_dtype(conv: NormConvention, norm: nn.Module, s_dtype: torch.dtype) -> torch.dtype:
    w = getattr(norm, "weight", None)
    return torch.promote_types(s_dtype, w.dtype) if conv.promotes_with_weight and w is not None else s_dtype


@torch.no_grad()
def probe_convention(norm: nn.Module) -> NormConvention | None:
    """The convention whose addnorm call reproduces ``norm`` on probes in float32 and (for the cast order)
    bfloat16, or None."""
    eps = _eps(norm)
    w = getattr(norm, "weight", None)
    if w is not None and (not isinstance(w, torch.Tensor) or w.dim() != 1):
        return None
    D = w.shape[0] if w is not None else (tuple(getattr(norm, "normalized_shape", ())) or (None,))[-1]
    if not isinstance(D, int) or D <= 0:
        return None
    g = torch.Generator().manual_seed(0)
    device = w.device if w is not None else torch.device("cpu")
    probe = (torch.randn(4, D, generator=g) * 3 + 1).to(device)
    low = copy.deepcopy(norm).to(torch.bfloat16)
    low_f32w = copy.deepcopy(norm).float()
    probe16 = probe.to(torch.bfloat16)
    want = norm(probe.to(w.dtype if w is not None else torch.float32))
    want16, want_mixed = low(probe16), low_f32w(probe16)
    best, best_err = None, None
    for conv in _candidates(norm, eps):
        try:
            x = probe.to(w.dtype if w is not None else torch.float32)
            got = _apply(conv, norm, x, _out_dtype(conv, norm, x.dtype))[0]
            got16 = _apply(conv, low, probe16)[0]
            got_mixed = _apply(conv, low_f32w, probe16, _out_dtype(conv, low_f32w, probe16.dtype))[0]
        except (RuntimeError, TypeError, ValueError):
            continue
        if not (got.dtype == want.dtype and got_mixed.dtype == want_mixed.dtype and got16.dtype == want16.dtype
                and torch.allclose(got.float(), want.float(), atol=1e-5, rtol=1e-5)
                and torch.allclose(got_mixed.float(), want_mixed.float(), atol=1e-2, rtol=1e-2)):
            continue
        # in bfloat16 the cast orders differ by an ulp here and there: the convention that matches best,
        # and at most an ulp from the module anywhere
        err = (got16.float() - want16.float()).abs()
        if (err <= 2.0**-7 * want16.float().abs().clamp_min(1e-3)).all():
            n_diff = int((err > 0).sum())
            if best is None or n_diff < best_err:
                best, best_err = conv, n_diff
    return best


def _plan(layer: nn.Module) -> LayerPlan | str | None:
    """The layer's plan; a string saying why a layer-like module cannot be patched; None for other modules."""
    for structure, names in _STRUCTURES.items():
        attn, norm1, fused, branch, mlp, mlp_norm = names
        present = [n for n in names if n]
        if not all(isinstance(getattr(layer, n, None), nn.Module) for n in present):
            continue
        if structure.startswith("sequential") and (getattr(layer, "pre_feedforward_layernorm", None) is not None
                                                   or getattr(layer, "crossattention", None) is not None):
            continue
        if any(hasattr(layer, a) for a in ("residual_multiplier", "use_parallel_residual", "parallel_attn")):
            return f"{type(layer).__name__} scales or splits its residual branches"
        conv = probe_convention(getattr(layer, fused))
        if conv is None:
            return f"{type(layer).__name__}.{fused} ({type(getattr(layer, fused)).__name__}) follows no known norm " \
                   "convention"
        return LayerPlan(structure, attn, norm1, fused, branch, mlp, mlp_norm, conv,
                         inspect.signature(type(layer).forward))
    return None


def _attn_kwargs(plan: LayerPlan, layer, hidden_states, args, kwargs) -> dict:
    bound = plan.signature.bind(layer, hidden_states, *args, **kwargs)
    out = {}
    for i, (name, value) in enumerate(bound.arguments.items()):
        if i < 2:  # self, hidden_states
            continue
        if plan.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        else:
            out[name] = value
    if plan.attn == "attn":  # GPT-2's attention takes no encoder arguments from the block (no cross-attention)
        out.pop("encoder_hidden_states", None)
        out.pop("encoder_attention_mask", None)
    return out


def _fused_add_norm(plan: LayerPlan, norm: nn.Module, branch: torch.Tensor, residual: torch.Tensor):
    """(norm(residual + branch), residual + branch) as HF computes them, in one pass where the dtypes allow."""
    s_dtype = torch.promote_types(branch.dtype, residual.dtype)
    if residual.dtype == branch.dtype or (residual.dtype == torch.float32 and branch.dtype in (torch.bfloat16,
                                                                                             torch.float16)):
        return _apply(plan.convention, norm, branch, _out_dtype(plan.convention, norm, s_dtype), residual)
    s = residual + branch
    return norm(s), s


def _patched_forward(layer: nn.Module, hidden_states, *args, **kwargs):
    plan: LayerPlan = layer._addnorm_plan
    attn_kwargs = _attn_kwargs(plan, layer, hidden_states, args, kwargs)
    residual = hidden_states
    h = getattr(layer, plan.norm1)(hidden_states)
    if plan.attn == "attn":
        out = getattr(layer, plan.attn)(h, **attn_kwargs)
    else:
        out = getattr(layer, plan.attn)(hidden_states=h, **attn_kwargs)
    a = out[0] if isinstance(out, tuple) else out
    if plan.branch_norm is not None:
        a = getattr(layer, plan.branch_norm)(a)
    normed, hidden_states = _fused_add_norm(plan, getattr(layer, plan.fused), a, residual)
    m = getattr(layer, plan.mlp)(normed)
    m = m[0] if isinstance(m, tuple) else m
    if plan.mlp_norm is not None:
        m = getattr(layer, plan.mlp_norm)(m)
    return hidden_states + m


def _layers(model: nn.Module):
    """(name, plan or refusal) of every decoder layer, outermost first; the inside of a layer is not searched."""
    found, skip = [], ()
    for name, module in model.named_modules():
        if skip and name.startswith(skip):
            continue
        plan = getattr(module, "_addnorm_plan", None) or _plan(module)
        if plan is not None:
            found.append((name, module, plan))
            skip = name + "." if name else ""
    return found


def patch_hf_model(model: nn.Module, *, verify: bool = True) -> nn.Module:
    """Fuse each decoder layer's attention add with the norm after it; returns the model (patched in place).

    Counts are in ``model._addnorm_patched``; raises before changing anything when a layer is not supported."""
    layers = _layers(model)
    refused = [(n, p) for n, _, p in layers if isinstance(p, str)]
    if refused:
        raise NotImplementedError(f"{type(model).__name__}: {refused[0][0]}: {refused[0][1]}; supported decoder "
                                  f"layers are {_SUPPORTED}. Nothing was changed.")
    if not layers:
        raise ValueError(f"{type(model).__name__} has no decoder layer addnorm can patch; supported: {_SUPPORTED}")
    new = [(m, p) for _, m, p in layers if getattr(m, "_addnorm_plan", None) is None]
    before = _probe_outputs(model) if verify and new else None
    for module, plan in new:
        module._addnorm_plan = plan
        module.forward = functools.partial(_patched_forward, module)
    if before is not None:
        try:
            after = _probe_outputs(model)
            problem = None if _same(before, after) else "changed the model's outputs on a probe"
        except Exception as e:  # noqa: BLE001  (whatever the layer's code raised: undone, then reported)
            problem = f"raised {type(e).__name__}: {e}"
        if problem:
            for module, _ in new:
                _unpatch_layer(module)
            raise NotImplementedError(f"{type(model).__name__}: the patched layers {problem}, so the patch was undone "
                                      f"(nothing was changed); supported decoder layers are {_SUPPORTED}")
    structures = sorted({p.structure for _, _, p in layers})
    model._addnorm_patched = {"layers": len(layers), "fused_adds": len(layers), "structures": structures}
    return model


def _unpatch_layer(module: nn.Module) -> None:
    module.__dict__.pop("forward", None)
    module.__dict__.pop("_addnorm_plan", None)


def unpatch_hf_model(model: nn.Module) -> nn.Module:
    """Undo ``patch_hf_model``: every layer's own forward again."""
    for module in model.modules():
        _unpatch_layer(module)
    model.__dict__.pop("_addnorm_patched", None)
    return model


@torch.no_grad()
def _probe_outputs(model: nn.Module):
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if not vocab:
        return None
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return None
    ids = torch.randint(0, vocab, (1, 6), generator=torch.Generator().manual_seed(0)).to(device)
    training = model.training
    model.eval()
    try:
        out = model(input_ids=ids)
    finally:
        model.train(training)
    t = getattr(out, "logits", None)
    if t is None:
        t = getattr(out, "last_hidden_state", None)
    return t if t is not None else (out[0] if isinstance(out, tuple) else None)


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    scale = max(1.0, a.float().abs().max().item())
    return a.shape == b.shape and bool(((a.float() - b.float()).abs() <= 1e-4 * scale).all())
