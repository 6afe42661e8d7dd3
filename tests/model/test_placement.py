"""Every placement: its formula checked numerically against a hand-written reference, and gradients."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from addnorm.model import GPT, GPTConfig, ResidualSubLayer
from addnorm.model.placement import NAMES, PLACEMENTS, Placement, deepnorm_constants, resolve_placements

D = 16


def _branch():
    torch.manual_seed(0)
    lin = nn.Linear(D, D)
    return lin


def _ln(t):
    return F.layer_norm(t, (D,), eps=1e-5)


# hand-written formulas, with the sub-layer's own parameters (all norms start at weight 1, bias 0)
REFERENCE = {
    "post": lambda x, f, sub: _ln(x + f(x)),
    "pre": lambda x, f, sub: x + f(_ln(x)),
    "sandwich": lambda x, f, sub: x + _ln(f(_ln(x))),
    "pre_post": lambda x, f, sub: _ln(x + f(_ln(x))),
    "deepnorm": lambda x, f, sub: _ln(sub.alpha * x + f(x)),
    "rezero": lambda x, f, sub: x + sub.gate * f(x),
    "layerscale": lambda x, f, sub: x + sub.gate * f(_ln(x)),
    "none": lambda x, f, sub: x + f(x),
    "no_residual": lambda x, f, sub: _ln(f(x)),
}


@pytest.mark.parametrize("name", list(REFERENCE))  # the frontier forms: tests/frontier, against reference/
def test_formula_matches_hand_written_reference(name):
    p = PLACEMENTS[name].with_norm("layer")
    alpha = deepnorm_constants(6)[0] if p.residual == "scaled" else 1.0
    sub = ResidualSubLayer(_branch(), D, p, alpha=alpha)
    if sub.gate is not None:  # a non-zero gate so the branch shows
        with torch.no_grad():
            sub.gate.fill_(0.37)
    x = torch.randn(3, 5, D)
    stream, pending = sub(x)
    got = stream if pending is None else stream + pending
    want = REFERENCE[name](x, sub.fn, sub)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["layer", "rms", "dyt"])
def test_any_norm_kind_in_any_slot(kind):
    p = Placement("custom", before=kind, after_branch="rms", after_sum=kind)
    sub = ResidualSubLayer(_branch(), D, p)
    x = torch.randn(2, D)
    y, pending = sub(x)
    assert pending is None and y.shape == x.shape
    norms = {"layer": lambda t: _ln(t), "rms": lambda t: F.rms_norm(t, (D,), eps=1e-5),
             "dyt": lambda t: torch.tanh(0.5 * t)}
    want = norms[kind](x + F.rms_norm(sub.fn(norms[kind](x)), (D,), eps=1e-5))
    torch.testing.assert_close(y, want, atol=1e-5, rtol=0)


def test_pending_add_is_fused_into_the_next_norm():
    p = PLACEMENTS["pre"].with_norm("layer")
    a, b = ResidualSubLayer(_branch(), D, p), ResidualSubLayer(nn.Linear(D, D), D, p)
    x = torch.randn(4, D)
    s1, pend1 = a(x)
    assert pend1 is not None and s1 is x  # the add was deferred
    s2, pend2 = b(s1, pend1)
    x1 = x + a.fn(_ln(x))
    torch.testing.assert_close(s2 + pend2, x1 + b.fn(_ln(x1)), atol=1e-5, rtol=0)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError, match="unknown placement 'postnorm'; valid placements: post, pre, sandwich"):
        resolve_placements("postnorm", 4)
    with pytest.raises(ValueError, match="residual must be one of"):
        Placement("x", residual="skip")
    with pytest.raises(ValueError, match="placement slot before must be None, 'default' or one of"):
        Placement("x", before="group")
    with pytest.raises(ValueError, match="n_layer=3 entries, got 2"):
        resolve_placements(["pre", "post"], 3)
    assert "mix" in NAMES


@pytest.mark.parametrize("norm", ["", "Layer", 0])
def test_a_bad_norm_kind_is_refused_by_the_config(norm):
    """norm="" once passed the config (its placements were resolved with ``norm or "layer"``) and failed only when
    the model was built; every bad kind, falsy or not, is named where it is given."""
    with pytest.raises(ValueError, match=r"norm kind must be one of \('layer', 'rms'"):
        GPTConfig(norm=norm)


def test_mix_and_per_layer_lists():
    ps = resolve_placements("mix", 8)
    assert [p.name for p in ps] == ["post"] * 2 + ["pre"] * 6
    ps = resolve_placements("mix", 8, mix_post_layers=3)
    assert [p.name for p in ps].count("post") == 3
    ps = resolve_placements(["post", "pre", PLACEMENTS["sandwich"]], 3, norm="rms")
    assert [p.name for p in ps] == ["post", "pre", "sandwich"] and ps[0].after_sum == "rms"


def test_deepnorm_constants_and_init():
    alpha, beta = deepnorm_constants(12)
    assert alpha == pytest.approx(24 ** 0.25) and beta == pytest.approx(96 ** -0.25)
    m = GPT(GPTConfig(vocab_size=50, block_size=8, n_layer=12, n_head=2, n_embd=64, placement="deepnorm"))
    assert m.h[0].attn.alpha == pytest.approx(alpha)
    w = m.h[0].mlp.fn.c_fc.weight  # xavier normal, gain beta: std = beta * sqrt(2 / (fan_in + fan_out))
    assert w.std().item() == pytest.approx(beta * math.sqrt(2 / (64 + 256)), rel=0.1)


@pytest.mark.parametrize("name, norm", [(n, k) for n in NAMES for k in ("layer", "rms")
                                         if not (n == "ngpt" and k == "rms")])  # nGPT takes no norm kind
def test_gradients_reach_every_parameter(name, norm):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=3, n_head=2, n_embd=16, placement=name,
                      norm=None if name == "ngpt" else norm))
    idx = torch.randint(0, 40, (2, 12))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    # ReZero's branches are multiplied by g = 0 at init: their gradient is 0 until g moves
    for step in range(2):
        opt.zero_grad()
        _, loss = m(idx, idx)
        loss.backward()
        if step == 0:
            opt.step()
    for pname, prm in m.named_parameters():
        assert prm.grad is not None, pname
        assert torch.isfinite(prm.grad).all(), pname
        assert prm.grad.abs().sum() > 0, f"{pname} got a zero gradient"
