"""Patch a HuggingFace model for addnorm's kernels, in place, by structure: fused Add & Norm in the decoder
layers, and every norm it can reproduce on its kernels.

A decoder layer is recognised by what it holds, not by its class name (``STRUCTURES``):

    sequential pre-norm    norm1 -> attention -> add -> norm2 -> MLP -> add
                           GPT-2 (ln_1/attn/ln_2/mlp); Llama and every Llama-like (input_layernorm/self_attn/
                           post_attention_layernorm/mlp): Mistral, Mixtral, Qwen2/3 and their MoE versions,
                           SmolLM3, OLMo, Helium, Ministral, Gemma, Phi-3, StarCoder2, StableLM, ...
    scaled branches        the same with the branches scaled before their adds (Granite)
    sandwich               norms on the branch outputs too (Gemma2/3; GLM-4's names)

A layer that holds hyper-connections (a widened stream (B, T, n, C): HY-V4, Qwen4-exp, ``interop.hyper``;
DeepSeek-V4's mHC, ``interop.deepseek_hc``) is none of these, whatever its attributes are called: its forward is
rewritten by data flow, each read of the stream on the hyper-connection's patched forward and each write fused
with the read after it.

In each, the add after attention and the norm after it become one ``add_layer_norm`` / ``add_rms_norm``
call. Where no norm follows an add inside the layer (parallel attention + MLP: GPT-NeoX, Falcon, Phi,
Cohere; post-branch norms: OLMo2, EXAONE 4, Apertus) nothing can be fused there, and only the norms run on
addnorm's kernels. Each norm's convention is read from the norm itself by probing it, not from its class:
RMSNorm with Llama's cast order, Gemma's ``(1 + w)`` weight multiplied in float32, or LayerNorm with or
without weight and bias; a norm that matches none is left as it is, except the one a fused layer needs,
which refuses the patch -- before anything changes -- naming the supported structures.

Nothing is replaced: the norm modules stay HF's own (same classes, Parameter objects, state_dict keys), so
HF Trainer groups weight decay as before and ``torch.save`` / ``save_pretrained`` see the model they always
saw. The patched forwards are instance attributes (``functools.partial`` of module-level functions, so the
model still pickles); ``unpatch_hf_model`` removes them; patching twice is a no-op. Unless
``verify=False``, the patched model is run once on a few tokens beside the original, and the patch is
undone and refused if any output differs beyond float32 rounding.
"""

from __future__ import annotations

import copy
import functools
import inspect
from dataclasses import dataclass

import torch
from torch import nn

from . import deepseek_hc, fused_sites, handoff, hyper
from .conventions import NormConvention, declared_eps
from .conventions import apply as _apply
from .conventions import out_dtype as _out_dtype
from .rewrite import rewrite_forward

@dataclass(frozen=True)
class Structure:
    """A decoder layer's shape, by the names of what it holds: attention and MLP, the norm before attention,
    the norm after the attention add (fused with it), optional norms on the branch outputs, and an optional
    scale on the branches (Granite's residual_multiplier)."""

    name: str
    attn: str
    norm1: str
    fused: str
    mlp: str
    branch_norm: str | None = None
    mlp_norm: str | None = None
    scale: str | None = None
    excludes: tuple[str, ...] = ()

    def matches(self, layer: nn.Module) -> bool:
        names = [n for n in (self.attn, self.norm1, self.fused, self.mlp, self.branch_norm, self.mlp_norm) if n]
        return (all(isinstance(getattr(layer, n, None), nn.Module) for n in names)
                and (self.scale is None or isinstance(getattr(layer, self.scale, None), float | int))
                and not any(getattr(layer, n, None) is not None for n in self.excludes))


_EXTRA = ("pre_feedforward_layernorm", "post_feedforward_layernorm", "post_self_attn_layernorm",
          "post_mlp_layernorm", "residual_multiplier", "crossattention")
# most specific first
STRUCTURES = (
    Structure("sandwich (Gemma2/3)", "self_attn", "input_layernorm", "pre_feedforward_layernorm", "mlp",
              branch_norm="post_attention_layernorm", mlp_norm="post_feedforward_layernorm"),
    Structure("sandwich (GLM-4)", "self_attn", "input_layernorm", "post_attention_layernorm", "mlp",
              branch_norm="post_self_attn_layernorm", mlp_norm="post_mlp_layernorm"),
    Structure("scaled branches (Granite)", "self_attn", "input_layernorm", "post_attention_layernorm", "mlp",
              scale="residual_multiplier", excludes=_EXTRA[:4]),
    Structure("sequential (GPT-2)", "attn", "ln_1", "ln_2", "mlp", excludes=_EXTRA),
    Structure("sequential (Llama-like)", "self_attn", "input_layernorm", "post_attention_layernorm", "mlp",
              excludes=_EXTRA),
)
_SUPPORTED = ("fused: " + "; ".join(f"{st.name} ({', '.join(n for n in (st.norm1, st.attn, st.fused, st.mlp) if n)})"
                                    for st in STRUCTURES)
              + "; elsewhere (parallel attention + MLP, post-branch norms) only the norms")


@dataclass(frozen=True)
class LayerPlan:
    structure: Structure
    signature: inspect.Signature


def _eps(norm: nn.Module) -> float | None:
    return declared_eps(norm)[1]


def _candidates(norm: nn.Module, eps: float | None):
    """Conventions to try; a norm with no eps attribute (OLMo's parameter-free LayerNorm) is tried with
    the usual constants."""
    w, b = getattr(norm, "weight", None), getattr(norm, "bias", None)
    for e in (eps,) if eps is not None else (1e-5, 1e-6):
        if isinstance(norm, nn.LayerNorm) or b is not None:
            yield NormConvention("layer", e, 0.0, False, False)
            yield NormConvention("layer", e, 1.0, False, False)  # Nemotron's LayerNorm1P: (1 + w)
            continue
        yield NormConvention("rms", e, 0.0, True, True)  # Llama
        yield NormConvention("rms", e, 1.0, False, False)  # Gemma
        yield NormConvention("rms", e, 0.0, False, False)
        yield NormConvention("layer", e, 0.0, False, False)  # a LayerNorm without bias or weight (Cohere, OLMo)
        if w is not None:
            yield NormConvention("rms", e, 0.0, True, False)


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
    probe = torch.randn(4, D, generator=g) * 3 + 1
    probe[2:] *= 1e-3  # rows whose mean square is near eps: a convention with the wrong eps shows there
    probe = probe.to(device)
    try:  # a norm that cannot run on a probe (meta weights, an unusual signature) is not reproduced
        low = copy.deepcopy(norm).to(torch.bfloat16)
        low_f32w = copy.deepcopy(norm).float()
        probe16 = probe.to(torch.bfloat16)
        native = probe.to(w.dtype if w is not None else torch.float32)
        want = norm(native)
        want32 = want if native.dtype == torch.float32 else low_f32w(probe)  # a float32 module: the same call
        want16 = low(probe16)
    except Exception:  # noqa: BLE001
        return None
    try:  # a bf16 input beside float32 weights: torch's CPU LayerNorm takes it, its CUDA LayerNorm raises
        want_mixed = low_f32w(probe16)
    except RuntimeError:
        want_mixed = None  # the module itself has no mixed behaviour to reproduce: nothing to compare
    if not all(isinstance(t, torch.Tensor) for t in (want32, want, want16)) or not (
            want_mixed is None or isinstance(want_mixed, torch.Tensor)):
        return None
    best, best_err = None, None
    for conv in _candidates(norm, eps):
        try:
            got = _apply(conv, norm, native, _out_dtype(conv, norm, native.dtype))[0]
            got32 = (got if native.dtype == torch.float32 else
                     _apply(conv, low_f32w, probe, _out_dtype(conv, low_f32w, probe.dtype))[0])
            got16 = _apply(conv, low, probe16)[0]
            got_mixed = (None if want_mixed is None else
                         _apply(conv, low_f32w, probe16, _out_dtype(conv, low_f32w, probe16.dtype))[0])
        except (RuntimeError, TypeError, ValueError):
            continue
        mixed_ok = want_mixed is None or (got_mixed.dtype == want_mixed.dtype and torch.allclose(
            got_mixed.float(), want_mixed.float(), atol=1e-2, rtol=1e-2))
        # the math in float32, where only rounding separates the right convention from the module; the module's
        # own dtype and bfloat16 within an ulp of the terms (_ulp_close): a float16 or bfloat16 module's weight
        # (1 + w rounded to its dtype first, Nemotron's) or output may land an ulp away from the kernel's
        if not (got32.dtype == want32.dtype and got.dtype == want.dtype and got16.dtype == want16.dtype
                and mixed_ok and torch.allclose(got32.float(), want32.float(), atol=1e-5, rtol=1e-5)
                and _ulp_close(got, want, conv, norm, native)):
            continue
        # in bfloat16 the cast orders differ by an ulp here and there: the convention that matches best,
        # and at most an ulp from the module anywhere
        if _ulp_close(got16, want16, conv, low, probe16):
            n_diff = int((got16 != want16).sum())
            if best is None or n_diff < best_err:
                best, best_err = conv, n_diff
    return best


def _ulp_close(got: torch.Tensor, want: torch.Tensor, conv: NormConvention, norm: nn.Module, x: torch.Tensor) -> bool:
    """Within an ulp (the dtype's eps) of the terms ``|xhat (w + offset)| + |b|``, computed in float64: an output
    that a bias cancels to near 0 is judged on the terms' scale, where one rounding of (1 + w) or of the product
    lands, not on its own (the check ``2^-7 |want|`` refused Nemotron's trained LayerNorm1P in bfloat16)."""
    if got.dtype == torch.float32:
        return torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    xd = x.double()
    e = conv.eps if conv.eps is not None else torch.finfo(x.dtype).eps
    if conv.kind == "layer":
        xhat = (xd - xd.mean(-1, keepdim=True)) * torch.rsqrt(xd.var(-1, unbiased=False, keepdim=True) + e)
    else:
        xhat = xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + e)
    w, b = getattr(norm, "weight", None), getattr(norm, "bias", None)
    terms = (xhat * (w.double() + conv.weight_offset) if isinstance(w, torch.Tensor) else xhat).abs()
    if isinstance(b, torch.Tensor):
        terms = terms + b.double().abs()
    ulp = torch.finfo(got.dtype).eps
    return bool(((got.double() - want.double()).abs() <= ulp * terms.clamp_min(1e-3)).all())


def _plan(layer: nn.Module) -> LayerPlan | str | None:
    """The layer's plan; a string saying why a layer of a known structure cannot be fused; None for other
    modules."""
    for st in STRUCTURES:
        if not st.matches(layer):
            continue
        norm = getattr(layer, st.fused)
        conv = probe_convention(norm)
        if conv is None:
            return f"{type(layer).__name__}.{st.fused} ({type(norm).__name__}) follows no known norm convention"
        return LayerPlan(st, inspect.signature(type(layer).forward))
    return None


def _is_norm(module: nn.Module) -> bool:
    """A leaf that may be a norm (the probe decides): torch's norms, or a leaf named like one."""
    # GroupNorm(1, C) behaves as a LayerNorm on a 2-D probe but normalizes (C, L) together, BatchNorm and
    # InstanceNorm other dims again: never taken for one, whatever their class is called (PoolFormerGroupNorm)
    if isinstance(module, nn.GroupNorm | nn.modules.batchnorm._NormBase | nn.LocalResponseNorm | nn.CrossMapLRN2d):
        return False
    name = type(module).__name__.lower()
    return (not any(True for _ in module.children())
            and (isinstance(module, nn.LayerNorm | nn.RMSNorm)
                 or (name.endswith("norm") and not any(k in name for k in ("groupnorm", "batchnorm", "instancenorm")))))


def _norm_forward(norm: nn.Module, x, *args, **kwargs):
    """A patched norm: the output a layer's fused sum left for it (``handoff``), else addnorm's kernel where it
    takes the input, else the module's own forward."""
    y = handoff.take(norm, x)
    if y is not None and not args and not kwargs:
        return y
    conv: NormConvention = norm._addnorm_convention
    w = getattr(norm, "weight", None)
    if (args or kwargs or not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() == 0
            or (w is not None and x.shape[-1] != w.shape[0])
            or (conv.kind == "layer" and x.is_cuda and torch.is_autocast_enabled("cuda"))):  # float32 there
        return type(norm).forward(norm, x, *args, **kwargs)
    return _apply(conv, norm, x, _out_dtype(conv, norm, x.dtype))[0]


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
    if plan.structure.attn == "attn":  # GPT-2's attention takes no encoder arguments from the block
        out.pop("encoder_hidden_states", None)
        out.pop("encoder_attention_mask", None)
    return out


def _patched_forward(layer: nn.Module, hidden_states, *args, **kwargs):
    plan: LayerPlan = layer._addnorm_plan
    st = plan.structure
    attn_kwargs = _attn_kwargs(plan, layer, hidden_states, args, kwargs)
    residual = hidden_states
    h = getattr(layer, st.norm1)(hidden_states)
    if st.attn == "attn":
        out = getattr(layer, st.attn)(h, **attn_kwargs)
    else:
        out = getattr(layer, st.attn)(hidden_states=h, **attn_kwargs)
    a = out[0] if isinstance(out, tuple) else out
    if st.branch_norm is not None:
        a = getattr(layer, st.branch_norm)(a)
    if st.scale is not None:
        a = a * getattr(layer, st.scale)
    normed, hidden_states = fused_sites.add_norm(layer, st.fused, residual, a)
    m = getattr(layer, st.mlp)(normed)
    m = m[0] if isinstance(m, tuple) else m
    if st.mlp_norm is not None:
        m = getattr(layer, st.mlp_norm)(m)
    if st.scale is not None:
        m = m * getattr(layer, st.scale)
    return fused_sites.layer_sum(layer, "out", hidden_states, m)


def _checkpointed(layer: nn.Module, forward, args, kwargs):
    """``forward(layer, *args, **kwargs)``, under HF's gradient checkpointing when the layer has it on, with
    HF's own rules (GradientCheckpointingLayer.__call__ drops the cache arguments); an instance ``forward``
    would otherwise bypass it."""
    if (getattr(layer, "gradient_checkpointing", False) and layer.training and torch.is_grad_enabled()
            and callable(getattr(layer, "_gradient_checkpointing_func", None))):
        if kwargs.get("use_cache"):
            kwargs["use_cache"] = False
        if not getattr(layer, "_can_checkpoint_with_cache", False):
            for name in ("cache", "past_key_values", "layer_past"):
                if kwargs.get(name) is not None:
                    kwargs[name] = None
        return layer._gradient_checkpointing_func(functools.partial(forward, layer, **kwargs), *args)
    return forward(layer, *args, **kwargs)


def _structure_forward(layer: nn.Module, *args, **kwargs):
    return _checkpointed(layer, _patched_forward, args, kwargs)


def _rewritten_forward(layer: nn.Module, *args, **kwargs):
    fn = rewrite_forward(type(layer), layer._addnorm_sites).function
    return _checkpointed(layer, fn, args, kwargs)


def _decoder_layers(model: nn.Module, norms: set[int]):
    """(name, module) of each outermost element of a ModuleList that holds a norm: the decoder layers,
    whatever they are called."""
    found, skip = [], None
    for name, module in model.named_modules():
        if skip is not None and name.startswith(skip):
            continue
        if isinstance(module, nn.ModuleList):
            for i, layer in enumerate(module):
                if any(id(m) in norms for m in layer.modules()):
                    found.append((f"{name}.{i}" if name else str(i), layer))
            if found:
                skip = name + "." if name else ""
    return found


def _layers(model: nn.Module, norms: list, hypers: list = ()):
    """(name, module, plan, owner) of every decoder layer (owner None) and of each of its children that adds a
    ``residual`` argument inside (owner: its decoder layer, with which it checkpoints). The plan is a LayerPlan
    (a known structure), a frozenset of the norm and hyper-connection attributes its rewritten forward fuses
    (``interop.rewrite``), or a string saying why a layer of a known structure cannot be fused."""
    conv = {id(m): c for m, c in norms}
    held = {id(m) for m, _ in hypers}
    found = []
    for name, layer in _decoder_layers(model, set(conv) | held):
        plan = getattr(layer, "_addnorm_plan", None) or getattr(layer, "_addnorm_sites", None)
        streams = sorted(n for n, m in layer.named_children() if id(m) in held)
        if plan is None and streams:  # a widened stream: no sequential structure's forward takes it
            sites = frozenset(n for n, m in layer.named_children() if id(m) in conv or id(m) in held)
            plan = _hyper_plan(layer, sites, streams)
        elif plan is None:
            plan = _plan(layer)
            if not isinstance(plan, str):
                sites = frozenset(n for n, m in layer.named_children() if id(m) in conv)
                if rewrite_forward(type(layer), sites) is not None:
                    plan = sites
                elif plan is not None and not _library_forward(layer):
                    plan = None  # its own forward kept (its norms are still patched)
        if plan is not None:
            found.append((name, layer, plan, None))
        for child_name, child in layer.named_children():  # BLOOM's attention and MLP, MPT's FFN add inside
            if ("residual" in _parameters(type(child).forward) and getattr(child, "_addnorm_sites", None) is None
                    and rewrite_forward(type(child), frozenset()) is not None):
                found.append((f"{name}.{child_name}", child, frozenset(), layer))
            elif getattr(child, "_addnorm_sites", None) is not None:
                found.append((f"{name}.{child_name}", child, child._addnorm_sites, layer))
    return found


def _library_forward(layer: nn.Module) -> bool:
    """Whether the forward a layer runs is a library's own (HF's, addnorm's). A structure's generic forward stands in
    only for those: a subclass that overrides forward -- super().forward() plus a steering vector, a drop-path --
    cannot be rewritten (its super() needs the closure), and the generic forward would silently drop what it adds."""
    owner = next((c for c in type(layer).__mro__ if "forward" in c.__dict__), None)
    return owner is not None and owner.__module__.split(".")[0] in ("transformers", "addnorm")


def _installable(module: nn.Module) -> bool:
    """Whether addnorm may put its forward in: not where the instance already holds a forward of its own -- a
    wrapper some other library put there -- except accelerate's hooks (``add_hook_to_module``: ``forward`` calls
    the hook around ``_old_forward``; ``device_map`` placement relies on them), which addnorm goes inside."""
    return "forward" not in module.__dict__ or (hasattr(module, "_hf_hook") and "_old_forward" in module.__dict__)


def _install(module: nn.Module, fn) -> None:
    """Put ``fn`` in as the forward of a module ``_installable`` admitted: the instance's forward, or inside an
    accelerate hook its ``_old_forward`` (the hook's own kept, for unpatching)."""
    fn._addnorm_installed = True  # what unpatching takes out again
    module.__dict__["_replicate_for_data_parallel"] = functools.partial(_refuse_replica, module)
    if "forward" in module.__dict__:
        module.__dict__.setdefault("_addnorm_old_forward", module.__dict__["_old_forward"])
        module._old_forward = fn
    else:
        module.forward = fn


def _refuse_replica(module: nn.Module):
    """nn.DataParallel's replicate copies a module's __dict__: the patched forward, a partial of this module, would
    run the original's parameters (and its device) in every replica. Refused by name instead."""
    raise RuntimeError(f"{type(module).__name__} is patched by addnorm.patch_hf_model, whose forwards nn.DataParallel "
                       f"cannot replicate (each replica would run the original's parameters); use "
                       f"DistributedDataParallel, or unpatch_hf_model(model) first")


def _parameters(fn) -> tuple:
    try:
        return tuple(inspect.signature(inspect.unwrap(fn)).parameters)
    except (TypeError, ValueError):
        return ()


def _norms(model: nn.Module):
    """(module, convention) of every norm addnorm reproduces (each found by probing it)."""
    out = []
    for module in model.modules():
        conv = getattr(module, "_addnorm_convention", None)
        if conv is None and _is_norm(module):
            conv = probe_convention(module)
        if conv is not None:
            out.append((module, conv))
    return out


def _hyper_plan(layer: nn.Module, sites: frozenset, streams: list):
    """The sites of a layer that holds hyper-connections (``streams``), when its rewritten forward writes each
    one's stream through addnorm; else why not (refused by name)."""
    rewritten = rewrite_forward(type(layer), sites)
    writes = rewritten.sites.get("hyper-connection write", 0) if rewritten is not None else 0
    if writes < len(streams):
        return (f"{type(layer).__name__} reads its stream through {', '.join(streams)}, but addnorm found "
                f"{writes} write{'s' if writes != 1 else ''} of it (X + H_post y, or mHC's H_res X + H_post y) in its "
                f"forward")
    return sites


def _hypers(model: nn.Module):
    """(module, plan) of every hyper-connection addnorm reproduces (``interop.hyper``, ``interop.deepseek_hc``:
    recognised by what it holds, confirmed by probing), and the names of those that call themselves
    hyper-connections but match no plan."""
    out, unmatched, inside = [], [], ()
    for name, module in model.named_modules():
        if inside and name.startswith(inside):  # a recognised one's own parts (its norm, its projections)
            continue
        plan = module.__dict__.get("_addnorm_hyper") or hyper.probe_hyper(module) or deepseek_hc.probe(module)
        if plan is not None:
            out.append((module, plan))
            inside = name + "."
        elif name and hyper.looks_like_hyper(name, module) and any(True for _ in module.parameters()):
            unmatched.append(f"{name} ({type(module).__name__})")
    return out, unmatched


_FUSED_KINDS = ("add+norm", "norm+add", "hyper-connection write")


def _fusions(layer: nn.Module, plan) -> dict[str, int]:
    """What a patched layer fuses: kind of fused call -> count."""
    found = layer.__dict__.get("_addnorm_readers", {})
    if isinstance(plan, LayerPlan):
        return {"add+norm": 1, "sum+norm hand-off": 1 if found.get("out") else 0}
    sites = {k: n for k, n in rewrite_forward(type(layer), plan).sites.items() if k in _FUSED_KINDS}
    reads = sum(1 for m in layer.modules() if "_addnorm_hyper" in m.__dict__)
    if reads:
        sites["hyper-connection read"] = reads
    for site, readers in found.items():
        streams = [r for r in readers if "_addnorm_hyper" in r.__dict__]
        norms = [r for r in readers if "_addnorm_convention" in r.__dict__]
        if site.startswith("write"):  # a hyper-connection's write: fused with the next read when one reads it alone
            kind = "write+read hand-off" if len(streams) == 1 and len(readers) == 1 else None
        else:
            kind = {1: "sum+norm hand-off", 2: "sum+2 norms hand-off"}.get(min(len(norms), 2))
        if kind is not None:
            sites[kind] = sites.get(kind, 0) + 1
    return sites


def patch_hf_model(model: nn.Module, *, verify: bool = True) -> nn.Module:
    """Fuse each decoder layer's residual adds with the norms around them, and run every norm addnorm can
    reproduce on its kernels; returns the model, patched in place. ``model._addnorm_patched`` says what was
    patched, and per layer class which fusions it got. Raises -- with nothing changed -- when the model has no
    decoder layers (``addnorm.nn.replace_norms`` swaps the norms of any model), when a layer of a known structure
    has a norm addnorm cannot reproduce, when nothing at all can be patched, or when the patched model's outputs
    differ on a probe."""
    if not _decoder_layers(model, {id(m) for m in model.modules() if _is_norm(m)}):
        raise ValueError(f"{type(model).__name__} has no decoder layer (a ModuleList of layers holding norms), so it is "
                         f"not a decoder patch_hf_model can patch: supported: {_SUPPORTED}. To run the "
                         f"torch.nn.LayerNorm / RMSNorm of any model on addnorm's kernels, keeping their "
                         f"parameters: addnorm.nn.replace_norms(model)")
    norms = _norms(model)
    hypers, unmatched = _hypers(model)
    if unmatched:
        raise NotImplementedError(f"{type(model).__name__}: {unmatched[0]} is a hyper-connection whose read and write "
                                  f"addnorm does not reproduce (it reproduces HY-V4's and Qwen4-exp's: "
                                  f"addnorm.interop.hyper; DeepSeek-V4's: addnorm.interop.deepseek_hc); nothing was "
                                  f"changed")
    layers = _layers(model, norms, hypers)
    refused = [(n, p) for n, _, p, _ in layers if isinstance(p, str)]
    if refused:
        raise NotImplementedError(f"{type(model).__name__}: {refused[0][0]}: {refused[0][1]}; supported: "
                                  f"{_SUPPORTED}. Nothing was changed.")
    if not layers and not norms:
        unmatched = sorted({f"{type(m).__name__} ({next(m.parameters(), torch.empty(0)).dtype})"
                            for m in model.modules() if _is_norm(m)})
        why = (f": its norms ({', '.join(unmatched)}) follow no convention addnorm reproduces at their dtype (a float64 "
               f"model whose norms compute in float32, as HF's Llama-style RMSNorms do, is one)" if unmatched else "")
        raise ValueError(f"{type(model).__name__} has no decoder layer or norm addnorm can patch{why}; supported: "
                         f"{_SUPPORTED}")
    new_layers = [(m, p, owner) for _, m, p, owner in layers
                  if getattr(m, "_addnorm_plan", None) is None and getattr(m, "_addnorm_sites", None) is None
                  and _installable(m)]
    new_norms = [(m, c) for m, c in norms if getattr(m, "_addnorm_convention", None) is None and _installable(m)]
    new_hypers = [(m, p) for m, p in hypers if "_addnorm_hyper" not in m.__dict__ and _installable(m)]
    decoder_layers = [m for _, m, _, owner in layers if owner is None]
    before = _probe_outputs(model, decoder_layers) if verify and (new_layers or new_norms or new_hypers) else None
    if verify and (new_layers or new_hypers) and before is None:  # the fused adds need the model-level check verify=True promised
        # (a norm alone is checked against its module when its convention is found); a composite config keeps its
        # vocab_size in its text config, and a model with none was patched unchecked
        raise NotImplementedError(f"{type(model).__name__}: patch_hf_model cannot verify the fused adds (it makes "
                                  f"input_ids from the config's vocab_size, and this model's config has none); "
                                  f"nothing was changed. patch_hf_model(model, verify=False) patches without the "
                                  f"check")
    for module, plan, owner in new_layers:
        if isinstance(plan, LayerPlan):
            module._addnorm_plan = plan
            _install(module, functools.partial(_structure_forward, module))
        else:
            module._addnorm_sites = plan
            _install(module, functools.partial(_rewritten_forward, module))
        if owner is not None:  # a rewritten child checkpoints with its decoder layer
            module.__dict__["_addnorm_layer"] = owner
    for module, conv in new_norms:
        module._addnorm_convention = conv
        _install(module, functools.partial(_norm_forward, module))
    for module, plan in new_hypers:
        module.__dict__["_addnorm_hyper"] = plan
        forward = deepseek_hc.forward if isinstance(plan, deepseek_hc.MhcPlan) else hyper.hyper_forward
        _install(module, functools.partial(forward, module))
    problem = None
    try:
        if new_layers:
            _find_readers(model, [m for _, m, _, _ in layers], [m for m, _ in norms] + [m for m, _ in hypers])
        if before is not None:
            after = _probe_outputs(model, decoder_layers)
            problem = None if _same(before, after) else "changed the model's outputs on a probe"
    except Exception as e:  # noqa: BLE001  (whatever the layer's code raised: undone, then reported)
        problem = f"raised {type(e).__name__}: {e}"
    if problem:
        for module in [m for m, _, _ in new_layers] + [m for m, _ in new_norms] + [m for m, _ in new_hypers]:
            _unpatch_module(module)
        raise NotImplementedError(f"{type(model).__name__}: the patched model {problem}, so the patch was undone "
                                  f"(nothing was changed); supported: {_SUPPORTED}")
    model._addnorm_patched = _report(layers, norms, hypers)
    return model


def _add(counts: dict, kind: str, n: int) -> None:
    if n:
        counts[kind] = counts.get(kind, 0) + n


def _report(layers, norms, hypers) -> dict:
    """What was patched: ``layers`` counts decoder layers (a rewritten child -- BLOOM's attention, MPT's FFN --
    is its decoder layer's, not a layer of its own), ``per_layer`` what each one fuses, ``fusions`` the same per
    layer class, and a hyper-connection's final collapse (HY-V4's head, Qwen4-exp's mixer) under its class."""
    per_class: dict[str, dict[str, int]] = {}
    per_layer: dict[str, dict[str, int]] = {}
    names = {id(m): n for n, m, _, owner in layers if owner is None}
    for name, m, p, owner in layers:
        fused = _fusions(m, p)
        layer_name = names.get(id(owner), name.rsplit(".", 1)[0]) if owner is not None else name
        for kind, n in fused.items():
            _add(per_class.setdefault(type(m).__name__, {}), kind, n)
            _add(per_layer.setdefault(layer_name, {}), kind, n)
    finals = [m for m, p in hypers if p.final]
    for m in finals:
        _add(per_class.setdefault(type(m).__name__, {}), "hyper-connection final collapse", 1)
    fused = sum(n for f in per_class.values() for n in f.values())
    return {
        "layers": len({id(owner if owner is not None else m) for _, m, _, owner in layers}),
        "fused_adds": fused, "norms": len(norms), "hyper_connections": len(hypers), "final_collapse": len(finals),
        "structures": sorted({p.structure.name if isinstance(p, LayerPlan) else "rewritten by data flow"
                              for _, _, p, _ in layers}),
        "fusions": {cls: {k: n for k, n in f.items() if n} for cls, f in per_class.items()},
        "per_layer": per_layer}


def _find_readers(model: nn.Module, layers, norms) -> None:
    """Each layer's readers: the patched norms that read its output tensor in a probe run."""
    for m in layers:
        m.__dict__.pop("_addnorm_readers", None)
    with handoff.Readers(norms) as r:
        _probe_outputs(model)
    for m, sites in r.found.items():
        m.__dict__["_addnorm_readers"] = {site: tuple(found) for site, found in sites.items()}


def _unpatch_module(module: nn.Module) -> None:
    d = module.__dict__
    if "_addnorm_old_forward" in d:  # inside an accelerate hook: its _old_forward back, the hook kept
        d["_old_forward"] = d.pop("_addnorm_old_forward")
    elif getattr(d.get("forward"), "_addnorm_installed", False):
        del d["forward"]
    if getattr(d.get("_replicate_for_data_parallel"), "func", None) is _refuse_replica:  # ours only
        del d["_replicate_for_data_parallel"]
    for attr in ("_addnorm_plan", "_addnorm_convention", "_addnorm_sites", "_addnorm_readers", "_addnorm_layer",
                 "_addnorm_hyper"):
        d.pop(attr, None)
    handoff.drop(module)


def unpatch_hf_model(model: nn.Module) -> nn.Module:
    """Undo ``patch_hf_model``: every layer's own forward again."""
    for module in model.modules():
        _unpatch_module(module)
    model.__dict__.pop("_addnorm_patched", None)
    return model


@torch.no_grad()
def _probe_outputs(model: nn.Module, layers=()):
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if not vocab and callable(getattr(config, "get_text_config", None)):  # a composite (vision-language) config
        vocab = getattr(config.get_text_config(), "vocab_size", None)
    if not vocab:
        return None
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return None
    # two rows, unless the model cannot take them: a sequence classifier with no pad token refuses batches > 1
    rows = 1 if getattr(config, "pad_token_id", 0) is None else 2
    ids = torch.randint(0, vocab, (rows, 6), generator=torch.Generator().manual_seed(0)).to(device)
    modes = [(m, m.training) for m in model.modules()]  # each module's own mode, restored as it was
    model.eval()
    # each layer's output too: a stream rescaled by a layer's own add (Beam's depth-scaled residual) hides in the
    # logits behind RMSNorm's scale invariance. Hooks of our own, removed after: HF's output_hidden_states leaves
    # capturing hooks on the model that torch.save cannot pickle.
    streams: list[torch.Tensor] = []

    def keep(module, args, output):
        t = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(t, torch.Tensor):
            streams.append(t.detach().clone())

    handles = [m.register_forward_hook(keep) for m in layers]
    try:
        out = model(input_ids=ids)
    finally:
        for h in handles:
            h.remove()
        for m, training in modes:
            m.training = training
    if isinstance(out, torch.Tensor):
        t = out
    else:
        t = getattr(out, "logits", None)
        if t is None:
            t = getattr(out, "last_hidden_state", None)
        t = t if t is not None else (out[0] if isinstance(out, tuple) else None)
    return (t, *streams) if t is not None and streams else t


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, tuple) or isinstance(b, tuple):  # the output and each layer's hidden state, each on its scale
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b)))
    scale = max(1.0, a.float().abs().max().item())
    # float32: rounding only. A 16-bit model rounds each op's result, and the fused kernels' float32 statistics
    # may land an ulp away from eager's: a few ulps of the largest output, far below what a wrong add gives.
    tol = 1e-4 if a.dtype not in (torch.bfloat16, torch.float16) else 4 * torch.finfo(a.dtype).eps
    return a.shape == b.shape and bool(((a.float() - b.float()).abs() <= tol * scale).all())
