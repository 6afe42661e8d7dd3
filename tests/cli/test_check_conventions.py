"""`addnorm check` on every convention people write: a table of small sources, each written to a file and checked
as `addnorm check FILE.py:NAME` checks it (its worker, in this process).

Every correct convention passes (all ✅, no hint); every planted mistake fails, and the failing check and its
diagnosis name it; where the checker cannot tell what a thing is meant to be it says "not judged" (➖).
"""

from __future__ import annotations

import textwrap

import pytest

from addnorm.cli.check_worker import work
from addnorm.cli.main import main

HEAD = "import numpy as np\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn\nimport addnorm\n"

# (id, source, name): each must pass every check, with no hint
CORRECT = [
    # the cases the issue lists, verbatim
    ("torch.nn.RMSNorm(768): eps=None is finfo(float32).eps", "norm = torch.nn.RMSNorm(768)", "norm"),
    ("addnorm.nn.RMSNorm(768)", "norm = addnorm.nn.RMSNorm(768)", "norm"),
    ("addnorm.nn.AddRMSNorm", "norm = addnorm.nn.AddRMSNorm(768)", "norm"),
    ("post-norm module RMSNorm(x + sub)", """
        class PostNormRMS(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.norm = nn.RMSNorm(d)

            def forward(self, x, sublayer_output):
                return self.norm(x + sublayer_output)
        """, "PostNormRMS"),
    ("def rms_norm(x, weight, eps=1e-6)", """
        def rms_norm(x, weight, eps=1e-6):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
        """, "rms_norm"),
    ("def rms(x, weight), eps hard-coded", """
        def rms(x, weight):
            return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
        """, "rms"),
    ("RMSNorm without weight", """
        class RMSNorm(nn.Module):
            def __init__(self, dim, eps=1e-6):
                super().__init__()
                self.eps = eps

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        """, "RMSNorm"),
    ("Gemma's (1 + w) RMSNorm, weight starts at zeros", """
        class GemmaRMSNorm(nn.Module):
            def __init__(self, dim, eps=1e-6):
                super().__init__()
                self.eps = eps
                self.weight = nn.Parameter(torch.zeros(dim))

            def forward(self, x):
                out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
                return (out * (1.0 + self.weight.float())).type_as(x)
        """, "GemmaRMSNorm"),
    # more of torch's and addnorm's own
    ("torch.nn.RMSNorm(768, eps=1e-6)", "norm = torch.nn.RMSNorm(768, eps=1e-6)", "norm"),
    ("torch.nn.RMSNorm without weight", "norm = torch.nn.RMSNorm(768, elementwise_affine=False)", "norm"),
    ("torch.nn.LayerNorm(768)", "norm = torch.nn.LayerNorm(768)", "norm"),
    ("torch.nn.LayerNorm without weight or bias", "norm = torch.nn.LayerNorm(768, elementwise_affine=False)", "norm"),
    ("torch.nn.LayerNorm without bias", "norm = torch.nn.LayerNorm(768, bias=False)", "norm"),
    ("addnorm.nn.LayerNorm", "norm = addnorm.nn.LayerNorm(768)", "norm"),
    ("addnorm.nn.AddLayerNorm", "norm = addnorm.nn.AddLayerNorm(768)", "norm"),
    ("addnorm.nn.RMSNorm zero-centred (Gemma)", "norm = addnorm.nn.RMSNorm(768, zero_centered=True)", "norm"),
    ("addnorm.nn.RMSNorm, Llama's cast order", "norm = addnorm.nn.RMSNorm(768, cast_before_weight=True)", "norm"),
    ("addnorm.nn.AddRMSNorm zero-centred", "norm = addnorm.nn.AddRMSNorm(768, zero_centered=True)", "norm"),
    ("the classes themselves (constructed with d)", "from addnorm.nn import RMSNorm, AddLayerNorm", "RMSNorm"),
    ("Llama's RMSNorm: normalize in float32, cast, multiply", """
        class LlamaRMSNorm(nn.Module):
            def __init__(self, hidden_size, eps=1e-6):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(hidden_size))
                self.variance_epsilon = eps

            def forward(self, hidden_states):
                input_dtype = hidden_states.dtype
                hidden_states = hidden_states.to(torch.float32)
                variance = hidden_states.pow(2).mean(-1, keepdim=True)
                hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
                return self.weight * hidden_states.to(input_dtype)
        """, "LlamaRMSNorm"),
    ("transformers' LlamaRMSNorm", "from transformers.models.llama.modeling_llama import LlamaRMSNorm", "LlamaRMSNorm"),
    ("transformers' GemmaRMSNorm", "from transformers.models.gemma.modeling_gemma import GemmaRMSNorm", "GemmaRMSNorm"),
    ("def rms_norm(x, weight, eps): eps required", """
        def rms_norm(x, weight, eps):
            return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        """, "rms_norm"),
    ("def layer_norm(x, d)", """
        def layer_norm(x, d):
            return F.layer_norm(x, (d,))
        """, "layer_norm"),
    ("def rms_norm(x, d)", """
        def rms_norm(x, d):
            return F.rms_norm(x, (d,), eps=1e-6)
        """, "rms_norm"),
    ("def norm(x, d): kind told by behaviour", """
        def norm(x, d):
            return F.layer_norm(x, (d,), eps=1e-6)
        """, "norm"),
    ("torch's F.layer_norm(input, normalized_shape, weight, bias, eps)", "from torch.nn.functional import layer_norm",
     "layer_norm"),
    ("addnorm.rms_norm: eps=None", "from addnorm import rms_norm", "rms_norm"),
    ("addnorm.add_rms_norm: (Norm(x + r), x + r)", "from addnorm import add_rms_norm", "add_rms_norm"),
    ("addnorm.add_layer_norm", "from addnorm import add_layer_norm", "add_layer_norm"),
    ("NumPy layer_norm(x, gamma, beta, eps=1e-5)", """
        def layer_norm(x, gamma, beta, eps=1e-5):
            mu = x.mean(-1, keepdims=True)
            return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps) * gamma + beta
        """, "layer_norm"),
    ("NumPy rms_norm(x, weight, eps=1e-6)", """
        def rms_norm(x, weight, eps=1e-6):
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight
        """, "rms_norm"),
    ("a wrapper around nn.LayerNorm", """
        class LN(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.ln = nn.LayerNorm(d)

            def forward(self, x):
                return self.ln(x)
        """, "LN"),
    ("residual x + sublayer_output (seed 004)", """
        def apply_residual_connection(input_tensor, sublayer_output):
            return input_tensor + sublayer_output
        """, "apply_residual_connection"),
    ("residual add(a, b): b told by behaviour, not taken for a bias", """
        def add(a, b):
            return a + b
        """, "add"),
    ("rms(x, g): g told by behaviour", """
        def rms(x, g):
            return g * x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-8)
        """, "rms"),
    ("post-norm module LayerNorm(x + sub)", """
        class AddNorm(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.ln = nn.LayerNorm(d)

            def forward(self, x, sublayer_output):
                return self.ln(x + sublayer_output)
        """, "AddNorm"),
    ("pre-norm with the sublayer passed in: x + sublayer(Norm(x))", """
        class SublayerConnection(nn.Module):
            def __init__(self, size):
                super().__init__()
                self.norm = nn.LayerNorm(size)

            def forward(self, x, sublayer):
                return x + sublayer(self.norm(x))
        """, "SublayerConnection"),
    ("post-norm with the sublayer passed in: Norm(x + sublayer(x))", """
        class PostNormConnection(nn.Module):
            def __init__(self, size):
                super().__init__()
                self.norm = nn.RMSNorm(size)

            def forward(self, x, sublayer):
                return self.norm(x + sublayer(x))
        """, "PostNormConnection"),
    ("pre-norm block: x + mlp(ln(x))", """
        class PreNormBlock(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.ln = nn.LayerNorm(d)
                self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
                self.drop = nn.Dropout(0.1)

            def forward(self, x):
                return x + self.drop(self.mlp(self.ln(x)))
        """, "PreNormBlock"),
    ("post-norm block: RMSNorm(x + mlp(x))", """
        class PostNormBlock(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.norm = nn.RMSNorm(d, eps=1e-6)
                self.fc = nn.Linear(d, d)

            def forward(self, x):
                return self.norm(x + self.fc(x))
        """, "PostNormBlock"),
]

# (id, source, name, failing check, words of the diagnosis): the check fails, its detail or hint names the mistake
MISTAKES = [
    ("unbiased variance", """
        class LayerNorm(nn.Module):
            def __init__(self, d, eps=1e-5):
                super().__init__()
                self.weight, self.bias, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), eps

            def forward(self, x):
                m, v = x.mean(-1, keepdim=True), x.var(-1, keepdim=True)
                return (x - m) / torch.sqrt(v + self.eps) * self.weight + self.bias
        """, "LayerNorm", "matches the float64 oracle", "unbiased variance (divides by D-1)"),
    ("unbiased std, eps outside the root (the tutorial)", """
        def layer_norm(x, gamma, beta, eps=1e-6):
            return gamma * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + eps) + beta
        """, "layer_norm", "matches the float64 oracle", "unbiased std with eps outside the square root"),
    ("LayerNorm: eps outside the root", """
        def layer_norm(x, weight, bias, eps=1e-5):
            m, v = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
            return (x - m) / (v.sqrt() + eps) * weight + bias
        """, "layer_norm", "matches the float64 oracle", "eps added outside the square root"),
    ("RMSNorm: eps outside the root", """
        def rms_norm(x, weight, eps=1e-6):
            return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight
        """, "rms_norm", "matches the float64 oracle and torch.nn.RMSNorm", "eps added outside the square root"),
    ("RMSNorm: eps outside the root, eps hard-coded", """
        def rms(x, weight):
            return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6) * weight
        """, "rms", "matches the float64 oracle and torch.nn.RMSNorm", "eps added outside the square root"),
    ("LayerNorm: the mean not subtracted", """
        class LayerNorm(nn.Module):
            def __init__(self, d, eps=1e-5):
                super().__init__()
                self.weight, self.bias, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), eps

            def forward(self, x):
                return x / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + self.eps) * self.weight + self.bias
        """, "LayerNorm", "normalizes each position (mean ≈ 0", "subtract the mean before dividing"),
    ("LayerNorm: the mean not subtracted (named)", """
        class LayerNorm(nn.Module):
            def __init__(self, d, eps=1e-5):
                super().__init__()
                self.weight, self.bias, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), eps

            def forward(self, x):
                return x / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + self.eps) * self.weight + self.bias
        """, "LayerNorm", "matches the float64 oracle and torch.nn.LayerNorm", "the mean is not subtracted"),
    ("a LayerNorm with a bias that computes an RMSNorm", """
        def layer_norm(x, weight, bias, eps=1e-5):
            return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight + bias
        """, "layer_norm", "matches the float64 oracle and torch.nn.LayerNorm", "the mean is not subtracted"),
    ("an RMSNorm that subtracts the mean", """
        class RMSNorm(nn.Module):
            def __init__(self, d, eps=1e-6):
                super().__init__()
                self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

            def forward(self, x):
                return F.layer_norm(x, x.shape[-1:], eps=self.eps) * self.weight
        """, "RMSNorm", "matches the float64 oracle and torch.nn.RMSNorm", "the mean is subtracted"),
    ("wrong axis: statistics over the sequence", """
        def layer_norm(x, gamma, beta, eps=1e-5):
            m, v = x.mean(1, keepdim=True), x.var(1, unbiased=False, keepdim=True)
            return (x - m) / torch.sqrt(v + eps) * gamma + beta
        """, "layer_norm", "each position is normalized on its own", "over the sequence axis"),
    ("wrong axis: statistics over the sequence (named by the formula)", """
        def layer_norm(x, gamma, beta, eps=1e-5):
            m, v = x.mean(1, keepdim=True), x.var(1, unbiased=False, keepdim=True)
            return (x - m) / torch.sqrt(v + eps) * gamma + beta
        """, "layer_norm", "matches the float64 oracle", "statistics over the sequence axis"),
    ("wrong axis: RMS over the batch", """
        def rms_norm(x, weight, eps=1e-6):
            return x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + eps) * weight
        """, "rms_norm", "each position is normalized on its own", "across the batch"),
    ("BatchNorm in LayerNorm's place", """
        class Norm(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.bn = nn.BatchNorm1d(d)

            def forward(self, x):
                return self.bn(x.reshape(-1, x.shape[-1])).reshape(x.shape)
        """, "Norm", "each position is normalized on its own", "across the batch (BatchNorm-like)"),
    ("BatchNorm in LayerNorm's place (named by the formula)", """
        class Norm(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.bn = nn.BatchNorm1d(d)

            def forward(self, x):
                return self.bn(x.reshape(-1, x.shape[-1])).reshape(x.shape)
        """, "Norm", "matches the float64 oracle", "BatchNorm, not LayerNorm"),
    ("missing residual: returns the sublayer's output", """
        def residual(x, sublayer_output):
            return sublayer_output
        """, "residual", "adds the input", "the residual is missing: return x + sublayer_output"),
    ("missing residual: post-norm of the sublayer only", """
        class PostNorm(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.norm = nn.LayerNorm(d)

            def forward(self, x, sublayer_output):
                return self.norm(sublayer_output)
        """, "PostNorm", "adds the input", "the residual is missing: add the input before the norm"),
    ("missing residual: pre-norm block returns mlp(ln(x))", """
        class Block(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.ln = nn.LayerNorm(d)
                self.mlp = nn.Linear(d, d)

            def forward(self, x):
                return self.mlp(self.ln(x))
        """, "Block", "adds the input", "the residual is missing: return x + sublayer(self.norm(x))"),
    ("the sublayer's output dropped", """
        def residual(x, sublayer_output):
            return x
        """, "residual", "adds the sublayer's output", "the sublayer's output is dropped"),
    ("the norm on the residual path: Norm(x) + s", """
        class Residual(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.norm = nn.LayerNorm(d)

            def forward(self, x, sublayer_output):
                return self.norm(x) + sublayer_output
        """, "Residual", "adds the input", "the residual path itself is normalized"),
    ("a post-norm whose norm is the tutorial's", """
        class AddNorm(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.eps = 1e-6

            def forward(self, x, sublayer_output):
                s = x + sublayer_output
                return (s - s.mean(-1, keepdim=True)) / (s.std(-1, keepdim=True) + self.eps)
        """, "AddNorm", "the norm: matches the float64 oracle", "unbiased std with eps outside the square root"),
    ("its own eps declared, another one used", """
        class RMSNorm(nn.Module):
            def __init__(self, d, eps=1e-5):
                super().__init__()
                self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        """, "RMSNorm", "matches the float64 oracle", "it computes with eps=1e-06, not its own eps=1e-05"),
    ("Gemma's zeros, applied as w (the 1 + forgotten)", """
        class RMSNorm(nn.Module):
            def __init__(self, d, eps=1e-6):
                super().__init__()
                self.weight, self.eps = nn.Parameter(torch.zeros(d)), eps

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        """, "RMSNorm", "scale starts at ones", "initialize weight (gamma) to ones"),
    ("the weight not applied", """
        class RMSNorm(nn.Module):
            def __init__(self, d, eps=1e-6):
                super().__init__()
                self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        """, "RMSNorm", "applies the weight", "changing the weight does not change the output"),
]

# (id, source, name, the check not judged)
UNJUDGED = [
    ("neither a LayerNorm nor an RMSNorm, and nothing says which", """
        def f(x):
            return torch.tanh(0.5 * x)
        """, "f", "is a LayerNorm or an RMSNorm"),
    ("addnorm.nn.DyT: the sum is returned, the 'norm' is no norm", "dyt = addnorm.nn.DyT(768)", "dyt",
     "the norm: is a LayerNorm or an RMSNorm"),
    # an exact RMSNorm named LayerNorm without a bias: T5's convention, or a LayerNorm that forgot the mean
    ("transformers' T5LayerNorm", "from transformers.models.t5.modeling_t5 import T5LayerNorm", "T5LayerNorm",
     "is the LayerNorm its name says"),
    ("a layer_norm(x) that computes an RMSNorm", """
        def layer_norm(x, eps=1e-5):
            return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        """, "layer_norm", "is the LayerNorm its name says"),
    ("a residual of an unknown form", """
        def combine(x, sublayer_output):
            return x * sublayer_output
        """, "combine", "adds the input"),
]


def _check(tmp_path, source: str, name: str) -> list[dict]:
    path = tmp_path / "user_code.py"
    path.write_text(HEAD + textwrap.dedent(source))
    result = work(f"{path}:{name}", 768)
    assert result["status"] == "ok", result
    return result["results"]


def _shown(results) -> str:
    return "\n".join(f"{r['ok']} {r['name']} ({r['detail']}) hint: {r['hint']}" for r in results)


@pytest.mark.parametrize("source, name", [c[1:] for c in CORRECT], ids=[c[0] for c in CORRECT])
def test_every_correct_convention_passes_without_a_hint(tmp_path, source, name):
    results = _check(tmp_path, source, name)
    assert all(r["ok"] is True for r in results), _shown(results)
    assert not any(r["hint"] for r in results), _shown(results)


@pytest.mark.parametrize("source, name, failing, named", [c[1:] for c in MISTAKES], ids=[c[0] for c in MISTAKES])
def test_every_planted_mistake_fails_and_is_named(tmp_path, source, name, failing, named):
    results = _check(tmp_path, source, name)
    failed = [r for r in results if r["ok"] is False and r["name"].startswith(failing)]
    assert failed, _shown(results)
    assert any(named in r["detail"] + " " + r["hint"] for r in failed), _shown(results)
    assert not any(r["ok"] is None for r in results), _shown(results)


@pytest.mark.parametrize("source, name, check", [c[1:] for c in UNJUDGED], ids=[c[0] for c in UNJUDGED])
def test_what_cannot_be_told_is_not_judged(tmp_path, source, name, check):
    results = _check(tmp_path, source, name)
    assert [r["name"] for r in results if r["ok"] is None] == [check], _shown(results)
    assert not any(r["ok"] is False for r in results), _shown(results)


def test_the_command_shows_not_judged_and_exits_1(tmp_path, capsys):
    path = tmp_path / "user_code.py"
    path.write_text(HEAD + textwrap.dedent(UNJUDGED[0][1]))
    assert main(["check", f"{path}:f", "--timeout", "120"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "➖ is a LayerNorm or an RMSNorm" in out and "1 not judged" in out and "❌" not in out[1:]


def test_the_command_passes_torch_rms_norm(tmp_path, capsys):
    """The issue's first case, end to end: `addnorm check` on torch.nn.RMSNorm(768) exits 0."""
    path = tmp_path / "user_code.py"
    path.write_text(HEAD + "norm = torch.nn.RMSNorm(768)\n")
    assert main(["check", f"{path}:norm", "--timeout", "120"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "All checks passed" in out and "eps=1.19209e-07" in out
