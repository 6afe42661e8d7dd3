"""Attention Residuals in the model: what the paper says of its forms (S = 1 is Full AttnRes, zero queries
average uniformly, the embedding always a source), its parameters, and the options it refuses by name. The
model against the float64 transcription is in test_frontier_reference_parity.py (its CASES include attn_res)."""

import pytest
import torch

from addnorm.model import GPT, GPTConfig
from addnorm.model.errors import ConfigError
from addnorm.model.placement import PLACEMENTS, Placement
from frontier_cases import TINY, batch, config, perturbed_model


def test_block_size_one_is_full_attn_res_and_other_sizes_differ():
    """Section 3.2: N = L blocks (S = 1) recovers Full AttnRes, the same parameters giving the same logits."""
    full = perturbed_model(config("attn_res"))
    idx = batch(full.config)
    for S, same in ((1, True), (2, False), (4, False)):
        m = GPT(GPTConfig(**{**TINY, "placement": "attn_res", "attn_res_block": S})).double()
        m.load_state_dict(full.state_dict())
        if same:
            torch.testing.assert_close(m(idx), full(idx), atol=0, rtol=0)
        else:
            assert not torch.allclose(m(idx), full(idx), atol=1e-6), S


def _inputs_and_outputs(model, idx):
    """Each sub-layer's input h_l (what its pre-norm reads) and output f_l, in order."""
    h, f = [], []
    hooks = []
    for block in model.h:
        for sub in (block.attn, block.mlp):
            hooks.append(sub.norm_before.register_forward_pre_hook(lambda m, a: h.append(a[0].detach())))
            hooks.append(sub.fn.register_forward_hook(lambda m, a, o: f.append(o.detach())))
    model(idx)
    for k in hooks:
        k.remove()
    return h, f


@pytest.mark.parametrize("S", [None, 2, 3, 100])
def test_zero_queries_start_as_the_uniform_average_of_the_sources(S):
    """w_l = 0 at init: alpha is uniform, so h_l is the mean of eq. 6's sources -- the embedding b_0, the completed
    block sums and the current block's partial sum; one block of everything (S >= L) reads (b_0 + b_1^{i-1}) / 2."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(**{**TINY, "n_layer": 4, "placement": "attn_res", "attn_res_block": S})).double()
    idx = batch(m.config)
    h, f = _inputs_and_outputs(m, idx)
    emb = m.wte(idx) + m.wpe(torch.arange(idx.size(1)))
    step = S or 1
    for l in range(len(h)):  # sub-layer l + 1
        done = l // step  # completed blocks before it
        blocks = [emb] + [sum(f[b * step:(b + 1) * step]) for b in range(done)]
        partial = f[done * step:l]
        sources = blocks + ([sum(partial)] if partial else [])
        torch.testing.assert_close(h[l], sum(sources) / len(sources), atol=1e-12, rtol=1e-12, msg=f"l={l + 1}")


def test_parameters_start_where_the_paper_starts_them_and_reset_there():
    m = GPT(GPTConfig(**{**TINY, "placement": "attn_res"}))
    mixes = [s.attn_res for b in m.h for s in (b.attn, b.mlp)]
    assert mixes[0] is None  # the first sub-layer reads the embedding alone: no query
    mixes = mixes[1:] + [m.attn_res]  # ... and the final aggregation has one of its own
    assert len(mixes) == 2 * m.config.n_layer
    with torch.no_grad():
        for d in mixes:
            d.query.normal_()
            d.weight.normal_()
    m.reset_parameters()
    for d in mixes:
        assert torch.equal(d.query, torch.zeros(8)) and torch.equal(d.weight, torch.ones(8))
    names = {n for n, _ in m.named_parameters()}
    assert {"attn_res.query", "attn_res.weight", "h.0.mlp.attn_res.query", "h.2.attn.attn_res.weight"} <= names
    assert not any(n.startswith("h.0.attn.attn_res") for n in names)


def test_every_query_learns():
    m = perturbed_model(config("attn_res_block2"))
    idx = batch(m.config)
    _, loss = m(idx, idx)
    loss.backward()
    for n, p in m.named_parameters():
        if "attn_res" in n:
            assert p.grad is not None and p.grad.abs().sum() > 0, n


@pytest.mark.parametrize("kw, match", [
    (dict(placement="pre", attn_res_block=2), "attn_res_block=2 sets Block AttnRes"),
    (dict(placement="mhc", attn_res_block=1), "attn_res_block=1 sets Block AttnRes"),
    (dict(placement="attn_res", attn_res_block=0), "attn_res_block must be None"),
    (dict(placement="attn_res", attn_res_block=True), "attn_res_block must be None"),
    (dict(placement="attn_res", attn_res_block=1.5), "attn_res_block must be None"),
    (dict(placement=["attn_res", "pre", "attn_res"]), "'attn_res' .* cannot be mixed"),
    (dict(placement="attn_res", n_streams=2), "n_streams=2 needs a widened-stream placement"),
    (dict(placement="attn_res", dense_period=2), "dense_period=2 needs a DenseFormer placement"),
    (dict(placement="attn_res", sinkhorn_iters=3), "sinkhorn_iters=3 needs the mhc placement"),
    (dict(placement="attn_res", mix_post_layers=1), "mix_post_layers=1"),
])
def test_options_it_does_not_read_are_refused_by_name(kw, match):
    with pytest.raises(ConfigError, match=match):
        GPTConfig(**{**TINY, **kw})


_BASE = PLACEMENTS["attn_res"]


@pytest.mark.parametrize("field, value", [
    ("before", None), ("after_branch", "default"), ("after_sum", "default"), ("residual", "gated"),
    ("stream", "mhc"), ("dense", True), ("depth_scaled", True), ("qkv_norm", True), ("final_norm", False),
])
def test_custom_placements_it_would_ignore_are_refused_naming_the_field(field, value):
    from dataclasses import replace

    p = replace(_BASE, name="custom", **{field: value})
    with pytest.raises(ConfigError, match=f"{field}"):
        GPTConfig(**{**TINY, "placement": p})
    mixed_ffn = replace(_BASE, name="custom", mlp=replace(_BASE, name="custom_mlp", attn_res=False))
    with pytest.raises(ConfigError, match="cannot be mixed"):
        GPTConfig(**{**TINY, "placement": mixed_ffn})


def test_a_norm_kind_for_the_sub_layers_is_accepted():
    for norm in ("rms", "dyt", "derf"):
        m = GPT(GPTConfig(**{**TINY, "placement": "attn_res", "norm": norm, "attn_res_block": 2}))
        assert torch.isfinite(m(batch(m.config))).all(), norm
    assert isinstance(Placement("mine", before="rms", final_norm=True, attn_res=True), Placement)


def test_a_block_called_without_the_depth_state_says_how_to_call_it():
    m = GPT(GPTConfig(**{**TINY, "placement": "attn_res"}))
    x = torch.randn(2, 4, 8)
    with pytest.raises(TypeError, match="stream=True"):
        m.h[0](x)
    state = m.h[0]([x], stream=True)  # the protocol: ([b_0, ...], partial sum)
    assert isinstance(state[0], list) and len(state[0]) == 3 and state[1] is None  # S = 1: two blocks added
