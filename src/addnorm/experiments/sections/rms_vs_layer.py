"""LayerNorm vs RMSNorm: the statistics of their outputs on real activations, and measured speed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import functional as AF
from ...benchmark.timing import measure
from ...model import GPT, GPTConfig
from ..corpus import load_corpus


def run(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    corpus = load_corpus(max_bytes=1 << 20)
    x, _ = corpus.batch(8, 64, torch.Generator().manual_seed(seed))
    model = GPT(GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128)).eval()
    with torch.no_grad():  # real activations: the residual stream after two blocks of a GPT on real text
        h = model.wte(x) + model.wpe(torch.arange(64))
        for block in model.h[:2]:
            h = block(h)
    stats = {}
    # the stream as it is, and the same stream with a constant +0.5 on every feature: a mean that
    # LayerNorm removes and RMSNorm keeps
    for case, inp in (("real", h), ("shifted", h + 0.5)):
        with torch.no_grad():
            ln, rms = AF.layer_norm(inp, 128), AF.rms_norm(inp, 128, eps=1e-5)
        stats[case] = {}
        for name, t in (("input", inp), ("layer_norm", ln), ("rms_norm", rms)):
            stats[case][name] = {"row_mean": t.mean(-1).mean().item(), "row_std": t.std(-1, unbiased=False).mean().item(),
                                 "row_rms": t.pow(2).mean(-1).sqrt().mean().item()}
    speed = {}
    for n, d in ((4096, 768),):
        a, r = torch.randn(n, d), torch.randn(n, d)
        with torch.no_grad():
            speed[f"{n}x{d}"] = {
                "layer_addnorm_ms": measure(lambda: AF.add_layer_norm(a, r, d), budget_s=0.3).median_s * 1e3,
                "rms_addnorm_ms": measure(lambda: AF.add_rms_norm(a, r, d), budget_s=0.3).median_s * 1e3,
                "layer_eager_ms": measure(lambda: F.layer_norm(a + r, (d,)), budget_s=0.3).median_s * 1e3,
                "rms_eager_ms": measure(lambda: F.rms_norm(a + r, (d,)), budget_s=0.3).median_s * 1e3,
            }
    return {"stats": stats, "speed": speed, "backend": AF.last_backend(), "corpus": corpus.source}
