"""LayerNorm vs RMSNorm: the statistics of their outputs on real activations, and measured speed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import functional as AF
from ...harness.corpus import load_corpus
from ...harness.timing import measure_interleaved
from ...model import GPT, GPTConfig


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
        with torch.no_grad():  # as the benchmark measures: warmed up, the methods interleaved in rounds
            t = measure_interleaved({
                "layer_addnorm": lambda: AF.add_layer_norm(a, r, d),
                "rms_addnorm": lambda: AF.add_rms_norm(a, r, d),
                "layer_eager": lambda: F.layer_norm(a + r, (d,)),
                "rms_eager": lambda: F.rms_norm(a + r, (d,)),
            }, budget_s=0.3)
        speed[f"{n}x{d}"] = {f"{k}_ms": v.median_s * 1e3 for k, v in t.items()}
        speed[f"{n}x{d}"]["runs"] = min(v.runs for v in t.values())
    method = ("inference, float32, one process; each method warmed up, then timed call by call in rounds of 5 "
              "calls of each in turn (harness.timing.measure_interleaved, as addnorm bench); medians")
    return {"stats": stats, "speed": speed, "speed_method": method, "backend": AF.last_backend(),
            "corpus": corpus.source}
