"""Learned scalars are (1,) parameters (FSDP2 shards no 0-d one; DyT's and Derf's reference code keep alpha so), and
checkpoints that hold them 0-d still load."""

import pytest
import torch
from torch import nn

from addnorm.model import GPT, GPTConfig
from addnorm.nn import Derf, DyT
from tests.frontier.frontier_cases import CASES, TINY, config, perturbed_model

EXTRA = {"rezero": dict(placement="rezero"), "layerscale": dict(placement="layerscale"),
         "dyt_embed_scale": dict(placement="pre", norm="dyt", embed_scale=2.0)}


def _config(name):
    return config(name) if name in CASES else GPTConfig(**{**TINY, **EXTRA[name]})


@pytest.mark.parametrize("name", [*CASES, *EXTRA])
def test_no_model_has_a_zero_dimensional_parameter(name):
    m = GPT(_config(name))
    assert not [n for n, p in m.named_parameters() if p.dim() == 0]


def _scalars(m: nn.Module) -> list[str]:
    return [n for n, p in m.named_parameters() if p.shape == (1,)]


@pytest.mark.parametrize("name", ["dyt_slots", "derf_pre", "hc", "mhc", "mhc_lite", "rezero", "dyt_embed_scale"])
def test_a_checkpoint_with_zero_dimensional_scalars_loads(name):
    """addnorm's checkpoints before the change kept these scalars 0-d: they load, to the same model."""
    cfg = _config(name)
    src = perturbed_model(cfg, dtype=torch.float32)
    old = src.state_dict()
    names = _scalars(src)
    assert names  # every case here has a learned scalar
    for n in names:
        old[n] = old[n].reshape(())
    dst = GPT(cfg)
    dst.load_state_dict(old)
    assert all(old[n].dim() == 0 for n in names)  # the caller's mapping is left as it was
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


def test_a_zero_dimensional_dyt_alpha_gives_the_same_numbers_as_the_module():
    """The functional form still takes a 0-d alpha (torch.tensor(0.5)): same numbers as the (1,) parameter."""
    from addnorm.functional import pointwise as PF

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    d = DyT(4)
    y0 = PF.add_dyt(x, None, torch.tensor(0.5), d.weight, d.bias)[0]
    assert torch.equal(d(x)[0], y0)
