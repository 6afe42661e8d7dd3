"""GPTConfig.embed_scale: a learned scalar on the token embedding (the DyT paper's LLaMA code starts it at sqrt(d))."""

import math

import pytest
import torch

from addnorm.model import GPT, GPTConfig
from addnorm.model.config import ConfigError

TINY = dict(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)


def _idx():
    return torch.randint(0, 16, (2, 6), generator=torch.Generator().manual_seed(0))


def test_off_by_default_nothing_changes():
    torch.manual_seed(0)
    m = GPT(GPTConfig(**TINY))
    assert GPTConfig().embed_scale is None and m.embed_scale is None
    assert "embed_scale" not in m.state_dict()
    torch.manual_seed(0)
    same = GPT(GPTConfig(**TINY, embed_scale=None))
    assert torch.equal(m(_idx()), same(_idx()))


@pytest.mark.parametrize("placement", ["pre", "mhc", "denseformer"])
def test_the_token_embedding_is_scaled_and_the_scale_learns(placement):
    d = TINY["n_embd"]
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**TINY, placement=placement))
    torch.manual_seed(0)
    scaled = GPT(GPTConfig(**TINY, placement=placement, embed_scale=math.sqrt(d)))
    assert scaled.embed_scale.item() == pytest.approx(math.sqrt(d)) and scaled.embed_scale.requires_grad
    assert {k for k in scaled.state_dict()} - {k for k in plain.state_dict()} == {"embed_scale"}
    for k, v in plain.state_dict().items():  # the same init for everything else
        assert torch.equal(v, scaled.state_dict()[k]), k
    idx = _idx()
    pos = plain.wpe(torch.arange(idx.size(1)))
    torch.testing.assert_close(scaled.embed(idx), math.sqrt(d) * plain.wte(idx) + pos)
    assert not torch.allclose(scaled(idx), plain(idx))
    _, loss = scaled(idx, idx)
    loss.backward()
    assert scaled.embed_scale.grad is not None and scaled.embed_scale.grad.abs() > 0


def test_reset_parameters_puts_the_scale_back():
    m = GPT(GPTConfig(**TINY, embed_scale=2.0))
    with torch.no_grad():
        m.embed_scale.fill_(5.0)
    m.reset_parameters()
    assert m.embed_scale.item() == 2.0


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), True, "8"])
def test_refused_unless_a_finite_positive_number(bad):
    with pytest.raises(ConfigError, match="embed_scale must be None or a finite number > 0"):
        GPTConfig(**TINY, embed_scale=bad)


def test_ngpt_refuses_it_its_stream_starts_on_the_sphere():
    with pytest.raises(ConfigError, match="embed_scale: nGPT does not read it"):
        GPTConfig(**TINY, placement="ngpt", embed_scale=2.0)
