"""Attention, feed-forward, blocks and GPT: the seeds' checks and the fused stream's exactness."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import addnorm
from addnorm.model import GPT, FeedForward, GPTConfig, MultiHeadAttention, ResidualSubLayer, TransformerBlock
from addnorm.model.placement import PLACEMENTS


def test_seed_002_attention_sublayer_parameter_count():
    sub = ResidualSubLayer(MultiHeadAttention(512, 8), 512, PLACEMENTS["post"].with_norm("layer"))
    assert sum(p.numel() for p in sub.parameters()) == 1_051_648


def test_seed_000_transformer_block_shape_and_parameters():
    torch.manual_seed(0)
    block = TransformerBlock(GPTConfig(n_embd=512, n_head=8, d_ff=2048, activation="relu", n_layer=1))
    x = torch.randn(2, 10, 512)
    y = block(x)
    assert y.shape == x.shape
    assert (y - x).abs().mean() > 1e-3  # attention + FFN changed the data
    assert sum(p.numel() for p in block.parameters()) == 3_152_384


def test_causal_attention_ignores_the_future():
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4)
    x = torch.randn(1, 6, 32)
    y = attn(x)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, 32)
    torch.testing.assert_close(attn(x2)[:, :4], y[:, :4])


def test_attention_matches_a_hand_written_softmax():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2)
    x = torch.randn(2, 5, 16)
    q, k, v = attn.c_attn(x).split(16, dim=2)
    heads = lambda t: t.view(2, 5, 2, 8).transpose(1, 2)  # noqa: E731
    scores = heads(q) @ heads(k).transpose(-1, -2) / 8 ** 0.5
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ heads(v)).transpose(1, 2).reshape(2, 5, 16)
    torch.testing.assert_close(attn(x), attn.c_proj(y), atol=1e-6, rtol=0)


def test_padding_mask():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2)
    x = torch.randn(2, 5, 16)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    y = attn(x, attention_mask=mask)
    assert torch.isfinite(y).all()
    # the second sequence's real tokens see only real tokens: same as running it unpadded
    torch.testing.assert_close(y[1, 2:], attn(x[1:, 2:])[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(y[0], attn(x[:1])[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("act,fn", [("relu", F.relu), ("gelu", F.gelu), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"))])
def test_feedforward(act, fn):
    ff = FeedForward(8, 32, act)
    x = torch.randn(3, 8)
    torch.testing.assert_close(ff(x), ff.c_proj(fn(ff.c_fc(x))))
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(8, 32, "swish")


@pytest.mark.parametrize("placement", ["pre", "post", "sandwich", "deepnorm", "mix"])
def test_fused_stream_equals_the_plain_block_by_block_forward(placement):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=32, placement=placement)).eval()
    idx = torch.randint(0, 64, (2, 16))
    x = m.wte(idx) + m.wpe(torch.arange(16))
    for block in m.h:  # each block materializes its stream: no fusion across blocks
        x = block(x)
    if m.ln_f is not None:
        x = F.layer_norm(x, (32,), m.ln_f.weight, m.ln_f.bias, 1e-5)
    torch.testing.assert_close(m.hidden_states(idx), x, atol=1e-5, rtol=0)


def test_cpu_and_torch_backends_agree_on_a_model():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))
    idx = torch.randint(0, 64, (2, 16))
    with addnorm.use_backend("torch"):
        a, la = m(idx, idx)
        ga = torch.autograd.grad(la, list(m.parameters()))
    b, lb = m(idx, idx)
    gb = torch.autograd.grad(lb, list(m.parameters()))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def test_config_validation():
    with pytest.raises(ValueError, match="n_embd=30 must be divisible by n_head=4"):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="unknown placement"):
        GPTConfig(placement="middle")
    with pytest.raises(ValueError, match="norm kind must be one of|placement slot"):
        GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=4, norm="group"))
    with pytest.raises(ValueError, match="sequence length 9 exceeds block_size=8"):
        GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=1, n_embd=4))(torch.zeros(1, 9, dtype=torch.long))


def test_gpt2_init_scaling():
    m = GPT(GPTConfig(n_layer=12, n_embd=64, n_head=4, vocab_size=100, block_size=8))
    assert m.h[0].attn.fn.c_proj.weight.std().item() == pytest.approx(0.02 / 24 ** 0.5, rel=0.1)
    assert m.h[0].attn.fn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert m.lm_head.weight is m.wte.weight
