"""The recorder on widened streams: per-stream RMS and the mHC paper's composite mixing gain, checked
against the float64 reference's own H_res."""

import pytest
import torch

from addnorm import diagnostics
from addnorm.reference.gpt import gpt_logits
from addnorm.reference.streams import amax_gain, composite_mapping
from frontier_cases import batch, config, hparams, perturbed_model


@pytest.mark.parametrize("name", ["hc", "mhc", "mhc_lite"])
def test_composite_gain_and_per_stream_rms(name):
    cfg = config(name, n_layer=4)
    m = perturbed_model(cfg)
    with torch.no_grad():  # mixing far from the identity, so products differ from their factors
        for b in m.h:
            for s in (b.attn.streams, b.mlp.streams):
                if name == "hc":
                    s.static_alpha.add_(0.2)
                else:
                    s.b_res.normal_(0, 1)
    idx = batch(cfg)
    with diagnostics.record(m) as rec:
        m(idx).sum().backward()
    Hs = []
    gpt_logits({k: v.double() for k, v in m.state_dict().items()}, hparams(cfg), idx, record=Hs)
    L = len(Hs)
    for j in range(L):
        block, site = divmod(j, 2)
        site = ("attn", "mlp")[site]
        c = composite_mapping(Hs, j)  # per token (B, T, n, n): the gains per token, then their mean
        want = {"h_res_gain_fwd": amax_gain(Hs[j])[0].mean().item(),
                "h_res_gain_bwd": amax_gain(Hs[j])[1].mean().item(),
                "composite_gain_fwd": amax_gain(c)[0].mean().item(),
                "composite_gain_bwd": amax_gain(c)[1].mean().item()}
        for q, v in want.items():
            got = [r["value"] for r in rec.frame(q, site) if r["block"] == block]
            assert got == pytest.approx([v], rel=1e-9), (q, j)
    if name == "hc":
        assert max(r["value"] for r in rec.frame("composite_gain_fwd")) > 1.5  # unconstrained: grows
    else:  # rows of a (row-)stochastic product sum to 1: the forward gain is 1 by construction
        assert max(r["value"] for r in rec.frame("composite_gain_fwd")) == pytest.approx(1.0, abs=1e-9)
    # the paper's composite of sub-layer 0 is the whole stack's product, H_{L-1} ... H_0
    whole = Hs[0]
    for H in Hs[1:]:
        whole = H @ whole
    assert torch.allclose(composite_mapping(Hs, 0), whole) and torch.equal(composite_mapping(Hs, L - 1), Hs[L - 1])
    # the stream entering block 1's attention, per stream: (stream, pending) with the write left pending finished
    x = {}
    h = m.h[1].attn.register_forward_pre_hook(
        lambda mod, args: x.setdefault("s", (args[0] if args[1] is None else args[0] + args[1]).detach()))
    m(idx)
    h.remove()
    want_rms = x["s"].pow(2).mean(dim=(0, 1, 3)).sqrt().tolist()
    got_rms = [rec.frame(f"stream{i}_rms", "attn")[1]["value"] for i in range(cfg.streams)]
    assert got_rms == pytest.approx(want_rms, rel=1e-6)
