"""Rows of huge finite values normalize to the float64 answer, not NaN or zeros, on every path.

Values above ~1.8e19 overflow a float32 sum of squares, and values near float32's largest (3.4e38) the sum and
x - mean themselves: the statistics came out inf or NaN, and LayerNorm's and RMSNorm's outputs NaN (or all 0) where
the true ones are ordinary numbers. Every form that computes the statistics -- the plain norms, Add & Norm,
norm-then-add, the parallel residual -- forward and backward, float32 / bfloat16 / float16 inputs, is judged against
the float64 oracle (``addnorm.reference.oracle``) computed from the very stream the op normalized: rows of random
values at 1e19, 1e30 and 3e38, the same mixed with O(1) values, rows of one huge value, rows of +-huge halves. The
CPU kernels run in a subprocess per instruction set (``ADDNORM_CPU_ISA``, as test_isa_accuracy); the "torch" backend
here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import addnorm
from tests.backends import HAVE_TRITON, NO_TRITON, TRITON

ROOT = Path(__file__).resolve().parents[2]

CHECK = r'''
import math
import numpy as np
import torch
import addnorm.functional as AF
from addnorm.functional import layer_norm_add, parallel_add_layer_norm, parallel_add_rms_norm, rms_norm_add
from addnorm.reference import oracle

D, EPS = 96, 1e-5
DEV = "cpu"  # run(..., device) sets it: the Triton kernels on a GPU take CUDA tensors
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def rows(mag, dtype, g, D=D):
    x = torch.randn(4, D, generator=g, dtype=torch.float64) * mag
    x[1, ::3] = torch.randn(x[1, ::3].shape, generator=g, dtype=torch.float64)  # huge mixed with O(1) values
    x[2] = mag                                                       # one huge value
    x[3, : D // 2], x[3, D // 2 :] = mag, -mag                       # +-huge halves
    top = torch.finfo(dtype).max
    return x.clamp(-top, top).to(DEV, dtype)


def err(got, want):
    """|got - want| relative to the scale of want (its largest magnitude, at least 1e-30)"""
    got, want = got.detach().double().cpu().numpy(), np.asarray(want, dtype=np.float64)
    if not np.isfinite(got).all():
        return math.inf
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def cases(backend, dtype, mag, g):
    """(name, kind, x, y, s, post, w, b): each op's output y of the norm of s (plus post for norm-then-add)"""
    small = lambda: torch.randn(4, D, generator=g).to(DEV, dtype)  # noqa: E731
    for kind in ("layer", "rms"):
        # a row longer than one tile (the Triton kernels walk it in chunks; the C loops block their sums)
        W = 20000
        w = (torch.rand(W, generator=g) + 0.5).to(DEV).requires_grad_()
        x = rows(mag, dtype, g, W).requires_grad_()
        norm = AF.layer_norm if kind == "layer" else AF.rms_norm
        yield "wide norm", kind, x, norm(x, (W,), w, eps=EPS, backend=backend), x, None, w, None
    for kind in ("layer", "rms"):
        w = (torch.rand(D, generator=g) + 0.5).to(DEV).requires_grad_()
        b = torch.randn(D, generator=g).to(DEV).requires_grad_() if kind == "layer" else None
        x = rows(mag, dtype, g).requires_grad_()
        pb = {"bias": b} if kind == "layer" else {}
        norm = AF.layer_norm if kind == "layer" else AF.rms_norm
        yield "norm", kind, x, norm(x, (D,), w, eps=EPS, backend=backend, **pb), x, None, w, b
        x, r = rows(mag, dtype, g).requires_grad_(), small().requires_grad_()
        add = AF.add_layer_norm if kind == "layer" else AF.add_rms_norm
        y, s = add(x, r, (D,), w, eps=EPS, backend=backend, **pb)
        yield "add_norm", kind, x, y, s, None, w, b
        x, r = rows(mag, dtype, g).requires_grad_(), small()
        na = layer_norm_add if kind == "layer" else rms_norm_add
        yield "norm_add", kind, x, na(x, r, (D,), w, eps=EPS, backend=backend, **pb), x, r, w, b
        x, x2, r = rows(mag, dtype, g).requires_grad_(), small(), small()
        par = parallel_add_layer_norm if kind == "layer" else parallel_add_rms_norm
        y, _, s = par(x, x2, r, (D,), w, eps=EPS, backend=backend, **pb)
        yield "parallel", kind, x, y, s, None, w, b


def run(backend, device="cpu"):
    """{case: error} for every case whose error is above its tolerance"""
    global DEV
    DEV = device
    bad, n = {}, 0
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        mags = (1e19, 1e30, 3e38) if dtype != torch.float16 else (6e4,)
        for mag in mags:
            for name, kind, x, y, s, post, w, b in cases(backend, dtype, mag, g):
                key = f"{name} {kind} {dtype} {mag:g}"
                s64 = oracle._f64(s)
                norm = (oracle.layer_norm(s64, w, b, EPS) if kind == "layer" else oracle.rms_norm(s64, w, EPS))
                want = norm if post is None else norm + oracle._f64(post)
                dy = torch.randn(y.shape, generator=g).to(y.device, y.dtype)
                w.grad = None
                y.backward(dy)
                if kind == "layer":
                    dx, dw, _ = oracle.layer_norm_backward(dy, s64, w, EPS)
                else:
                    dx, dw = oracle.rms_norm_backward(dy, s64, w, EPS)[:2]
                # bf16 outputs and gradients carry one bf16 rounding each, whose scale is the row's (x.grad's per
                # row: a row of one huge value has gradients 1e19 times another's)
                for part, got, ref in (("y", y, want), ("dw", w.grad, dw)):
                    e = err(got, ref)
                    n += 1
                    if not e <= TOL[dtype]:
                        bad[f"{key} {part}"] = e
                for i in range(x.shape[0]):
                    e = err(x.grad[i], dx[i])
                    n += 1
                    if not e <= TOL[dtype]:
                        bad[f"{key} dx row {i}"] = e
    return bad, n
'''

SCRIPT = CHECK + r'''
import json, sys
bad, n = run("cpu")
print(json.dumps({"bad": bad, "n": n, "isa": __import__("addnorm").cpu_kernel_availability().isa}))
'''


def _run_isa(isa):
    env = dict(os.environ, ADDNORM_CPU_ISA=isa,
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not addnorm.cpu_kernel_availability().available, reason="the CPU kernels are not built")
@pytest.mark.parametrize("isa", ["native", "avx512", "avx2", "baseline"])
def test_cpu_kernels_give_the_float64_answer_for_huge_rows(isa):
    res = _run_isa(isa)
    assert res["n"] > 350, res
    assert not res["bad"], (res["isa"], res["bad"])


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.skipif(not TRITON,
                                                                                             reason=NO_TRITON))])
def test_other_backends_give_the_float64_answer_for_huge_rows(backend):
    ns = {}
    exec(compile(CHECK, "huge_rows_check", "exec"), ns)
    bad, n = ns["run"](backend)
    assert n > 350
    assert not bad, bad


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (the interpreter runs the "
                    "Triton kernels on CPU tensors above)")
@pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)
def test_triton_on_a_gpu_gives_the_float64_answer_for_huge_rows():
    from addnorm.kernels.triton import availability

    assert not availability().interpreted, "TRITON_INTERPRET is set: this check is of the compiled kernels"
    ns = {}
    exec(compile(CHECK, "huge_rows_check", "exec"), ns)
    bad, n = ns["run"]("triton", "cuda")
    assert n > 350
    assert not bad, bad
