"""Decoder layers whose forwards try the rewrite's limits (patch_hf_model reads their source, so they live
in a file): each must patch to exactly what it computes unpatched."""

import os
import types

import torch
from torch import nn

D, V = 32, 50


class LoopNormAdd(nn.Module):
    """Norm-then-add in a loop; the normed value is read again at the top of the next iteration."""

    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(D), nn.Linear(D, D)

    def forward(self, x):
        d = torch.zeros_like(x)
        for _ in range(2):
            x = self.fc(x) * torch.sigmoid(d)
            d = self.norm(x)
            x = x + d
        return x


class BranchNormAdd(nn.Module):
    """Norm-then-add inside an if the probe never takes (batch-size dependent); the normed value read after it."""

    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(D), nn.Linear(D, D)

    def forward(self, x):
        d = torch.zeros_like(x)
        h = self.fc(x)
        if x.shape[0] > 2:
            d = self.norm(h)
            h = h + d
        return h * torch.sigmoid(d)


class InplaceOther(nn.Module):
    """Norm-then-add whose other operand edits the norm's input in place: it must still run after the norm."""

    def __init__(self):
        super().__init__()
        self.norm, self.fc, self.act = nn.LayerNorm(D), nn.Linear(D, D), nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.fc(x)
        d = self.norm(h)
        y = self.act(h) + d
        return x + y


def gate(t):
    """A module-level function a layer's forward calls (a user may monkeypatch it)."""
    return t


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(D), nn.Linear(D, D)

    def forward(self, x):
        h = x + gate(self.fc(self.norm(x)))
        return h


class PreNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(D), nn.Linear(D, D)

    def forward(self, x):
        return x + self.fc(self.norm(x))


class Model(nn.Module):
    """Embedding, two layers, a final norm; logits as an output object, or a plain tensor."""

    def __init__(self, layer_cls, plain_tensor=False):
        super().__init__()
        self.config = types.SimpleNamespace(vocab_size=V)
        self.emb = nn.Embedding(V, D)
        self.layers = nn.ModuleList([layer_cls() for _ in range(2)])
        self.norm = nn.LayerNorm(D)
        self.plain_tensor = plain_tensor

    def forward(self, input_ids):
        h = self.emb(input_ids)
        for layer in self.layers:
            h = layer(h)
        h = self.norm(h)
        return h if self.plain_tensor else types.SimpleNamespace(logits=h)


def reads_its_file(fn):
    """A decorator that reads the path of the function's source file, as HF's auto_docstring does: it cannot take
    a forward compiled from rewritten source."""
    fn.__code__.co_filename.split(os.path.sep)[-3]  # noqa: B018
    return fn


class DocumentedPreNorm(PreNorm):
    @reads_its_file
    def forward(self, x):
        return x + self.fc(self.norm(x))
