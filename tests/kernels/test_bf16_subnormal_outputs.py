"""bfloat16 outputs in the subnormal range keep their value, on every instruction-set path.

DyT's and Derf's outputs and their backward's ds too (their vector loops convert with the same instruction).

On a CPU with AVX512_BF16 the AVX-512 loops convert float32 to bfloat16 with ``vcvtne2ps2bf16``, which reads a
subnormal input as zero (its DAZ). The loops convert a group of 32 holding one by the portable rounding instead; here
weights of ~1e-39 put whole rows of LayerNorm and RMSNorm outputs among the subnormals (their spacing is 2^-133,
the outputs tens of those steps), and a residual stream whose sums x + r fall there too. Each output must be the
float64 answer within a bfloat16 step at its value (the instruction alone gives 0, tens of steps off), and the stream the
bits eager's ``x + r`` stores. Each path runs in its own process (``ADDNORM_CPU_ISA``)."""

import json
import os
import subprocess
import sys

import pytest

import addnorm

pytestmark = pytest.mark.skipif(not addnorm.cpu_kernel_availability().available,
                                reason="the compiled CPU kernels are not built")

SCRIPT = r'''
import json
import math
import torch
import addnorm
from addnorm.functional import (add_derf, add_dyt, add_layer_norm, add_rms_norm, layer_norm_add,
                                parallel_add_layer_norm, parallel_add_rms_norm, rms_norm_add)

g = torch.Generator().manual_seed(0)
out = {}
for D in (64, 1024, 1000):  # whole groups of 32, and a tail
    N = 8
    x = (torch.randn(N, D, generator=g) * 1e-38).bfloat16()
    r = (-x.float() * (1 + torch.rand(N, D, generator=g) * 0.2)).bfloat16()  # x + r: mostly subnormal
    x[:, ::3] = torch.randn(N, len(range(0, D, 3)), generator=g).bfloat16()  # rows with a spread too
    w = torch.full((D,), 5e-39) * (1 + torch.rand(D, generator=g))
    b = torch.zeros(D)
    s = (x.float() + r.float()).bfloat16()
    s64 = s.double()
    ln = torch.nn.functional.layer_norm(s64, (D,), w.double(), b.double(), 1e-5)
    rms = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    cases = {
        "add_layer_norm": (add_layer_norm(x, r, (D,), w, b, 1e-5, backend="cpu"), ln),
        "add_rms_norm": (add_rms_norm(x, r, (D,), w, 1e-6, backend="cpu"), rms),
        "layer_norm_add": ((layer_norm_add(s, torch.zeros_like(s), (D,), w, b, 1e-5, backend="cpu"),), ln),
        "rms_norm_add": ((rms_norm_add(s, torch.zeros_like(s), (D,), w, 1e-6, backend="cpu"),), rms),
        "parallel_add_layer_norm": (parallel_add_layer_norm(x, None, r, (D,), w, b, eps=1e-5, backend="cpu"), ln),
        "parallel_add_rms_norm": (parallel_add_rms_norm(x, None, r, (D,), w, eps=1e-6, backend="cpu"), rms),
    }
    # DyT and Derf: w f(alpha s + shift) + b with the same weights; and the backward's ds = alpha dy w f'(u) + dres
    # (no dres: ds is that product alone, subnormal too), whose conversion is the same instruction's
    al, sh = 0.7, 0.1
    u = al * s64 + sh
    cases["add_dyt"] = (add_dyt(x, r, al, w, b, backend="cpu"), w.double() * torch.tanh(al * s64) + b.double())
    cases["add_derf"] = (add_derf(x, r, al, sh, w, b, backend="cpu"), w.double() * torch.erf(u) + b.double())
    dy = torch.randn(N, D, generator=g).bfloat16()
    for name in ("dyt", "derf"):
        sg = s.clone().requires_grad_()
        y = add_dyt(sg, None, al, w, b, backend="cpu")[0] if name == "dyt" else \
            add_derf(sg, None, al, sh, w, b, backend="cpu")[0]
        y.backward(dy)
        slope = (1 - torch.tanh(al * s64) ** 2) if name == "dyt" else 2 / math.pi ** 0.5 * torch.exp(-u * u)
        cases[f"{name} backward"] = ((sg.grad,), al * dy.double() * w.double() * slope)
    for name, (got, ref) in cases.items():
        y = got[0]
        key = f"{name} D={D}"
        # bfloat16's step at each reference value: 2^-133 among the subnormals, 2^(e - 7) above
        step = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(2.0 ** -126))) - 7)
        out[key] = {"steps": ((y.double() - ref).abs() / step).max().item(),
                    "subnormal": ((ref.abs() < 2.0 ** -126) & (ref != 0)).float().mean().item(),
                    "stream_exact": all(torch.equal(t, s) for t in got[1:] if t is not None and t.shape == s.shape)}
print(json.dumps({"isa": addnorm.cpu_kernel_availability().isa, "cells": out}))
'''


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512", "native"])
def test_subnormal_bfloat16_outputs_keep_their_value(isa):
    env = dict(os.environ, ADDNORM_CPU_ISA=isa, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    for key, cell in got["cells"].items():
        assert cell["subnormal"] > 0.5, (key, cell)  # the case puts most outputs there
        assert cell["steps"] <= 1.0, (got["isa"], key, cell)
        assert cell["stream_exact"], (got["isa"], key, cell)
