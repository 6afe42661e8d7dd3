"""mHC's pre-step Triton kernels (``kernels.triton.mhc``) in Triton's interpreter, against the spec
(``addnorm.ops.mhc.formulas.pre``) in float64: the forward outputs, and the backward's dx, dlogits and dphi
from torch.autograd on the spec (dlogits as the gradient of a per-token bias: logit = scal * p + bias); and the
kernels compiled for sm_80 and sm_90 without a GPU."""

import itertools
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from addnorm.kernels.triton import mhc as T
from addnorm.ops.mhc.formulas import pre
from backends import HAVE_TRITON, NO_TRITON, TRITON

pytestmark = pytest.mark.skipif(not TRITON, reason=NO_TRITON if not HAVE_TRITON else
                                "a GPU is present: the kernels are compiled, not interpreted (test_triton_cuda)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EPS = 1e-6


def _case(lead, n, C, dtype, lite, seed=0):
    g = torch.Generator().manual_seed(seed)
    perms = list(itertools.permutations(range(n))) if lite else None
    r = len(perms) if lite else n * n
    m = 2 * n + r
    x = (torch.randn(*lead, n, C, generator=g) * 1.5 + 0.2).to(dtype)
    phi = torch.randn(n * C, m, generator=g) / (n * C) ** 0.5
    scal = torch.tensor([0.8, 1.3, 1.7])
    bias = 0.5 * torch.randn(m, generator=g)
    perm_idx = torch.tensor(perms, dtype=torch.int32) if lite else None
    mats = None
    if lite:
        mats = torch.zeros(r, n, n, dtype=torch.float64)
        for k, p in enumerate(perms):
            mats[k, torch.arange(n), torch.tensor(p)] = 1.0
    grads = (torch.randn(*lead, C, generator=g).to(dtype), torch.randn(*lead, n, generator=g),
             torch.randn(*lead, n, generator=g), torch.randn(*lead, n, n, generator=g))
    return x, phi, scal, bias, perm_idx, mats, grads


def _reference(x, phi, scal, bias, mats, iters, grads):
    """The spec's outputs in float64, and the gradients (dx, dlogits, dphi) by autograd: the spec taken per
    token (vmap) with a per-token bias, whose gradient is the pre-activations'."""
    n, C = x.shape[-2:]
    lead, m = x.shape[:-2], phi.shape[1]
    xf = x.double().reshape(-1, n, C)
    N = xf.shape[0]
    a = scal.double()
    b = bias.double().expand(N, m)
    bp, bq, br = b[:, :n], b[:, n:2 * n], b[:, 2 * n:]

    def one(xt, bpt, bqt, brt, ph):
        return pre(xt, ph, a[0], a[1], a[2], bpt, bqt, brt, mats, EPS, iters)

    outs, vjp = torch.func.vjp(torch.func.vmap(one, in_dims=(0, 0, 0, 0, None)), xf, bp, bq, br, phi.double())
    cot = [torch.zeros_like(o) if g is None else g.double().reshape(o.shape) for o, g in zip(outs, grads)]
    cot += [torch.zeros_like(o) for o in outs[len(grads):]]
    dx, dbp, dbq, dbr, dphi = vjp(tuple(cot))
    outs = [o.reshape(lead + o.shape[1:]) for o in outs]
    return outs, (dx.reshape(x.shape), torch.cat([dbp, dbq, dbr], -1).reshape(lead + (m,)), dphi)


def _close(ours, ref, tol, what):
    assert ours.shape == ref.shape, (what, ours.shape, ref.shape)
    scale = max(1.0, ref.abs().max().item())
    torch.testing.assert_close(ours.double(), ref, atol=tol * scale, rtol=tol, msg=lambda s: f"{what}: {s}")
    if ours.dtype in (torch.bfloat16, torch.float16):  # one rounding of a float32 value: nearly all exact
        same = (ours == ref.to(ours.dtype)).double().mean().item()
        assert same > 0.9, f"{what}: only {same:.0%} of the values are the reference's correctly rounded"


def _check(lead, n, C, dtype, lite, iters=4, drop=(), seed=0):
    x, phi, scal, bias, perm_idx, mats, grads = _case(lead, n, C, dtype, lite, seed)
    grads = tuple(None if k in drop else g for k, g in enumerate(grads))
    assert T.applies(x, phi.shape[1], iters)
    outs = T.mhc_pre(x, phi, scal, bias, perm_idx, EPS, iters)
    ref_outs, ref_grads = _reference(x, phi, scal, bias, mats, iters, grads)
    low = dtype != torch.float32
    assert outs[0].dtype == dtype and all(o.dtype == torch.float32 for o in outs[1:])
    for k, (o, r, name) in enumerate(zip(outs, ref_outs, ("h", "h_pre", "h_post", "h_res", "p", "rstd"))):
        _close(o, r, 8e-3 if low and k == 0 else 2e-5, name)
    h, h_pre, h_post, h_res, p, rstd, state = outs
    assert state.shape == x.shape[:-2] + (0,)  # the kernels recompute the rounds on chip: nothing kept
    dx, dlogits, dphi = T.mhc_pre_backward(*grads, x, phi, scal, bias, perm_idx, p, rstd, state, iters)
    assert dx.dtype == dtype and dlogits.dtype == dphi.dtype == torch.float32
    _close(dx, ref_grads[0], 8e-3 if low else 5e-5, "dx")
    _close(dlogits, ref_grads[1], 5e-5, "dlogits")
    _close(dphi, ref_grads[2], 5e-5, "dphi")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "lite"])
@pytest.mark.parametrize("n,C", [(1, 8), (2, 33), (4, 8), (4, 33)])
def test_pre_forward_and_backward_match_the_spec(n, C, lite, dtype):
    _check((2, 3), n, C, dtype, lite)


@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "lite"])
def test_many_tokens_several_tiles_and_splits_of_dphi(lite):
    """37 tokens: three tiles of 16, phi's gradient summed over two splits; C spans two chunks of 64."""
    _check((37,), 4, 70, torch.float32, lite, seed=1)


@pytest.mark.parametrize("drop", [(0,), (1, 2), (3,), (0, 1, 2)], ids=str)
def test_absent_gradients_read_as_zero(drop):
    _check((2, 3), 4, 8, torch.float32, False, drop=drop, seed=2)
    _check((5,), 2, 8, torch.float32, True, drop=drop, seed=3)


@pytest.mark.parametrize("iters", [0, 1, 20])
def test_sinkhorn_rounds(iters):
    """No round (exp of the shifted logits), one, and mHC's 20: the backward through every one."""
    _check((2, 3), 4, 8, torch.float32, False, iters=iters, seed=4)


def test_float16_streams():
    _check((2, 3), 2, 33, torch.float16, False, seed=5)


def test_no_tokens():
    x, phi, scal, bias, perm_idx, _, _ = _case((0,), 4, 8, torch.float32, False)
    h, h_pre, h_post, h_res, p, rstd, state = T.mhc_pre(x, phi, scal, bias, perm_idx, EPS, 4)
    assert h.shape == (0, 8) and h_res.shape == (0, 4, 4) and p.shape == (0, 24) and rstd.shape == (0,)
    dx, dlogits, dphi = T.mhc_pre_backward(torch.zeros(0, 8), None, None, torch.zeros(0, 4, 4), x, phi, scal, bias,
                                           perm_idx, p, rstd, state, 4)
    assert dx.shape == x.shape and dlogits.shape == (0, 24)
    assert torch.equal(dphi, torch.zeros(32, 24))


def test_applies():
    x = torch.randn(3, 4, 8)
    assert T.applies(x, 24) and T.applies(x, 24, 64) and T.applies(x.bfloat16(), 32)
    assert not T.applies(x.double(), 24)
    assert not T.applies(torch.randn(3, 9, 8), 2 * 9 + 81)  # n > 8
    assert not T.applies(torch.randn(3, 4, 0), 24)  # C = 0
    assert not T.applies(torch.randn(8), 24)
    assert not T.applies(x, 130)  # m > 128 (mHC-lite at n = 5)
    assert not T.applies(x, 24, 65)


def test_dphi_is_deterministic_and_close_under_another_split(monkeypatch):
    x, phi, scal, bias, perm_idx, _, grads = _case((50,), 2, 8, torch.float32, False, seed=6)
    p, rstd, state = T.mhc_pre(x, phi, scal, bias, perm_idx, EPS, 3)[4:]
    runs = []
    for splits in (2, 2, 1, 4):
        monkeypatch.setattr(T, "_INTERPRETER_SPLITS", splits)
        runs.append(T.mhc_pre_backward(*grads, x, phi, scal, bias, perm_idx, p, rstd, state, 3)[2])
    assert torch.equal(runs[0], runs[1])
    for other in runs[2:]:
        torch.testing.assert_close(other, runs[0], atol=1e-5, rtol=1e-5)


COMPILE = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from addnorm.kernels.triton.jit import mhc as K

def compile(fn, sig, const, cc, warps=4):
    sig = dict(sig, **{k: "constexpr" for k in const})
    return triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", cc, 32),
                          options={"num_warps": warps})

FWD = dict(X="*bf16", PHI="*fp32", SCAL="*fp32", BIAS="*fp32", PERM="*i32", H="*bf16", HPRE="*fp32",
           HPOST="*fp32", HRES="*fp32", P="*fp32", RSTD="*fp32", N="i32", C="i32", m="i32", eps="fp32",
           iters="i32")
BWD = dict(DH="*bf16", DHPRE="*fp32", DHPOST="*fp32", DHRES="*fp32", X="*bf16", PHI="*fp32", SCAL="*fp32",
           BIAS="*fp32", PERM="*i32", P="*fp32", RSTD="*fp32", DX="*bf16", DL="*fp32", N="i32", C="i32", m="i32",
           iters="i32")
DPHI = dict(X="*bf16", DL="*fp32", SCAL="*fp32", RSTD="*fp32", DPHIP="*fp32", N="i32", K="i32", m="i32",
            tokens_per_split="i32")
for cc in (80, 90):
    for lite, m, rb in ((False, 24, 1), (True, 32, 32)):  # n = 4: mHC, m = 24; mHC-lite, m = 32
        shape = dict(NS=4, NB=4, RB=rb, MB=32, LITE=lite, BT=16)
        compile(K.mhc_pre_fwd, FWD, dict(shape, BK=32, BC=32, RNE=False), cc)
        compile(K.mhc_pre_bwd, BWD, dict(shape, HAS_DH=True, HAS_DPRE=lite, HAS_DPOST=True, HAS_DRES=True, BC=32,
                                         RNE=False), cc)
    compile(K.mhc_pre_dphi, DPHI, dict(NS=4, MB=32, BT=16, BK=32), cc)
# the largest: n = 8, m = 80 held as 128 columns, on 8 warps
compile(K.mhc_pre_fwd, FWD, dict(NS=8, NB=8, RB=1, MB=128, LITE=False, BT=16, BK=32, BC=32, RNE=False), 90, 8)
compile(K.mhc_pre_bwd, BWD, dict(NS=8, NB=8, RB=1, MB=128, LITE=False, BT=16, HAS_DH=True, HAS_DPRE=False,
                                 HAS_DPOST=True, HAS_DRES=True, BC=32, RNE=False), 90, 8)
compile(K.mhc_pre_dphi, DPHI, dict(NS=8, MB=128, BT=16, BK=32), 90, 8)
print("compiled")
"""


def test_mhc_kernels_compile_for_nvidia_gpus_without_one():
    """The interpreter accepts code a GPU compiler rejects: the forward, backward and phi's gradient with bfloat16
    streams, mHC and mHC-lite at n = 4 for sm_80 and sm_90, and mHC at n = 8 (the widest tiles) for sm_90."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(COMPILE)], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert p.returncode == 0 and "compiled" in p.stdout, p.stderr[-3000:]
