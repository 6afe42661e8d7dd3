"""The properties the papers state, measured on the model: doubly stochastic mixing, bounded composite
mixing, and the reductions (HC with n = 1, DenseFormer at init, LNS at layer 1) that must hold exactly."""

import math

import pytest
import torch

from addnorm.model import GPT, GPTConfig
from addnorm.model.config import ConfigError
from frontier_cases import CASES, TINY, batch, config, perturbed_model


def _h_res(model, idx):
    """Every sub-layer's H_res (B, T, n, n), in order, read through the connections' taps."""
    seen, handles = [], []
    for block in model.h:
        for sub in (block.attn, block.mlp):
            handles.append(sub.streams.h_res_tap.register_forward_hook(lambda m, a, out: seen.append(out.detach())))
    model(idx)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("dtype, iters, col_tol", [(torch.float64, 20, 3e-3), (torch.float32, 20, 3e-3),
                                                   (torch.float64, 3, 5e-2)])
def test_mhc_h_res_rows_sum_to_one_columns_within_the_sinkhorn_tolerance(dtype, iters, col_tol):
    cfg = config("mhc", n_streams=4, sinkhorn_iters=iters)
    for H in _h_res(perturbed_model(cfg, dtype=dtype), batch(cfg)):
        assert (H >= 0).all()
        rows, cols = H.sum(-1), H.sum(-2)
        torch.testing.assert_close(rows, torch.ones_like(rows), atol=8 * torch.finfo(dtype).eps, rtol=0)
        assert (cols - 1).abs().max() < col_tol


def test_sinkhorn_on_well_mixed_logits_converges_to_doubly_stochastic():
    from addnorm.model.streams import sinkhorn_knopp
    from addnorm.reference.streams import mhc_eq9_sinkhorn

    logits = torch.randn(64, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    H = sinkhorn_knopp(logits, 20)
    torch.testing.assert_close(H, mhc_eq9_sinkhorn(logits, 20), atol=1e-14, rtol=0)
    assert (H.sum(-2) - 1).abs().max() < 1e-6 and (H.sum(-1) - 1).abs().max() < 1e-14
    big = sinkhorn_knopp(logits * 200, 20)  # exp would overflow without the max shift
    assert torch.isfinite(big).all() and (big.sum(-1) - 1).abs().max() < 1e-12


def test_sinkhorn_column_error_shrinks_with_iterations():
    errs = []
    for iters in (1, 3, 20):
        cfg = config("mhc", n_streams=4, sinkhorn_iters=iters)
        errs.append(max((H.sum(-2) - 1).abs().max().item() for H in _h_res(perturbed_model(cfg), batch(cfg))))
    assert errs[0] > errs[1] > errs[2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mhc_lite_h_res_is_doubly_stochastic_within_1e6(dtype):
    cfg = config("mhc_lite", n_streams=4)
    m = perturbed_model(cfg, dtype=dtype)
    with torch.no_grad():  # large logits, so that the mix is far from the identity
        for b in m.h:
            for s in (b.attn.streams, b.mlp.streams):
                s.b_res.normal_(0, 3)
    for H in _h_res(m, batch(cfg)):
        assert (H >= 0).all()
        assert (H.sum(-1) - 1).abs().max() < 1e-6 and (H.sum(-2) - 1).abs().max() < 1e-6


@pytest.mark.parametrize("name", ["mhc", "mhc_lite"])
def test_composite_mixing_has_spectral_norm_at_most_one(name):
    """||A||_2 <= sqrt(||A||_1 ||A||_inf): with rows summing to 1 and columns to 1 + d_l, the product over
    the layers has spectral norm <= prod_l sqrt(1 + d_l), the tolerance Sinkhorn leaves (0 for mhc_lite)."""
    cfg = config(name, n_streams=4, n_layer=6)
    Hs = _h_res(perturbed_model(cfg), batch(cfg))
    prod, bound = Hs[0], torch.ones(())
    for H in Hs[1:]:
        prod = H @ prod
    for H in Hs:
        bound = bound * H.sum(-2).amax().clamp_min(1).sqrt()
    tol = bound.item() - 1 + 1e-12
    assert tol < (1e-2 if name == "mhc" else 1e-10)
    assert torch.linalg.matrix_norm(prod, ord=2).max() <= 1 + tol


def test_unconstrained_hc_composite_can_grow():
    """The contrast the mHC paper draws: HC's H_res is unconstrained, so its product is not bounded by 1."""
    cfg = config("hc", n_streams=4, n_layer=6)
    m = perturbed_model(cfg)
    with torch.no_grad():
        for b in m.h:
            for s in (b.attn.streams, b.mlp.streams):
                s.static_alpha[:, 1:] += 0.3
    Hs = _h_res(m, batch(cfg))
    prod = Hs[0]
    for H in Hs[1:]:
        prod = H @ prod
    assert torch.linalg.matrix_norm(prod, ord=2).max() > 10


def _same_weights(src: GPT, dst: GPT) -> GPT:
    missing, unexpected = dst.load_state_dict(src.state_dict(), strict=False)
    assert not unexpected
    return dst


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_hc_with_one_stream_at_init_is_pre_norm_exactly(norm):
    torch.manual_seed(0)
    pre = GPT(GPTConfig(**TINY, placement="pre", norm=norm))
    hc = _same_weights(pre, GPT(GPTConfig(**TINY, placement="hc", n_streams=1, norm=norm)))
    idx = batch(pre.config)
    assert torch.equal(hc(idx), pre(idx))


def test_hc_at_init_reads_stream_k_mod_n_and_keeps_every_stream():
    hc = GPT(GPTConfig(**TINY, placement="hc", n_streams=4))
    for i, b in enumerate(hc.h):
        for k, s in ((2 * i, b.attn.streams), (2 * i + 1, b.mlp.streams)):
            assert torch.equal(s.static_alpha[:, 0], torch.eye(4)[k % 4])
            assert torch.equal(s.static_alpha[:, 1:], torch.eye(4))
            assert torch.equal(s.static_beta, torch.ones(4))


@pytest.mark.parametrize("extra", [{}, {"dense_dilation": 2}, {"dense_period": 3}])
def test_denseformer_at_init_is_pre_exactly(extra):
    torch.manual_seed(0)
    pre = GPT(GPTConfig(**{**TINY, "n_layer": 6}, placement="pre"))
    dense = _same_weights(pre, GPT(GPTConfig(**{**TINY, "n_layer": 6}, placement="denseformer", **extra)))
    idx = batch(pre.config)
    assert torch.equal(dense(idx), pre(idx))
    with torch.no_grad():
        dense.dwa[-1 if not extra.get("dense_period") else 5].weight[0] += 0.5  # and the DWA is live
    assert not torch.equal(dense(idx), pre(idx))


def test_denseformer_dilation_and_period_pick_the_papers_indices():
    m = GPT(GPTConfig(**{**TINY, "n_layer": 6}, placement="denseformer", dense_dilation=2, dense_period=3))
    kinds = [type(d).__name__ for d in m.dwa]
    assert kinds == ["Identity", "Identity", "DepthWeightedAverage"] * 2
    assert m.dwa[2].indices == [1, 3] and m.dwa[5].indices == [0, 2, 4, 6]


def test_lns_first_layer_is_pre_exactly_and_later_layers_scale_by_inverse_sqrt_depth():
    torch.manual_seed(0)
    pre = GPT(GPTConfig(**TINY, placement="pre"))
    lns = _same_weights(pre, GPT(GPTConfig(**TINY, placement="lns")))
    x = torch.randn(2, 5, TINY["n_embd"])
    assert torch.equal(lns.h[0](x), pre.h[0](x))
    assert not torch.equal(lns.h[1](x), pre.h[1](x))
    assert [b.attn.depth_scale for b in lns.h] == [1 / math.sqrt(l) for l in (1, 2, 3)]


@pytest.mark.parametrize("kw, match", [
    (dict(placement="pre", n_streams=4), "n_streams=4 needs a widened-stream placement"),
    (dict(placement="mhc", n_streams=0), "n_streams must be >= 1"),
    (dict(placement="hc", n_streams=-2), "n_streams must be >= 1"),
    (dict(placement="mhc", n_streams=2.0), "n_streams must be an integer"),
    (dict(placement="mhc", n_streams="4"), "n_streams must be an integer"),
    (dict(placement="mhc", n_streams=True), "n_streams must be an integer"),
    (dict(placement="mhc", sinkhorn_iters=0), "sinkhorn_iters must be an integer >= 1"),
    (dict(placement="mhc", sinkhorn_iters=2.5), "sinkhorn_iters must be an integer >= 1"),
    (dict(placement="ngpt", norm="rms"), "norm: nGPT .* takes no norm kind"),
    (dict(placement="ngpt", norm="layer"), "norm: nGPT .* takes no norm kind"),
    (dict(placement="mhc_lite", n_streams=8), "too wide for mhc_lite"),
    (dict(placement=["hc", "pre", "pre"]), "same residual stream"),
    (dict(dyt_alpha=(0.8, 0.2)), "dyt_alpha must be one number or"),
    (dict(dyt_alpha=float("nan")), "dyt_alpha must be finite"),
    (dict(placement="denseformer", dense_dilation=0), "dense_dilation must be an integer >= 1"),
    (dict(value_residual=1), "value_residual must be True or False"),
    # the user's spec is named, not the first layer it resolves to
    (dict(placement="mix", n_streams=2), "placement 'mix' has one stream"),
    (dict(placement="hybrid_star", n_streams=2), "placement 'hybrid_star' has one stream"),
    # DenseFormer's averages follow every block or none
    (dict(placement=["pre", "denseformer", "denseformer"]), "placement: every layer must agree on dense"),
    (dict(placement=["denseformer", "pre", "pre"]), "placement: every layer must agree on dense"),
    # options that only one kind of placement or norm reads
    (dict(placement="pre", dense_dilation=2), "dense_dilation=2 needs a DenseFormer placement"),
    (dict(placement="lns", dense_period=2), "dense_period=2 needs a DenseFormer placement"),
    (dict(placement="pre", dyt_alpha=0.8), "dyt_alpha=0.8 sets the alpha of DyT/Derf norms"),
    (dict(placement="pre", norm="rms", dyt_alpha=(0.8, 0.2, 0.2)), "dyt_alpha=.* this model has none"),
    (dict(placement="ngpt", dyt_alpha=(0.8, 0.2, 0.2)), "dyt_alpha=.* this model has none"),
    # sizes: a KeyError ('pop from an empty set'), a ZeroDivisionError or nothing at all before
    (dict(n_layer=0), "n_layer must be an integer >= 1, got 0"),
    (dict(placement="hybrid_star", n_layer=-2), "n_layer must be an integer >= 1, got -2"),
    (dict(n_layer=2.0), "n_layer must be an integer >= 1, got 2.0"),
    (dict(n_head=0), "n_head must be an integer >= 1"),
    (dict(n_embd=0), "n_embd must be an integer >= 1"),
    (dict(vocab_size=0), "vocab_size must be an integer >= 1"),
    (dict(block_size=0), "block_size must be an integer >= 1"),
    (dict(d_ff=0), "d_ff must be an integer >= 1"),
    (dict(eps=float("nan")), "eps must be a finite number"),
])
def test_bad_combinations_are_refused_naming_the_argument(kw, match):
    with pytest.raises(ConfigError, match=match):
        GPTConfig(**{**TINY, **kw})


def _custom(**kw):
    from addnorm.model.placement import Placement

    return Placement("custom", **kw)


@pytest.mark.parametrize("placement, match", [
    # the FFN's stream must be attention's: a single-stream FFN on a widened stream would run once per copy
    (lambda: _custom(stream="mhc", before="default", final_norm=True,
                     mlp=_custom(before="default")), "placement: the FFN's placement must use the attention's"),
    (lambda: _custom(before="default", final_norm=True,
                     mlp=_custom(stream="hc", before="default")), "placement: the FFN's placement must use"),
    # nGPT's blocks read no norm slot, no DWA, no depth scale, no QKV norm
    (lambda: _custom(residual="normalized", before="rms"), "placement: nGPT .* no norm slot, got before='rms'"),
    (lambda: _custom(residual="normalized", after_branch="default"), "placement: nGPT .* no norm slot"),
    (lambda: _custom(residual="normalized", mlp=_custom(residual="normalized", after_sum="layer")),
     "placement: nGPT .* no norm slot, got after_sum='layer'"),
    (lambda: _custom(residual="normalized", dense=True), "placement: nGPT .* takes no dense"),
    (lambda: _custom(residual="normalized", depth_scaled=True), "placement: nGPT .* takes no depth_scaled"),
    (lambda: _custom(residual="normalized", qkv_norm=True), "placement: nGPT .* takes no qkv_norm"),
    (lambda: _custom(residual="normalized", mlp=_custom(before="default")), "'ngpt' cannot be mixed"),
])
def test_custom_placements_that_would_be_ignored_are_refused(placement, match):
    with pytest.raises(ConfigError, match=match):
        GPTConfig(**TINY, placement=placement())


def test_options_where_they_apply_are_accepted():
    """The refusals above leave every real use alone: dyt_alpha with a DyT/Derf kind or slot, DenseFormer's
    options with dense layers, the default alpha anywhere (the study passes it to every run)."""
    for kw in (dict(norm="dyt", dyt_alpha=(0.8, 0.2, 0.2)), dict(norm="derf", dyt_alpha=0.3),
               dict(placement=_custom(before="dyt", final_norm=True), dyt_alpha=0.8),
               dict(placement="hybrid", norm="dyt", dyt_alpha=0.8),
               dict(placement="denseformer", dense_dilation=2, dense_period=3),
               dict(placement="ngpt", dyt_alpha=0.5), dict(placement="pre", dyt_alpha=(0.5, 0.5, 0.5)),
               dict(placement=["denseformer"] * 3), dict(placement="mix", mix_post_layers=1)):
        GPT(GPTConfig(**{**TINY, **kw}))


def test_hc_honours_bias_false_in_its_own_norm():
    m = GPT(GPTConfig(**TINY, placement="hc", n_streams=2, bias=False))
    conns = [s for b in m.h for s in (b.attn.streams, b.mlp.streams)]
    assert all(s.norm.bias is None for s in conns)
    assert not [n for n, _ in m.named_parameters() if n.endswith("bias")]
    assert all(s.norm.bias is not None for b in GPT(GPTConfig(**TINY, placement="hc", n_streams=2)).h
               for s in (b.attn.streams, b.mlp.streams))


def test_widened_placements_default_to_four_streams_and_single_ones_to_one():
    assert GPTConfig(placement="mhc").streams == 4 and GPTConfig(placement="pre").streams == 1
    assert GPTConfig(placement="hc", n_streams=1).streams == 1


@pytest.mark.parametrize("kw", [
    dict(stream="mhc", before="rms", after_branch="dyt"),  # a sandwich inside each mHC branch
    dict(stream="hc", before="derf", depth_scaled=True),  # LNS inside hyper-connections
    dict(stream="mhc_lite", before="layer", dense=True),  # DenseFormer over a widened stream
    dict(before="dyt", after_branch="rms", depth_scaled=True, dense=True),
])
def test_custom_placements_compose(kw):
    from addnorm.model.placement import Placement

    p = Placement("custom", final_norm=True, **kw)
    cfg = GPTConfig(**TINY, placement=p, value_residual=True, n_streams=3 if p.widened else None)
    m = GPT(cfg)
    idx = batch(cfg)
    _, loss = m(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and all(q.grad is not None for q in m.parameters())


def test_a_widened_stream_refuses_a_norm_of_the_sum():
    from addnorm.model.placement import Placement

    with pytest.raises(ValueError, match="after_sum must be None"):
        Placement("x", stream="mhc", after_sum="layer")


def _connections(model):
    return [s for b in model.h for s in (b.attn.streams, b.mlp.streams)]


@pytest.mark.parametrize("n", [1, 2, 4])
def test_widened_inits_are_the_papers(n):
    """At init, before any perturbation, each connection's parameters and its coefficients are the papers':

    - HC (Zhu et al., init of the dynamic part): W_alpha = W_beta = 0, s_alpha = s_beta = 0.01; A_m = e_{k mod n},
      A_r = I, B = 1 (the static part, ``test_hc_at_init_reads_stream_k_mod_n_and_keeps_every_stream``).
    - mHC: the gates alpha = 0.01 (Table 5) on phi ~ N(0, 1/(nC)); the biases give the fixed mappings of Table 1's
      ablation, H_pre = 1/n ("uniform weights of 1/n"; 1/2 for n = 1, sigmoid's value at 0), H_post = 1 ("ones"),
      H_res ~ I -- the coefficients' values with phi's contribution taken out (phi zeroed), and within a few
      hundredths of them with it.
    - mHC-lite: as mHC, with b_res 0 on the identity permutation and -8 on the others (its code), so H_res ~ I.
    """
    from addnorm.model.streams import permutation_matrices

    x = torch.randn(2, 3, n, TINY["n_embd"], generator=torch.Generator().manual_seed(0))
    for s in _connections(GPT(GPTConfig(**TINY, placement="hc", n_streams=n))):
        assert torch.equal(s.w_alpha, torch.zeros_like(s.w_alpha)) and torch.equal(s.w_beta, torch.zeros_like(s.w_beta))
        assert torch.equal(s.s_alpha.detach(), torch.tensor([0.01])) and torch.equal(s.s_beta.detach(), torch.tensor([0.01]))
    for name in ("mhc", "mhc_lite"):
        if name == "mhc_lite" and n > 4:
            continue
        for s in _connections(GPT(GPTConfig(**TINY, placement=name, n_streams=n))):
            assert abs(s.phi.mean().item()) < 0.5 / math.sqrt(s.phi.size(0))
            assert s.phi.std().item() == pytest.approx(1 / math.sqrt(s.phi.size(0)), rel=0.35), name
            for a in (s.alpha_pre, s.alpha_post, s.alpha_res):
                assert torch.equal(a.detach(), torch.tensor([0.01])), name
            with torch.no_grad():
                dyn = s.coefficients(x)
                s.phi.zero_()
            h_pre, h_post, h_res = s.coefficients(x)
            for d, st in zip(dyn, (h_pre, h_post, h_res)):  # alpha * x~'phi: a few hundredths at most
                assert (d - st).abs().max() < 0.05, name
            assert (dyn[0] - h_pre).abs().max() > 0 and (dyn[1] - h_post).abs().max() > 0, name
            torch.testing.assert_close(h_pre, torch.full_like(h_pre, 1 / n if n > 1 else 0.5), atol=1e-7, rtol=0)
            torch.testing.assert_close(h_post, torch.ones_like(h_post), atol=0, rtol=0)
            eye = torch.eye(n).expand_as(h_res)
            if name == "mhc":  # exp(-8) off the diagonal, Sinkhorn-normalized
                assert torch.equal(s.b_res.detach(), torch.full((n, n), -8.0).fill_diagonal_(0.0))
                assert (h_res - eye).abs().max() < 1e-3 * max(n - 1, 1)
            else:  # softmax weight 1/(1 + (n! - 1) e^-8) on I, e^-8 times that on the rest
                k = math.factorial(n)
                assert s.b_res[0] == 0 and s.b_res[1:].eq(-8).all()
                w = torch.softmax(s.b_res.detach().double(), -1)
                want = torch.einsum("k,kij->ij", w, permutation_matrices(n)).float()
                torch.testing.assert_close(h_res, want.expand_as(h_res), atol=1e-7, rtol=0)
                assert w[0] == pytest.approx(1 / (1 + (k - 1) * math.exp(-8)), rel=1e-12)
                assert (h_res - eye).abs().max() <= (k - 1) * math.exp(-8) + 1e-7  # 6e-3 at n = 4


def test_value_residual_lambdas_start_at_resformers_half_and_half():
    """ResFormer: V_n' = lambda_1 V_n + lambda_2 V_1 with lambda_1 = lambda_2 = 0.5 (learned here, from 0.5)."""
    for placement in ("pre", "mhc", "ngpt"):
        m = GPT(GPTConfig(**TINY, placement=placement, value_residual=True))
        vrs = [b.attn.fn.value_residual if placement != "ngpt" else b.attn.value_residual for b in m.h]
        assert vrs[0].lambdas is None
        for vr in vrs[1:]:
            assert vr.lambdas.tolist() == [0.5, 0.5], placement


def test_blocks_called_alone_share_first_values_and_a_dict_is_refused_naming_why():
    """Blocks called one by one with one FirstValues give GPT's hidden states; a dict (which wrappers that cast or
    move a module's inputs copy, so that the first layer's values never reach the next) is a TypeError."""
    from addnorm.model.value_residual import FirstValues

    m = GPT(GPTConfig(**TINY, placement="pre", value_residual=True))
    idx = torch.randint(0, TINY["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(0))
    values, x, pending = FirstValues(), m.embed(idx), None
    for block in m.h:
        x, pending = block(x, pending=pending, stream=True, values=values)
    x, _ = m.ln_f(pending, x) if pending is not None else m.ln_f(x)
    assert torch.equal(x, m.hidden_states(idx))
    with pytest.raises(TypeError, match="FirstValues"):
        m.h[0](m.embed(idx), values={})
    with pytest.raises(ValueError, match="first layer must run"):
        m.h[1](m.embed(idx), values=FirstValues())


def _block_outputs(model, idx):
    """Each block's output stream, pending branch added: (B, T, C), or (B, T, n, C) for a widened stream."""
    outs = []
    hooks = [b.register_forward_hook(lambda m, a, out: outs.append(out[0] if out[1] is None else out[0] + out[1]))
             for b in model.h]
    logits = model(idx)
    for h in hooks:
        h.remove()
    return outs, logits


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("name, n", [("hc", 2), ("hc", 4), ("mhc", 2), ("mhc", 4), ("mhc_lite", 2), ("mhc_lite", 4)])
def test_widened_stream_at_init_keeps_n_copies_of_the_pre_norm_stream(name, n, norm):
    """At init (mHC's dynamic part phi zeroed: the static mappings) every one of the n streams is pre-norm's
    stream after every block: HC reads stream k mod n and writes y into each (B = 1, A_r = I); mHC reads their
    mean (H_pre = 1/n) and its H_res rows sum to 1.
    The streams are then summed before the final norm, so the final norm sees n x: LN(n x; eps) = LN(x; eps/n^2),
    the logits are pre's with the final norm's eps divided by n^2 -- not pre's own (about 3e-3 away here)."""
    torch.manual_seed(0)
    pre = GPT(GPTConfig(**TINY, placement="pre", norm=norm)).double()
    wide = _same_weights(pre, GPT(GPTConfig(**TINY, placement=name, n_streams=n, norm=norm)).double())
    with torch.no_grad():
        for s in _connections(wide):
            if hasattr(s, "phi"):
                s.phi.zero_()
    idx = batch(pre.config)
    want, pre_logits = _block_outputs(pre, idx)
    got, logits = _block_outputs(wide, idx)
    for layer, (g, w) in enumerate(zip(got, want)):
        assert g.shape[-2] == n
        for k in range(n):
            torch.testing.assert_close(g[..., k, :], w, atol=1e-11, rtol=0, msg=f"layer {layer}, stream {k}")
    pre.ln_f.eps = pre.config.eps / n ** 2
    torch.testing.assert_close(logits, pre(idx), atol=1e-10, rtol=0)
    assert 1e-4 < (logits - pre_logits).abs().max() < 1e-2


@pytest.mark.parametrize("name", ["hc", "mhc", "mhc_lite"])
def test_the_n_copies_become_n_streams_in_training(name):
    """The streams start as n copies of the embedding. With mHC's uniform static mappings and phi = 0, every
    stream would get the same gradient and stay a copy for ever (one stream, n times over: checked below);
    HC's read of stream k mod n and mHC's random phi make them differ after a few steps."""

    def spread(zero_phi):
        torch.manual_seed(0)
        m = GPT(GPTConfig(**TINY, placement=name, n_streams=4))
        if zero_phi:
            with torch.no_grad():
                for s in _connections(m):
                    s.phi.zero_()
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        idx = batch(m.config, B=4, T=8)
        for _ in range(5):
            opt.zero_grad()
            m(idx, idx)[1].backward()
            opt.step()
        outs, _ = _block_outputs(m, idx)
        last = outs[-1]  # (B, T, n, C)
        return (last - last.mean(-2, keepdim=True)).abs().max().item() / last.abs().max().item()

    assert spread(False) > 1e-4, name
    if name != "hc":
        assert spread(True) < 1e-6, name


def test_every_placement_name_resolves_to_n_layer_placements():
    """hybrid_star gave one placement for n_layer = 0 (and for -2): its first block came unconditionally."""
    from addnorm.model.placement import PLACEMENTS, resolve_placements

    for name in [*PLACEMENTS, "mix", "hybrid_star"]:
        for n in (0, 1, 3):
            assert len(resolve_placements(name, n)) == n, (name, n)
        with pytest.raises(ValueError, match="n_layer must be an integer >= 0, got -2"):
            resolve_placements(name, -2)


def _checkpoint_blocks(model, reentrant: bool):
    """Each block's forward through torch.utils.checkpoint, its tensors (stream, pending) passed positionally."""
    from torch.utils.checkpoint import checkpoint

    for b in model.h:
        def forward(x, attention_mask=None, pending=None, stream=False, values=None, f=b.forward):
            def run(x, pending):
                return f(x, attention_mask, pending=pending, stream=stream, values=values)
            return checkpoint(run, x, pending, use_reentrant=reentrant)
        b.forward = forward


# the forms whose tensors reach later blocks outside a block's inputs: value_residual's first-layer values
# (``FirstValues``) and Attention Residuals' depth state (a list)
_UNTRACKED = {n for n, c in CASES.items() if c.get("value_residual") or c["placement"] == "attn_res"}


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_activation_checkpointing_gives_every_forms_gradients_or_refuses(name, reentrant):
    """Each block checkpointed: the model's gradients, to float64 precision. Reentrant checkpointing tracks only the
    tensors handed to the checkpointed function, and the gradients through the others came out wrong without a word:
    those forms raise instead (value_residual in the backward's recompute, Attention Residuals in the forward's
    first pass)."""
    cfg = config(name)
    m = perturbed_model(cfg, dtype=torch.float64)
    idx = batch(cfg)
    _, loss = m(idx, idx)
    want = torch.autograd.grad(loss, list(m.parameters()))
    _checkpoint_blocks(m, reentrant)
    if reentrant and name in _UNTRACKED:
        with pytest.raises(RuntimeError, match="use_reentrant=False"):
            _, loss = m(idx, idx)
            loss.backward()
        return
    _, loss = m(idx, idx)
    loss.backward()  # (reentrant checkpointing refuses autograd.grad)
    for (n, p), w in zip(m.named_parameters(), want):
        torch.testing.assert_close(p.grad, w, atol=1e-12, rtol=1e-10, msg=n)
