"""Learned scalars are (1,) parameters (FSDP2 shards no 0-d one; DyT's and Derf's reference code keep alpha so), and
checkpoints that hold them 0-d still load."""

import copy

import pytest
import torch
from torch import nn

from addnorm.model import GPT
from addnorm.nn import Derf, DyT
from tests.frontier.frontier_cases import CASES, SCALAR_CASES, config, perturbed_model


@pytest.mark.parametrize("name", [*CASES, *SCALAR_CASES])
def test_no_model_has_a_zero_dimensional_parameter(name):
    m = GPT(config(name))
    assert not [n for n, p in m.named_parameters() if p.dim() == 0]


def _scalars(m: nn.Module) -> list[str]:
    return [n for n, p in m.named_parameters() if p.shape == (1,)]


@pytest.mark.parametrize("name", ["dyt_slots", "derf_pre", "hc", "mhc", "mhc_lite", "rezero", "dyt_embed_scale"])
def test_a_checkpoint_with_zero_dimensional_scalars_loads(name):
    """addnorm's checkpoints before the change kept these scalars 0-d: they load, to the same model."""
    cfg = config(name)
    src = perturbed_model(cfg, dtype=torch.float32)
    old = src.state_dict()
    names = _scalars(src)
    assert names  # every case here has a learned scalar
    for n in names:
        old[n] = old[n].reshape(())
    dst = GPT(cfg)
    dst.load_state_dict(old)
    idx = torch.randint(0, cfg.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    assert torch.equal(dst(idx), src(idx))


def test_the_reference_dyt_and_derf_checkpoints_load():
    """The papers' code: alpha = nn.Parameter(torch.ones(1) * alpha_init) (and Derf's shift likewise)."""
    d = DyT(4)
    d.load_state_dict({"alpha": torch.ones(1) * 0.7, "weight": torch.full((4,), 2.0), "bias": torch.zeros(4)})
    assert d.alpha.shape == (1,) and d.alpha.item() == pytest.approx(0.7)
    e = Derf(4)
    e.load_state_dict({"alpha": torch.ones(1) * 0.3, "shift": torch.ones(1) * 0.1, "weight": torch.ones(4),
                       "bias": torch.zeros(4)})
    assert e.shift.item() == pytest.approx(0.1)


@pytest.mark.parametrize("bad", [torch.ones(2), torch.ones(1, 1)])
def test_a_scalar_of_another_shape_is_refused_naming_it(bad):
    d = DyT(4)
    with pytest.raises(RuntimeError, match="alpha"):
        d.load_state_dict({"alpha": bad, "weight": torch.ones(4), "bias": torch.zeros(4)})


def test_the_functional_form_takes_a_zero_dimensional_alpha_and_each_gradient_keeps_its_shape():
    """torch.tensor(0.5) and the module's (1,) parameter: the same numbers, each gradient in its own alpha's shape."""
    from addnorm.functional import pointwise as PF

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    d = DyT(4)
    a0 = torch.tensor(0.5, requires_grad=True)
    y0 = PF.add_dyt(x, None, a0, d.weight, d.bias)[0]
    y1 = d(x)[0]
    assert torch.equal(y1, y0)
    g0, = torch.autograd.grad(y0.sum(), a0)
    g1, = torch.autograd.grad(y1.sum(), d.alpha)
    assert g0.shape == () and g1.shape == (1,) and torch.equal(g1, g0.reshape(1))


def test_a_scalar_promotes_as_a_number_does():
    """A float32 0-d scalar times bfloat16 is bfloat16, a (1,) one float32: ReZero's gate and the embedding scale
    multiply as 0-d views, so a bfloat16 model that keeps them in float32 runs in bfloat16 as before."""
    cfg = config("rezero", embed_scale=2.0)
    m = perturbed_model(cfg, dtype=torch.bfloat16)
    for n, p in m.named_parameters():
        if p.shape == (1,):
            p.data = p.data.float()
    idx = torch.randint(0, cfg.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    assert m(idx).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert GPT(cfg)(idx).dtype == torch.bfloat16


def test_an_optimizer_state_from_zero_dimensional_scalars_resumes_the_same_steps():
    """optimizer.load_state_dict checks no shapes: AdamW's 0-d moments of a (1,) parameter failed at the next step.
    fit_optimizer_state reshapes them; the step is then the one the (1,) state takes."""
    from addnorm.nn.scalars import fit_optimizer_state

    cfg = config("dyt_embed_scale")
    idx = torch.randint(0, cfg.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))

    def step(model, opt):
        _, loss = model(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad()

    a = perturbed_model(cfg, dtype=torch.float32)
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2)
    step(a, opt_a)
    names = _scalars(a)
    model_state, opt_state = a.state_dict(), copy.deepcopy(opt_a.state_dict())  # (its state dicts are opt_a's own)
    for n in names:
        model_state[n] = model_state[n].reshape(())
    for i, (n, _) in enumerate(a.named_parameters()):
        if n in names:
            for k in ("exp_avg", "exp_avg_sq"):
                opt_state["state"][i][k] = opt_state["state"][i][k].reshape(())
    b = GPT(cfg)
    b.load_state_dict(model_state)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2)
    opt_b.load_state_dict(opt_state)
    fit_optimizer_state(opt_b)
    assert all(t.shape == (1,) for n, p in b.named_parameters() if n in names
               for k, t in opt_b.state[p].items() if k != "step")
    step(a, opt_a)
    step(b, opt_b)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
