"""Swap a HuggingFace model's norms and residual adds for addnorm's fused ones, in place.

For every decoder layer, the residual add after attention and the norm before the MLP become one
``add_layer_norm`` / ``add_rms_norm`` call, and every norm becomes addnorm's (sharing the same
Parameter objects, so optimizers and state_dicts are unaffected). Outputs and gradients are
unchanged (tests: <= 1e-5 in float32). The add after the MLP is left as it is: fusing it with the
*next* layer's norm would mean rewriting the model-level loop, which HF owns.

Supported: GPT-2 (GPT2Model / GPT2LMHeadModel) and Llama (LlamaModel / LlamaForCausalLM), for the
transformers releases whose layer ``forward`` signatures are checked below; others raise.
"""

from __future__ import annotations

import inspect
import types


from torch import nn

from .. import functional as AF
from ..nn.layer_norm import LayerNorm
from ..nn.rms_norm import RMSNorm

_GPT2_BLOCK_ARGS = ["hidden_states", "past_key_values", "attention_mask", "encoder_hidden_states",
                    "encoder_attention_mask", "use_cache", "kwargs"]
_LLAMA_LAYER_ARGS = ["hidden_states", "attention_mask", "position_ids", "past_key_values", "use_cache",
                     "position_embeddings", "kwargs"]


def _layer_norm_from(ln: nn.LayerNorm) -> LayerNorm:
    new = LayerNorm(ln.normalized_shape, eps=ln.eps, elementwise_affine=ln.weight is not None,
                    bias=ln.bias is not None, device=ln.weight.device if ln.weight is not None else None)
    if ln.weight is not None:
        new.weight = ln.weight
    if ln.bias is not None:
        new.bias = ln.bias
    return new


def _rms_norm_from(norm: nn.Module) -> RMSNorm:
    new = RMSNorm(norm.weight.shape[0], eps=norm.variance_epsilon, cast_before_weight=True, device=norm.weight.device)
    new.weight = norm.weight
    return new


def _check_signature(fn, expected: list[str], what: str) -> None:
    got = list(inspect.signature(fn).parameters)
    if got[: len(expected)] != expected and got[1: len(expected) + 1] != expected:
        import transformers

        raise NotImplementedError(f"{what}.forward of transformers {transformers.__version__} has arguments {got}; "
                                  f"addnorm knows {expected}")


def _gpt2_block_forward(self, hidden_states, past_key_values=None, attention_mask=None, encoder_hidden_states=None,
                        encoder_attention_mask=None, use_cache=False, **kwargs):
    residual = hidden_states
    hidden_states = self.ln_1(hidden_states)
    attn_output, _ = self.attn(hidden_states, past_key_values=past_key_values, attention_mask=attention_mask,
                               use_cache=use_cache, **kwargs)
    ln = self.ln_2
    # residual + attn_output and ln_2 of it, in one pass
    normed, hidden_states = AF.add_layer_norm(attn_output, residual, ln.normalized_shape, ln.weight, ln.bias, ln.eps)
    return hidden_states + self.mlp(normed)


def _llama_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                         use_cache=False, position_embeddings=None, **kwargs):
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                      position_ids=position_ids, past_key_values=past_key_values, use_cache=use_cache,
                                      position_embeddings=position_embeddings, **kwargs)
    n = self.post_attention_layernorm
    normed, hidden_states = AF.add_rms_norm(hidden_states, residual, n.normalized_shape, n.weight, n.eps,
                                            cast_before_weight=True)
    return hidden_states + self.mlp(normed)


def patch_hf_model(model: nn.Module) -> nn.Module:
    """Patch a HuggingFace GPT-2 or Llama model in place; returns it. Counts are in ``model._addnorm_patched``."""
    patched = {"layers": 0, "norms": 0}
    for module in list(model.modules()):
        cls = type(module).__name__
        if cls == "GPT2Block":
            if getattr(module, "crossattention", None) is not None:
                raise NotImplementedError("GPT-2 blocks with cross-attention are not patched")
            _check_signature(type(module).forward, _GPT2_BLOCK_ARGS, "GPT2Block")
            module.ln_1, module.ln_2 = _layer_norm_from(module.ln_1), _layer_norm_from(module.ln_2)
            module.forward = types.MethodType(_gpt2_block_forward, module)
            patched["layers"] += 1
            patched["norms"] += 2
        elif cls == "LlamaDecoderLayer":
            _check_signature(type(module).forward, _LLAMA_LAYER_ARGS, "LlamaDecoderLayer")
            module.input_layernorm = _rms_norm_from(module.input_layernorm)
            module.post_attention_layernorm = _rms_norm_from(module.post_attention_layernorm)
            module.forward = types.MethodType(_llama_layer_forward, module)
            patched["layers"] += 1
            patched["norms"] += 2
    # the final norms
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.LayerNorm:
                setattr(parent, name, _layer_norm_from(child))
                patched["norms"] += 1
            elif type(child).__name__ == "LlamaRMSNorm":
                setattr(parent, name, _rms_norm_from(child))
                patched["norms"] += 1
    if patched["layers"] == 0:
        raise ValueError(f"{type(model).__name__} has no GPT2Block or LlamaDecoderLayer to patch")
    model._addnorm_patched = patched
    return model


