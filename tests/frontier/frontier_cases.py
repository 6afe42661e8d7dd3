"""The shared table of frontier configurations: tiny models whose every parameter is perturbed away from
its init, so a wrong index, transpose or sign cannot hide behind a zero or an identity."""

from __future__ import annotations

import torch

from addnorm.model import GPT, GPTConfig

TINY = dict(vocab_size=32, block_size=8, n_layer=3, n_head=2, n_embd=8)

# name -> GPTConfig overrides
CASES = {
    "pre": dict(placement="pre"),
    "lns": dict(placement="lns"),
    "lns_rms": dict(placement="lns", norm="rms"),
    "denseformer": dict(placement="denseformer"),
    "denseformer_dil2_per2": dict(placement="denseformer", dense_dilation=2, dense_period=2, n_layer=4),
    "value_residual_pre": dict(placement="pre", value_residual=True),
    "derf_pre": dict(placement="pre", norm="derf"),
    "dyt_slots": dict(placement="pre", norm="dyt", dyt_alpha=(0.8, 0.2, 0.3)),
    "hc": dict(placement="hc", n_streams=3),
    "hc_n1": dict(placement="hc", n_streams=1),
    "hc_rms_vr": dict(placement="hc", norm="rms", n_streams=2, value_residual=True),
    "hc_nobias": dict(placement="hc", n_streams=2, bias=False),
    "mhc": dict(placement="mhc", n_streams=3, sinkhorn_iters=7),
    "mhc_dyt": dict(placement="mhc", norm="dyt", n_streams=2),
    "mhc_lite": dict(placement="mhc_lite", n_streams=3),
    "mhc_lite_derf_vr": dict(placement="mhc_lite", norm="derf", n_streams=4, value_residual=True),
    "hybrid": dict(placement="hybrid"),
    "hybrid_rms_vr": dict(placement="hybrid", norm="rms", value_residual=True),
    "hybrid_star": dict(placement="hybrid_star"),
    "attn_res": dict(placement="attn_res"),
    "attn_res_block2": dict(placement="attn_res", attn_res_block=2),  # a block per transformer block
    "attn_res_block3_rms_vr": dict(placement="attn_res", attn_res_block=3, norm="rms", value_residual=True),
    "ngpt": dict(placement="ngpt"),
    "ngpt_vr": dict(placement="ngpt", value_residual=True),
}


# forms outside the frontier table that hold learned scalars of their own (ReZero's gate, LayerScale's, the embedding
# scale): the tests of what FSDP2 and checkpoints do with scalars run them too
SCALAR_CASES = {"rezero": dict(placement="rezero"), "layerscale": dict(placement="layerscale"),
                "dyt_embed_scale": dict(placement="pre", norm="dyt", embed_scale=2.0)}


def config(name: str, **extra) -> GPTConfig:
    """A frontier case's config (or a SCALAR_CASES one's)."""
    return GPTConfig(**{**TINY, **(CASES[name] if name in CASES else SCALAR_CASES[name]), **extra})


def perturbed_model(cfg: GPTConfig, seed: int = 0, dtype=torch.float64) -> GPT:
    torch.manual_seed(seed)
    m = GPT(cfg).to(dtype)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(dtype))
    return m


def hparams(cfg: GPTConfig) -> dict:
    p = cfg.placement
    return dict(n_layer=cfg.n_layer, n_head=cfg.n_head, placement=p, norm=cfg.norm, eps=cfg.eps,
                n_streams=cfg.streams, sinkhorn_iters=cfg.sinkhorn_iters, value_residual=cfg.value_residual,
                dense_dilation=cfg.dense_dilation, dense_period=cfg.dense_period,
                qkv_norm=p in ("hybrid", "hybrid_star"), attn_res_block=cfg.attn_res_block)


def batch(cfg: GPTConfig, B: int = 2, T: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))
