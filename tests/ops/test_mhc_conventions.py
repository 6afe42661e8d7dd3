"""mhc_pre with a model's own convention (``MhcConvention``): DeepSeek-V4's hyper-connection on the same operator,
against the float64 transcription of HF's code (``reference.deepseek_v4_streams``) and HF's module itself; the
paper's convention unchanged; gradients both ways; bad conventions refused by name."""

import math

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import addnorm
from addnorm.functional import MhcConvention, ProjectedGates, hyper_read, mhc_pre
from addnorm.reference import deepseek_v4_streams as dsv4
from tests.backends import BACKENDS, KERNELS

N, C = 4, 24
RMS_EPS, HC_EPS = 1e-6, 1e-6
TOL = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2}
COEFFS = ("a_pre", "a_post", "a_res", "b_pre", "b_post", "b_res")


def _params(seed=0, dtype=torch.float64, lead=(2, 3), C=C):
    """(x, fn, base, scale) in HF's layout: fn (m, nC) with its rows [pre, post, comb]."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x = rnd(*lead, N, C) * 1.5 + 0.2
    fn = rnd((2 + N) * N, N * C) / math.sqrt(N * C)
    base = 0.5 * rnd((2 + N) * N)
    scale = torch.tensor([0.9, 1.1, 1.4], dtype=torch.float64)
    return [x.to(dtype), fn.float(), base.float(), scale.float()]


def _op(x, fn, base, scale, backend=None, iters=20, convention=None, eps=RMS_EPS):
    """DeepSeek-V4's read on mhc_pre: phi is fn^T, the coefficients views of base and scale."""
    conv = convention if convention is not None else MhcConvention.deepseek_v4(HC_EPS)
    return mhc_pre(x, fn.t(), scale[0], scale[1], scale[2], base[:N], base[N:2 * N], base[2 * N:].reshape(N, N),
                   eps=eps, iters=iters, convention=conv, backend=backend)


def _reference(x, fn, base, scale, iters=20):
    """(h, H_pre-free outputs): the transcription's (collapsed, post, comb^T), comb^T being the H_res of H_res X."""
    post, comb, collapsed = dsv4.hyper_connection(x, fn, base, scale, RMS_EPS, HC_EPS, iters)
    return collapsed, post, comb.transpose(-1, -2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_deepseek_v4_convention_matches_the_transcription_both_ways(dtype, backend):
    ins = [t.requires_grad_() for t in _params(dtype=dtype)]
    h, _, h_post, h_res = _op(*ins, backend=backend)
    want = _reference(*ins)
    assert h.dtype == dtype and h_res.dtype == torch.float32
    tol = TOL[dtype]
    for name, a, e in zip(("h", "H_post", "H_res"), (h, h_post, h_res), want, strict=True):
        torch.testing.assert_close(a.double(), e, atol=tol * 4 if name == "h" else 2e-5, rtol=tol, msg=name)
    g = torch.Generator().manual_seed(1)
    cots = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in (h, h_post, h_res)]
    got = torch.autograd.grad(sum((o.double() * c).sum() for o, c in zip((h, h_post, h_res), cots)), ins)
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    exp = torch.autograd.grad(sum((o * c).sum() for o, c in zip(_reference(*ins64), cots)), ins64)
    for name, a, e in zip(("x", "fn", "base", "scale"), got, exp, strict=True):
        scale = 1 + e.abs().max().item()
        torch.testing.assert_close(a.double(), e, atol=tol * 8 * scale, rtol=tol * 4, msg=name)


def test_deepseek_v4_convention_reproduces_hfs_module_in_float32():
    T = pytest.importorskip("transformers")
    if not hasattr(T, "DeepseekV4Config"):
        pytest.skip(f"transformers {T.__version__} has no DeepSeek-V4")
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

    hc = DeepseekV4HyperConnection(T.DeepseekV4Config(hidden_size=C, hc_mult=N, hc_sinkhorn_iters=20,
                                                      hc_eps=HC_EPS, rms_norm_eps=RMS_EPS))
    x, fn, base, scale = _params(dtype=torch.float32)
    with torch.no_grad():
        hc.fn.copy_(fn), hc.base.copy_(base), hc.scale.copy_(scale)
    post, comb, collapsed = hc(x)
    h, _, h_post, h_res = _op(x, hc.fn, hc.base, hc.scale)
    torch.testing.assert_close(h, collapsed, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(h_post, post, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(h_res, comb.transpose(-1, -2), atol=1e-6, rtol=1e-5)
    # the gradients reach HF's own parameters, as HF's do
    y = torch.randn(collapsed.shape)
    got = torch.autograd.grad((h * y).sum() + h_res.sum() * 0.5 + (h_post ** 2).sum(), [hc.fn, hc.base, hc.scale])
    exp = torch.autograd.grad((collapsed * y).sum() + comb.sum() * 0.5 + (post ** 2).sum(), [hc.fn, hc.base, hc.scale])
    for a, e in zip(got, exp, strict=True):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["op", "torch"])
def test_gradcheck_and_gradgradcheck_float64(backend):
    ins = [t.detach().double().requires_grad_() for t in _params(lead=(2,), C=2)]
    conv = MhcConvention(pre_eps=0.01, sinkhorn_eps=0.05, res_transposed=True)  # large: every eps term shows

    def f(x, fn, base, scale):
        if backend == "op":
            return torch.ops.addnorm.mhc_pre(x, fn.t(), scale[0], scale[1], scale[2], base[:N], base[N:2 * N],
                                             base[2 * N:].reshape(N, N), None, RMS_EPS, 5, 0.01, 0.05, True)[:4]
        return _op(x, fn, base, scale, backend="torch", iters=5, convention=conv)

    assert torch.autograd.gradcheck(f, ins, fast_mode=True)
    assert torch.autograd.gradgradcheck(f, ins, fast_mode=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_ad_matches_the_transcription(backend):
    prim = [t.detach() for t in _params(dtype=torch.float32, lead=(3,))]
    g = torch.Generator().manual_seed(3)
    tans = [torch.randn(p.shape, generator=g) for p in prim]
    with fwAD.dual_level():
        d = [fwAD.make_dual(p, t) for p, t in zip(prim, tans, strict=True)]
        h, _, h_post, h_res = _op(*d, backend=backend)
        got = [fwAD.unpack_dual(t).tangent for t in (h, h_post, h_res)]
    _, jv = torch.func.jvp(lambda *a: tuple(t.float() for t in _reference(*a)), tuple(prim), tuple(tans))
    for a, e in zip(got, jv, strict=True):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_opcheck_with_a_convention():
    x, fn, base, scale = [t.detach() for t in _params(dtype=torch.float32)]
    args = (x, fn.t().contiguous(), scale[0], scale[1], scale[2], base[:N], base[N:2 * N], base[2 * N:].reshape(N, N),
            None, RMS_EPS, 20, HC_EPS, HC_EPS, True)
    torch.library.opcheck(torch.ops.addnorm.mhc_pre.default, args)
    _, _, _, _, p, rstd, state = torch.ops.addnorm.mhc_pre(*args)
    g = torch.Generator().manual_seed(2)
    grads = [torch.randn(2, 3, C, generator=g), None, torch.randn(2, 3, N, generator=g),
             torch.randn(2, 3, N, N, generator=g)]
    torch.library.opcheck(torch.ops.addnorm.mhc_pre_backward.default,
                          (*grads, *args[:9], p, rstd, state, RMS_EPS, 20, HC_EPS, HC_EPS, True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_papers_convention_is_the_default_bit_for_bit(backend):
    x, fn, base, scale = _params(dtype=torch.float32)
    args = (x, fn.t(), scale[0], scale[1], scale[2], base[:N], base[N:2 * N], base[2 * N:].reshape(N, N))
    default = mhc_pre(*args, backend=backend)
    paper = mhc_pre(*args, convention=MhcConvention(), backend=backend)
    assert MhcConvention().is_paper and not MhcConvention.deepseek_v4(HC_EPS).is_paper
    for a, b in zip(default, paper, strict=True):
        assert torch.equal(a, b)


def test_each_field_changes_what_it_says():
    """pre_eps shifts H_pre by eps exactly; sinkhorn_eps and res_transposed change H_res alone."""
    x, fn, base, scale = _params()
    paper = _op(x, fn, base, scale, backend="torch", convention=MhcConvention())
    pre = _op(x, fn, base, scale, backend="torch", convention=MhcConvention(pre_eps=0.25))
    torch.testing.assert_close(pre[1], paper[1] + 0.25)
    torch.testing.assert_close(pre[0], paper[0] + 0.25 * x.sum(-2))
    for conv in (MhcConvention(sinkhorn_eps=1e-2), MhcConvention(res_transposed=True)):
        other = _op(x, fn, base, scale, backend="torch", convention=conv)
        assert torch.equal(other[2], paper[2]) and torch.equal(other[1], paper[1])
        assert (other[3] - paper[3]).abs().max() > 1e-4, conv


@pytest.mark.parametrize("backend", KERNELS)
def test_the_c_kernels_take_the_convention_the_triton_ones_decline_it(backend):
    """The C kernels compute a model's convention themselves (last_backend says cpu); the Triton kernels compute
    the paper's only, so another one runs on the formulas (and says so)."""
    x, fn, base, scale = _params(dtype=torch.float32)
    got = _op(x, fn, base, scale, backend=backend)
    ran = addnorm.last_backend()
    formulas = _op(x, fn, base, scale, backend="torch")
    if backend == "cpu":
        assert ran == "cpu"
        for a, b in zip(got, formulas, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    else:
        assert ran == "torch"
        for a, b in zip(got, formulas, strict=True):
            assert torch.equal(a, b)


KEPT_SCRIPT = r"""
import sys, torch, addnorm
ins, convs, grads, eps, iters = torch.load(sys.argv[1])
op, bwd = torch.ops.addnorm.mhc_pre, torch.ops.addnorm.mhc_pre_backward
res = []
for conv in convs:
    *_, p, rstd, state = op(*ins, None, eps, iters, *conv)
    run = lambda st: bwd(*grads, *ins, None, p, rstd, st, eps, iters, *conv)  # noqa: E731
    res.append({"state": state, "kept": run(state), "empty": run(state[..., :0]), "wrong": run(state[..., 1:])})
torch.save({"isa": addnorm.cpu_kernel_availability().isa, "res": res}, sys.argv[2])
"""


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
@pytest.mark.parametrize("isa", ["avx2", "native"])
def test_the_rounds_the_forward_keeps_are_the_conventions(tmp_path, isa):
    """The CPU forward keeps Sinkhorn-Knopp's rounds (state) for its backward: with a convention they must be that
    convention's (res_eps in every sum, the logits transposed), or a backward reading them would differ from one
    that runs them again. DeepSeek-V4's convention, and one whose eps terms are large: the backward reading the
    kept rounds gives the gradients of the one handed no rounds (an empty state, or one of the wrong shape) bit for
    bit, on each instruction set path (ADDNORM_CPU_ISA, read once per process); the kept rounds are the formulas'
    (float64) to float32 rounding, and so are the gradients."""
    import os
    import subprocess
    import sys

    from addnorm.ops.mhc import formulas as mf

    iters = 20
    x, fn, base, scale = [t.detach() for t in _params(dtype=torch.float32, lead=(37,), C=67)]
    ins = [x, fn.t().contiguous(), scale[0], scale[1], scale[2], base[:N], base[N:2 * N], base[2 * N:].reshape(N, N)]
    ds = MhcConvention.deepseek_v4(HC_EPS)
    convs = [(ds.pre_eps, ds.sinkhorn_eps, ds.res_transposed), (0.01, 0.05, True)]
    g = torch.Generator().manual_seed(4)
    grads = [torch.randn(37, 67, generator=g), torch.randn(37, N, generator=g), torch.randn(37, N, generator=g),
             torch.randn(37, N, N, generator=g)]
    torch.save((ins, convs, grads, RMS_EPS, iters), tmp_path / "in.pt")
    env = dict(os.environ)
    env.pop("ADDNORM_CPU_ISA", None)
    if isa != "native":
        env["ADDNORM_CPU_ISA"] = isa
    subprocess.run([sys.executable, "-c", KEPT_SCRIPT, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")], env=env,
                   check=True, timeout=300)
    got = torch.load(tmp_path / "out.pt")
    assert isa == "native" or got["isa"] == "avx2+fma+f16c"
    ins64 = [t.double() for t in ins]
    paper_state = torch.ops.addnorm.mhc_pre(*ins64, None, RMS_EPS, iters)[6]
    for conv, res in zip(convs, got["res"], strict=True):
        assert res["state"].shape == (37, (1 + iters) * N * N + 2 * iters * N)
        for name, k, e, w in zip(("dx", "dphi", *COEFFS), res["kept"], res["empty"], res["wrong"], strict=True):
            assert torch.equal(k, e) and torch.equal(k, w), f"{conv} {name}"
        want_state = torch.ops.addnorm.mhc_pre(*ins64, None, RMS_EPS, iters, *conv)[6]  # the formulas' rounds
        torch.testing.assert_close(res["state"].double(), want_state, atol=1e-6, rtol=1e-5, msg=str(conv))
        assert (want_state - paper_state).abs().max() > 1e-3  # the convention is in the rounds
        want = mf.pre_backward(*[t.double() for t in grads], *ins64, None, RMS_EPS, iters, *conv)
        for name, a, e in zip(("dx", "dphi", *COEFFS), res["kept"], want, strict=True):
            torch.testing.assert_close(a.double(), e, atol=2e-5 * (1 + e.abs().max().item()), rtol=1e-4,
                                       msg=f"{conv} {name}")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(convention="deepseek"), TypeError, "convention must be an addnorm.functional.MhcConvention"),
    (dict(convention=MhcConvention.deepseek_v4(1e-6), perms=torch.eye(4)[None]), ValueError,
     "perms .mHC-lite. mixes permutations"),
])
def test_bad_conventions_are_refused_naming_the_argument(kwargs, error, match):
    x, fn, base, scale = _params(dtype=torch.float32)
    args = (x, fn.t(), scale[0], scale[1], scale[2], base[:N], base[N:2 * N], base[2 * N:].reshape(N, N))
    with pytest.raises(error, match=match):
        mhc_pre(*args, **kwargs)


@pytest.mark.parametrize("fields, match", [
    (dict(pre_eps=-1e-6), "MhcConvention.pre_eps must be a finite non-negative float"),
    (dict(sinkhorn_eps=float("inf")), "MhcConvention.sinkhorn_eps must be"),
    (dict(pre_eps=True), "MhcConvention.pre_eps must be"),
    (dict(res_transposed=1), "MhcConvention.res_transposed must be a bool"),
])
def test_a_convention_with_bad_fields_is_refused(fields, match):
    with pytest.raises((TypeError, ValueError), match=match):
        MhcConvention(**fields)



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_deepseeks_final_collapse_is_hyper_reads_head(dtype):
    """DeepSeek-V4's hyper head (its own projection hc_fn (n, nC), one scale, + eps) is the head form of HY-V4's
    read (``hyper_read`` with weight (n, nC)): the model's final collapse runs on that operator."""
    x, fn, base, scale = _params(dtype=dtype)
    ins = [x.requires_grad_(), fn[:N].clone().requires_grad_(), base[:N].clone().requires_grad_(),
           scale[:1].clone().requires_grad_()]
    h, _, h_post = hyper_read(ins[0], ins[1], ins[3], ins[2], convention=ProjectedGates(RMS_EPS, pre_eps=1e-3))
    assert h.dtype == dtype and h_post.shape[-1] == 0
    want = dsv4.hyper_head(*ins[:2], ins[2], ins[3], RMS_EPS, 1e-3)
    tol = TOL[dtype]
    torch.testing.assert_close(h.double(), want, atol=tol * 4, rtol=tol)
    cot = torch.randn(h.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    got = torch.autograd.grad((h.double() * cot).sum(), ins)
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    exp = torch.autograd.grad((dsv4.hyper_head(*ins64, RMS_EPS, 1e-3) * cot).sum(), ins64)
    for name, a, e in zip(("x", "hc_fn", "hc_base", "hc_scale"), got, exp, strict=True):
        torch.testing.assert_close(a.double(), e, atol=tol * 8 * (1 + e.abs().max().item()), rtol=tol * 4, msg=name)
