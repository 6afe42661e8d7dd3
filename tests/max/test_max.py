"""addnorm.max: seed 004's checks, exactness against the PyTorch backend, HF GPT-2 weights, `check`."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import importlib.util

HAVE_MAX = importlib.util.find_spec("max") is not None and importlib.util.find_spec("max.experimental") is not None
if not HAVE_MAX and os.environ.get("CI"):
    raise RuntimeError("CI must run the MAX tests: .ci/run installs the extra (make extras)")

pytestmark = pytest.mark.skipif(not HAVE_MAX, reason="MAX is not installed (pip install -e '.[max]'); CI runs these")

EX = Path(__file__).resolve().parent.parent / "check_examples"


@pytest.fixture(scope="module")
def am():
    import addnorm.max as am

    return am


def _x(shape=(2, 8, 768), seed=0, loc=5.0, scale=10.0):
    return np.random.default_rng(seed).normal(loc, scale, size=shape).astype(np.float32)


def test_seed_004_checks(am):
    ln = am.LayerNorm(768)
    assert np.array_equal(ln.weight.to_numpy(), np.ones(768, np.float32))
    assert np.array_equal(ln.bias.to_numpy(), np.zeros(768, np.float32))
    y = ln(am.to_max(_x())).to_numpy()
    assert y.shape == (2, 8, 768)
    assert np.abs(y.mean(-1)).max() < 1e-4 and np.abs(y.std(-1) - 1).max() < 1e-3
    block = am.ResidualBlock(768)
    assert isinstance(block.ln, am.LayerNorm)
    x, sub = _x(seed=1), _x(seed=2)
    out = block(am.to_max(x), am.to_max(sub)).to_numpy()
    assert np.array_equal(out, x + sub)  # adds exactly
    assert np.array_equal(am.apply_residual_connection(am.to_max(x), am.to_max(sub)).to_numpy(), x + sub)


def test_matches_the_pytorch_backend(am):
    import addnorm

    x, r = _x(seed=3), _x(seed=4, loc=0, scale=1)
    w, b = np.random.default_rng(5).normal(1, 0.2, 768).astype(np.float32), np.random.default_rng(6).normal(0, 0.2, 768).astype(np.float32)
    ln = am.AddLayerNorm(768)
    am.load_norm_weights(ln, {"weight": torch.from_numpy(w), "bias": torch.from_numpy(b)})
    y, s = ln(am.to_max(x), am.to_max(r))
    ty, ts = addnorm.add_layer_norm(torch.from_numpy(x), torch.from_numpy(r), 768, torch.from_numpy(w), torch.from_numpy(b))
    assert np.abs(y.to_numpy() - ty.numpy()).max() <= 1e-5 * max(1, np.abs(ty.numpy()).max())
    assert np.array_equal(s.to_numpy(), ts.numpy())
    rms = am.AddRMSNorm(768)
    am.load_norm_weights(rms, {"weight": torch.from_numpy(w)})
    y, _ = rms(am.to_max(x), am.to_max(r))
    ty, _ = addnorm.add_rms_norm(torch.from_numpy(x), torch.from_numpy(r), 768, torch.from_numpy(w), 1e-6)
    assert np.abs(y.to_numpy() - ty.numpy()).max() <= 1e-5 * max(1, np.abs(ty.numpy()).max())
    gemma = am.RMSNorm(768, weight_offset=1.0)
    y = gemma(am.to_max(x)).to_numpy()
    ty = addnorm.rms_norm(torch.from_numpy(x), 768, torch.zeros(768), 1e-6, weight_offset=1.0)
    assert np.abs(y - ty.numpy()).max() <= 1e-5


def test_real_gpt2_block_layer_norm_weights(am):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=100, n_positions=16, n_layer=2, n_head=4,
                                                              n_embd=64, bos_token_id=0, eos_token_id=0)).eval()
    with torch.no_grad():  # weights away from their ones/zeros init, as in a trained model
        for p in hf.transformer.h[1].ln_1.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ln = am.layer_norm_from_state_dict(hf.state_dict(), "transformer.h.1.ln_1.", eps=hf.config.layer_norm_epsilon)
    h = torch.randn(2, 5, 64) * 3
    with torch.no_grad():
        want = hf.transformer.h[1].ln_1(h).numpy()
    got = ln(am.to_max(h)).to_numpy()
    assert np.abs(got - want).max() <= 1e-5


def test_conversion_shares_memory(am):
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    m = am.to_max(t)
    back = am.to_torch(m)
    assert back.data_ptr() == t.data_ptr()
    t[0, 0] = 42.0
    assert m.to_numpy()[0, 0] == 42.0
    assert np.array_equal(am.to_numpy(am.to_max(t.t())), t.t().numpy())  # non-contiguous: copied, still right


def test_check_accepts_max_modules(capsys):
    from addnorm.cli.main import main

    assert main(["check", f"{EX / 'max_step10.py'}:LayerNorm", "--timeout", "900"]) == 0
    assert "MAX module" in capsys.readouterr().out
    assert main(["check", f"{EX / 'max_step10.py'}:ResidualBlock", "--timeout", "900"]) == 0
    assert main(["check", f"{EX / 'max_step10.py'}:ForgotResidual", "--timeout", "900"]) == 1
    assert "the residual is missing" in " ".join(capsys.readouterr().out.split())


def test_torch_parity_of_layer_norm_against_torch_nn(am):
    x = _x((4, 33, 768), seed=9, loc=-2, scale=0.5)
    y = am.LayerNorm(768)(am.to_max(x)).to_numpy()
    assert np.abs(y - F.layer_norm(torch.from_numpy(x), (768,)).numpy()).max() <= 1e-5


def test_a_child_python_after_max_is_the_same_interpreter(am):
    """MAX's runtime writes PYTHONEXECUTABLE and PYTHONPATH into the C environment on import; a child started
    as this venv's python then left the venv (no addnorm, the base interpreter's setuptools)."""
    import subprocess
    import sys

    am.LayerNorm(8)(am.to_max(_x((2, 8)))).to_numpy()
    code = "import os, sys; print(sys.executable); print(sys.prefix); print(os.environ.get('PYTHONPATH'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True).stdout.splitlines()
    assert out == [sys.executable, sys.prefix, str(os.environ.get("PYTHONPATH"))]
