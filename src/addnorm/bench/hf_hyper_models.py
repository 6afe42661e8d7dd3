"""The three HuggingFace decoders whose residual stream is widened by hyper-connections, built offline at a chosen
width for ``bench.hf_hyper``: DeepSeek-V4 (mHC: ``DeepseekV4HyperConnection``, 20 Sinkhorn-Knopp rounds), HY-V4
(``HYV4HyperConnection`` and its ``HYV4HyperHead``) and Qwen4-exp (``attn_hyper_connection`` /
``mlp_hyper_connection`` and the final ``hyper_connection_mixer``).

Each model is its config class's published defaults with these changed: the width (``hidden``), the layers, a
small vocabulary, and the MoE cut to its fewest sensible experts -- 4 routed experts, 2 per token (one shared
expert where the family has them), as HF's own tiny test models take. The sizes that scale with the width in the
published config (the attention heads, the low-rank projections, the experts' and dense MLPs' widths) keep their
ratio to the width; the per-head sizes stay as published. Every model has 4 streams (hc_mult / hc_count 4) and is
initialised at random from ``seed``, in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FAMILIES = ("deepseek_v4", "hy_v4", "qwen4_exp")
EXPERTS, EXPERTS_PER_TOKEN = 4, 2  # the fewest: top-2 routing over 4 experts
STREAMS = 4


@dataclass(frozen=True)
class HyperModelConfig:
    family: str = "deepseek_v4"  # deepseek_v4 | hy_v4 | qwen4_exp
    hidden: int = 2048  # the width of one stream (the widened stream is STREAMS x hidden)
    layers: int = 2
    vocab: int = 512  # small: the vocabulary projection is not what is measured
    seed: int = 0

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        for name in ("hidden", "layers", "vocab"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.hidden % 64:
            raise ValueError(f"hidden must be a multiple of 64 (the heads' sizes), got {self.hidden}")


def _scaled(published: int, hidden: int, published_hidden: int, multiple: int = 1) -> int:
    """A size that is ``published`` at ``published_hidden``, at the same ratio to ``hidden`` (a multiple of
    ``multiple``, at least ``multiple``)."""
    return max(multiple, round(published * hidden / published_hidden / multiple) * multiple)


def _deepseek_v4(cfg: HyperModelConfig):
    import transformers as T

    d, h = T.DeepseekV4Config(), cfg.hidden
    heads = _scaled(d.num_attention_heads, h, d.hidden_size)
    return T.DeepseekV4Config(
        hidden_size=h, num_hidden_layers=cfg.layers, vocab_size=cfg.vocab, num_attention_heads=heads,
        q_lora_rank=_scaled(d.q_lora_rank, h, d.hidden_size, 16),
        o_lora_rank=_scaled(d.o_lora_rank, h, d.hidden_size, 16), o_groups=min(d.o_groups, heads),
        index_n_heads=_scaled(d.index_n_heads, h, d.hidden_size),
        moe_intermediate_size=_scaled(d.moe_intermediate_size, h, d.hidden_size, 16),
        n_routed_experts=EXPERTS, num_experts_per_tok=EXPERTS_PER_TOKEN, hc_mult=STREAMS,
        bos_token_id=0, eos_token_id=0, pad_token_id=0), T.DeepseekV4ForCausalLM


def _hy_v4(cfg: HyperModelConfig):
    import transformers as T

    d, h = T.HYV4Config(), cfg.hidden
    return T.HYV4Config(
        hidden_size=h, num_hidden_layers=cfg.layers, vocab_size=cfg.vocab,
        num_attention_heads=_scaled(d.num_attention_heads, h, d.hidden_size),
        intermediate_size=_scaled(d.intermediate_size, h, d.hidden_size, 16),
        moe_intermediate_size=_scaled(d.moe_intermediate_size, h, d.hidden_size, 16),
        q_lora_rank=_scaled(d.q_lora_rank, h, d.hidden_size, 16),
        kv_lora_rank=_scaled(d.kv_lora_rank, h, d.hidden_size, 16),
        n_routed_experts=EXPERTS, num_experts_per_tok=EXPERTS_PER_TOKEN, hc_mult=STREAMS,
        bos_token_id=0, eos_token_id=0, pad_token_id=0), T.HYV4ForCausalLM


def _qwen4_exp(cfg: HyperModelConfig):
    import transformers as T

    d, h = T.Qwen4ExpTextConfig(), cfg.hidden
    heads = _scaled(d.num_attention_heads, h, d.hidden_size)
    return T.Qwen4ExpTextConfig(
        hidden_size=h, num_hidden_layers=cfg.layers, vocab_size=cfg.vocab, num_attention_heads=heads,
        num_key_value_heads=math.gcd(d.num_key_value_heads, heads),  # groups of query heads, as published
        linear_num_key_heads=_scaled(d.linear_num_key_heads, h, d.hidden_size),
        linear_num_value_heads=_scaled(d.linear_num_value_heads, h, d.hidden_size),
        moe_intermediate_size=_scaled(d.moe_intermediate_size, h, d.hidden_size, 16),
        shared_expert_intermediate_size=_scaled(d.shared_expert_intermediate_size, h, d.hidden_size, 16),
        hc_lowrank=_scaled(d.hc_lowrank, h, d.hidden_size, 16),
        num_experts=EXPERTS, num_experts_per_tok=EXPERTS_PER_TOKEN, hc_count=STREAMS,
        # the published pattern, 3 linear-attention layers then an attention layer, within the layers there are:
        # the last is an attention layer (a cache of linear-attention layers alone cannot say its length)
        full_attention_interval=min(4, cfg.layers),
        # its attention layers' indexer, which the config leaves unset: DeepSeek-V4's (the top 512 of the keys
        # compressed 4 to 1, as many index heads as attention heads), with the one key head Qwen4-exp requires and
        # index heads as wide as the attention's (its rotary dims must fit them)
        indexer_n_heads=heads, indexer_kv_heads=1,
        indexer_head_dim=d.head_dim,
        indexer_budget=512, indexer_compress_ratio=4,
        bos_token_id=0, eos_token_id=0, pad_token_id=0), T.Qwen4ExpForCausalLM


_BUILDERS = {"deepseek_v4": _deepseek_v4, "hy_v4": _hy_v4, "qwen4_exp": _qwen4_exp}


def hf_config(cfg: HyperModelConfig):
    """(the HF config, the causal-LM class) of ``cfg``."""
    try:
        return _BUILDERS[cfg.family](cfg)
    except AttributeError as e:
        raise RuntimeError(f"transformers has no {cfg.family} ({e}); the benchmark needs transformers >= 5.24 "
                           f"(pip install -e '.[hf]')") from None


def build(cfg: HyperModelConfig) -> torch.nn.Module:
    """The model of ``cfg``: random weights from its seed, float32, in eval mode (dropout off)."""
    hf_cfg, cls = hf_config(cfg)
    torch.manual_seed(cfg.seed)
    return cls(hf_cfg).float().eval()
