"""Norm-then-add's CPU forward, and the float32 parallel forms', write their rows a chunk (512 values) at a time,
fetching the next row's chunk before each: every width around the chunk's, every row of a call, row strides wider
than the row, float32 and bfloat16 outputs, one and two norms of the parallel stream, and streamed outputs
(non-temporal stores through scratch), against a float64 oracle -- each chunk's offsets into x, the residual, the
weights, the biases and the outputs must line up, or a row comes out shifted."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from addnorm.functional import layer_norm_add, parallel_add_layer_norm, parallel_add_rms_norm, rms_norm_add
from addnorm.reference import oracle
from tests.backends import KERNELS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif("cpu" not in KERNELS, reason="addnorm's CPU kernels are not built here")

WIDTHS = (1, 511, 512, 513, 1031, 1536, 2049)
TOL = {torch.float32: (2e-5, 1e-5), torch.bfloat16: (3e-2, 1.6e-2)}


def _norm64(kind, s, w, b, eps):
    """The project's float64 oracle of the norm of s (addnorm.reference.oracle), as a tensor."""
    y = oracle.layer_norm(s, w, b, eps) if kind == "layer" else oracle.rms_norm(s, w, eps)
    return torch.from_numpy(y)


def _mismatches(form, kind, dtype, D, strided):
    """The first few (output, row, column) off the oracle: norm-then-add's r + norm(x); the parallel forms' stream
    s = r + x + x2 and the norm (or both norms) of the stream they returned."""
    g = torch.Generator().manual_seed(D)
    N = 6  # several rows: each but the last fetches its successor
    cols = D + 5 if strided else D
    x, x2 = ((torch.randn(N, cols, generator=g) * 2 + 0.5).to(dtype)[:, :D] for _ in range(2))
    r = torch.randn(N, cols, generator=g).to(dtype)[:, :D]
    w, b, w2, b2 = (torch.randn(D, generator=g).to(dtype) for _ in range(4))
    eps, bias = 1e-5, {"bias": b} if kind == "layer" else {}
    if form == "norm_add":
        fn = layer_norm_add if kind == "layer" else rms_norm_add
        got = {"y": fn(x, r, D, w, eps=eps, backend="cpu", **bias)}
        want = {"y": r.double() + _norm64(kind, x, w, b, eps)}
    else:
        fn = parallel_add_layer_norm if kind == "layer" else parallel_add_rms_norm
        two = {"weight2": w2, **({"bias2": b2} if kind == "layer" else {})} if form == "parallel2" else {}
        y, y2, st = fn(x, x2, r, D, w, eps=eps, backend="cpu", **bias, **two)
        got = {"y": y, "s": st, **({"y2": y2} if form == "parallel2" else {})}
        want = {"y": _norm64(kind, st, w, b, eps), "s": r.double() + x.double() + x2.double()}
        if form == "parallel2":
            want["y2"] = _norm64(kind, st, w2, b2, eps)
    atol, rtol = TOL[dtype]
    bad = []
    for name, out in got.items():
        off = ~torch.isclose(out.double(), want[name], atol=atol * 8, rtol=rtol)
        bad += [(name, row, col) for row, col in off.nonzero().tolist()]
    return bad[:3]


# the parallel forms chunk their float32 outputs only (bfloat16 keeps the whole-row prefetch), but both are checked
CASES = [(f, k, dt, D, s) for f in ("norm_add", "parallel", "parallel2") for k in ("layer", "rms")
         for dt in (torch.float32, torch.bfloat16) for D in WIDTHS for s in (False, True)]


def test_every_chunk_of_every_row_is_the_oracles():
    bad = {f"{f} {k} {dt} D={D} strided={s}": m for f, k, dt, D, s in CASES if (m := _mismatches(f, k, dt, D, s))}
    assert not bad, f"rows off the float64 oracle at (output, row, column): {bad}"


def test_streamed_outputs_too():
    """ADDNORM_CPU_NT_BYTES=0: every output streamed through scratch (the threshold is read once, so in a subprocess)."""
    code = ("from tests.kernels.test_fused_row_chunks import CASES, _mismatches\n"
            "bad = {f'{f} {k} {dt} D={D} strided={s}': m for f, k, dt, D, s in CASES\n"
            "       if (m := _mismatches(f, k, dt, D, s))}\n"
            "print(bad)\nraise SystemExit(1 if bad else 0)\n")
    env = dict(os.environ, ADDNORM_CPU_NT_BYTES="0")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, f"streamed outputs off the oracle: {done.stdout}{done.stderr[-2000:]}"
