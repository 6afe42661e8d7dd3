"""Decoder layers with a widened stream (B, T, n, C) and HY-V4's hyper-connections, whose writes are spelled in
ways HF's models do not spell them (patch_hf_model reads their source, so they live in a file)."""

import types

import torch
from torch import nn

D, V, N = 32, 50, 3
CONFIG = types.SimpleNamespace(hc_mult=N, hc_eps=1e-3, rms_norm_eps=1e-6, hc_magnitude=1.5, hidden_size=D,
                               vocab_size=V)


def _hyper_connection(head=False):
    from transformers.models.hy_v4.modeling_hy_v4 import HYV4HyperConnection, HYV4HyperHead

    module = (HYV4HyperHead if head else HYV4HyperConnection)(CONFIG)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.3)
    return module


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.hc, self.norm, self.fc = _hyper_connection(), nn.RMSNorm(D, eps=1e-6), nn.Linear(D, D)


class StreamCast(_Layer):
    """Only the stream cast to float32, and back: the product is float32's (its gate is)."""

    def forward(self, x):
        post, h = self.hc(x)
        y = self.fc(self.norm(h))
        return (post.unsqueeze(-1) * y.unsqueeze(-2) + x.float()).to(x.dtype)


class StreamFirst(_Layer):
    """The stream on the left, no cast."""

    def forward(self, x):
        post, h = self.hc(x)
        y = self.fc(self.norm(h))
        x = x + post.unsqueeze(-1) * y.unsqueeze(-2)
        return x


class Einsum(_Layer):
    """A write addnorm does not recognise."""

    def forward(self, x):
        post, h = self.hc(x)
        y = self.fc(self.norm(h))
        return x + torch.einsum("...n,...c->...nc", post, y)


class Model(nn.Module):
    """Embedding copied into n streams, two layers, HY-V4's head and a final norm."""

    def __init__(self, layer_cls):
        super().__init__()
        self.config = CONFIG
        self.emb = nn.Embedding(V, D)
        self.layers = nn.ModuleList([layer_cls() for _ in range(2)])
        self.head, self.norm = _hyper_connection(head=True), nn.RMSNorm(D, eps=1e-6)

    def forward(self, input_ids):
        x = self.emb(input_ids).unsqueeze(2).expand(-1, -1, N, -1).contiguous()
        for layer in self.layers:
            x = layer(x)
        return types.SimpleNamespace(logits=self.norm(self.head(x)))
