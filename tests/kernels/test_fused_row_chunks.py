"""Norm-then-add's CPU forward writes its rows a chunk (512 values) at a time, fetching the next row's chunk before
each: every width around the chunk's, every row of a call, row strides wider than the row, float32 and bfloat16
outputs, and streamed outputs (non-temporal stores through scratch), against a float64 oracle -- each chunk's
offsets into x, the residual, the weight, the bias and the output must line up, or a row comes out shifted."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from addnorm.functional import layer_norm_add, rms_norm_add
from tests.backends import KERNELS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif("cpu" not in KERNELS, reason="addnorm's CPU kernels are not built here")

WIDTHS = (1, 511, 512, 513, 1031, 1536, 2049)
TOL = {torch.float32: (2e-5, 1e-5), torch.bfloat16: (3e-2, 1.6e-2)}


def _oracle(kind, x, r, w, b, eps):
    x, r, w = x.double(), r.double(), w.double()
    if kind == "layer":
        mean = x.mean(-1, keepdim=True)
        y = (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps) * w + b.double()
    else:
        y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w
    return r + y


def _mismatches(kind, dtype, D, strided):
    g = torch.Generator().manual_seed(D)
    N = 6  # several rows: each but the last fetches its successor
    cols = D + 5 if strided else D
    x = (torch.randn(N, cols, generator=g) * 2 + 0.5).to(dtype)[:, :D]
    r = torch.randn(N, cols, generator=g).to(dtype)[:, :D]
    w = torch.randn(D, generator=g).to(dtype)
    b = torch.randn(D, generator=g).to(dtype)
    if kind == "layer":
        out = layer_norm_add(x, r, D, w, b, 1e-5, backend="cpu")
    else:
        out = rms_norm_add(x, r, D, w, 1e-5, backend="cpu")
    want = _oracle(kind, x, r, w, b, 1e-5)
    atol, rtol = TOL[dtype]
    bad = ~torch.isclose(out.double(), want, atol=atol * 8, rtol=rtol)
    return [(row, col) for row, col in bad.nonzero().tolist()][:3]


CASES = [(k, dt, D, s) for k in ("layer", "rms") for dt in (torch.float32, torch.bfloat16) for D in WIDTHS
         for s in (False, True)]


def test_every_chunk_of_every_row_is_the_oracles():
    bad = {f"{k} {dt} D={D} strided={s}": m for k, dt, D, s in CASES if (m := _mismatches(k, dt, D, s))}
    assert not bad, f"rows off the float64 oracle at (row, column): {bad}"


def test_streamed_outputs_too():
    """ADDNORM_CPU_NT_BYTES=0: every output streamed through scratch (the threshold is read once, so in a subprocess)."""
    code = ("from tests.kernels.test_fused_row_chunks import CASES, _mismatches\n"
            "bad = {f'{k} {dt} D={D} strided={s}': m for k, dt, D, s in CASES if (m := _mismatches(k, dt, D, s))}\n"
            "print(bad)\nraise SystemExit(1 if bad else 0)\n")
    env = dict(os.environ, ADDNORM_CPU_NT_BYTES="0")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, f"streamed outputs off the oracle: {done.stdout}{done.stderr[-2000:]}"
