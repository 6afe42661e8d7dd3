"""GPTConfig refuses what the model would ignore or cannot take, naming the argument; GPT names a bad input."""

import pytest
import torch

from addnorm.model import GPT, GPTConfig
from addnorm.model.config import ConfigError
from addnorm.model.placement import parse_placement

TINY = dict(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)


@pytest.mark.parametrize("kw, match", [
    # options that only another placement reads
    (dict(placement="pre", mix_post_layers=1), "mix_post_layers=1 sets how many leading layers of placement 'mix'"),
    (dict(placement=["post", "pre"], mix_post_layers=0), "mix_post_layers=0 .* placement \\['post', 'pre'\\]"),
    (dict(placement="mix", mix_post_layers=3), "mix_post_layers must be an integer in \\[0, n_layer=2\\], got 3"),
    (dict(placement="mix", mix_post_layers=1.5), "mix_post_layers must be an integer"),
    (dict(placement="hc", sinkhorn_iters=5), "sinkhorn_iters=5 needs the mhc placement"),
    (dict(placement="mhc_lite", sinkhorn_iters=5), "sinkhorn_iters=5 needs the mhc placement"),
    (dict(placement="pre", sinkhorn_iters=5), "sinkhorn_iters=5 needs the mhc placement"),
    (dict(placement="ngpt", activation="relu"), "activation: nGPT does not read it .*SwiGLU"),
    (dict(placement="ngpt", eps=1e-6), "eps: nGPT does not read it"),
    (dict(placement="ngpt", backend="torch"), "backend: nGPT does not read it"),
    # a DyT/Derf alpha for a slot that has no DyT/Derf norm
    (dict(placement="post", norm="dyt", dyt_alpha=(0.5, 0.5, 0.3)), "its final entry .* no(ne)? there"),
    (dict(placement=["post", "pre"], norm="dyt", dyt_alpha=(0.5, 0.5, 0.3)), None),  # last layer pre: a final norm
    # eps that is no epsilon
    (dict(eps=-1), "eps must be a finite number > 0, got -1"),
    (dict(eps=0.0), "eps must be a finite number > 0, got 0.0"),
    (dict(eps=True), "eps must be a finite number > 0, got True"),
    # the placement's type
    (dict(placement=None), "placement must be a placement name, a Placement, or a list of them .* got None"),
    (dict(placement=3), "placement must be a placement name"),
    (dict(placement=[]), "placement must be a placement name"),
    (dict(placement="pre+"), "placement 'pre\\+': 'a\\+b\\+c' needs a placement name on each side"),
])
def test_refused_naming_the_argument(kw, match):
    if match is None:
        GPTConfig(**{**TINY, **kw})
        return
    with pytest.raises(ConfigError, match=match):
        GPTConfig(**{**TINY, **kw})


def test_a_plus_b_is_one_placement_per_layer_as_on_the_command_line():
    cfg = GPTConfig(**TINY, placement="post+pre")
    assert cfg.placement == ("post", "pre") == parse_placement("post+pre")
    assert [p.name for p in cfg.placements()] == ["post", "pre"]
    torch.manual_seed(0)
    a = GPT(cfg)
    torch.manual_seed(0)
    b = GPT(GPTConfig(**TINY, placement=["post", "pre"]))
    idx = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(0))
    assert torch.equal(a(idx), b(idx))
    with pytest.raises(ValueError, match="a per-layer placement list must have n_layer=2 entries, got 3"):
        GPTConfig(**TINY, placement="post+pre+pre")


def test_the_cli_parses_placements_with_the_same_parser():
    from addnorm.cli import study as cli_study

    assert parse_placement("pre") == "pre"
    assert parse_placement("post+post+pre") == ("post", "post", "pre")
    src = open(cli_study.__file__).read()
    assert "parse_placement(" in src and 'split("+")' not in src


@pytest.mark.parametrize("kw", [dict(placement="mix", mix_post_layers=1), dict(placement="mhc", sinkhorn_iters=5),
                                dict(placement="mix"), dict(placement="ngpt", tie_weights=False),
                                dict(placement="pre", norm="dyt", dyt_alpha=(0.8, 0.2, 0.2)), dict(eps=1e-6)])
def test_options_where_they_are_read_are_accepted(kw):
    GPT(GPTConfig(**{**TINY, **kw}))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(**TINY))


@pytest.mark.parametrize("idx, error, match", [
    (torch.zeros(5, dtype=torch.long), ValueError, "idx must be a \\(B, T\\) tensor of token ids, got \\(5,\\)"),
    (torch.zeros(1, 2, 3, dtype=torch.long), ValueError, "idx must be a \\(B, T\\) tensor .* got \\(1, 2, 3\\)"),
    ([[1, 2]], ValueError, "idx must be a \\(B, T\\) tensor of token ids, got list"),
    (torch.zeros(1, 4), TypeError, "idx must hold integer token ids, got dtype torch.float32"),
    (torch.tensor([[1, 16]]), ValueError, "token ids in \\[1, 16\\], outside \\[0, vocab_size=16\\)"),
    (torch.tensor([[-1, 3]]), ValueError, "token ids in \\[-1, 3\\], outside \\[0, vocab_size=16\\)"),
    (torch.zeros(1, 9, dtype=torch.long), ValueError, "sequence length 9 exceeds block_size=8"),
])
def test_gpt_names_a_bad_input(model, idx, error, match):
    with pytest.raises(error, match=match):
        model(idx)


def test_an_empty_batch_and_int32_ids_still_run(model):
    assert model(torch.zeros(0, 4, dtype=torch.long)).shape == (0, 4, 16)
    idx = torch.tensor([[1, 2, 15]])
    assert torch.equal(model(idx.int()), model(idx))


