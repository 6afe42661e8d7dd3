"""mhc_pre with a model's own convention (``MhcConvention``): DeepSeek-V4's hyper-connection on the same operator,
against the float64 transcription of HF's code (``reference.deepseek_v4_streams``) and HF's module itself; the
paper's convention unchanged; gradients both ways; bad conventions refused by name."""

import math

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import addnorm
from addnorm.functional import MhcConvention, ProjectedGates, hyper_read, hyper_write_read, mhc_pre, mhc_write_pre
from addnorm.ops import native_nodes
from addnorm.ops.mhc import formulas as mhc_formulas
from addnorm.ops.stream import formulas as stream_formulas
from addnorm.reference import deepseek_v4_streams as dsv4
from tests.backends import BACKENDS, KERNELS
from tests.isa_paths import run_under_every_isa, run_under_isa

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


def _groups_args(x, fn, base, scale, groups=3):
    """mhc_pre's arguments for the first ``groups`` maps of DeepSeek's projection (rows [pre, post, comb]): phi is
    fn^T, the coefficients views of base and scale."""
    m = {1: N, 2: 2 * N, 3: (2 + N) * N}[groups]
    b_post = base[N:2 * N] if groups > 1 else base[:0]
    b_res = base[2 * N:].reshape(N, N) if groups > 2 else base[:0]
    return (x, fn[:m].t(), scale[0], scale[1], scale[2], base[:N], b_post, b_res)


def _op(x, fn, base, scale, backend=None, iters=20, convention=None, eps=RMS_EPS):
    """DeepSeek-V4's read on mhc_pre."""
    conv = convention if convention is not None else MhcConvention.deepseek_v4(HC_EPS)
    return mhc_pre(*_groups_args(x, fn, base, scale), eps=eps, iters=iters, convention=conv, backend=backend)


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
    args = _groups_args(*_params(dtype=torch.float32))
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
    that runs them again. DeepSeek-V4's convention, one whose eps terms are large, and that one with H_post's own
    scale and eps (the kept-rounds path skips mhc_maps, so its gates must be mhc_maps'): the backward reading the
    kept rounds gives the gradients of the one handed no rounds (an empty state, or one of the wrong shape) bit for
    bit, on each instruction set path (ADDNORM_CPU_ISA, read once per process); the kept rounds are the formulas'
    (float64) to float32 rounding, and so are the gradients."""
    from addnorm.ops.mhc import formulas as mf

    iters = 20
    x, fn, base, scale = [t.detach() for t in _params(dtype=torch.float32, lead=(37,), C=67)]
    ins = [x, fn.t().contiguous(), scale[0], scale[1], scale[2], base[:N], base[N:2 * N], base[2 * N:].reshape(N, N)]
    ds = MhcConvention.deepseek_v4(HC_EPS)
    convs = [(ds.pre_eps, ds.sinkhorn_eps, ds.res_transposed), (0.01, 0.05, True),
             MhcConvention(pre_eps=0.01, sinkhorn_eps=0.05, res_transposed=True, post_scale=1.5, post_eps=0.02).fields]
    g = torch.Generator().manual_seed(4)
    grads = [torch.randn(37, 67, generator=g), torch.randn(37, N, generator=g), torch.randn(37, N, generator=g),
             torch.randn(37, N, N, generator=g)]
    torch.save((ins, convs, grads, RMS_EPS, iters), tmp_path / "in.pt")
    got = run_under_isa(KEPT_SCRIPT, isa, tmp_path / "out.pt", tmp_path / "in.pt")
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
    with pytest.raises(error, match=match):
        mhc_pre(*_groups_args(*_params(dtype=torch.float32)), **kwargs)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(convention=MhcConvention(groups=2), perms=torch.eye(4)[None]), ValueError,
     r"makes no H_res \(groups=2\), but perms"),
    (dict(convention=MhcConvention(groups=2)), ValueError, r"phi must have shape \(96, 8\) \(nC, 2n \(groups=2\)\)"),
])
def test_a_convention_without_h_res_refuses_its_arguments(kwargs, error, match):
    x, fn, base, scale = _params(dtype=torch.float32)
    args = _groups_args(x, fn, base, scale)
    with pytest.raises(error, match=match):
        mhc_pre(*args, **kwargs)
    with pytest.raises(ValueError, match=r"b_res must have 0 elements \(groups=2 makes no H_res\)"):
        mhc_pre(x, fn[:2 * N].t(), *args[2:], convention=MhcConvention(groups=2))


@pytest.mark.parametrize("fields, match", [
    (dict(post_scale=float("inf")), "MhcConvention.post_scale must be a finite float"),
    (dict(post_eps="0"), "MhcConvention.post_eps must be a finite float"),
    (dict(groups=4), r"MhcConvention.groups must be 1 \(H_pre\), 2 \(H_pre, H_post\) or 3"),
    (dict(groups=True), "MhcConvention.groups must be"),
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


@pytest.mark.parametrize("backend", BACKENDS)
def test_post_scale_post_eps_and_groups_change_what_they_say(backend):
    """H_post = post_scale sigmoid + post_eps; groups 2 drops H_res (its columns of phi and b_res), groups 1 H_post
    too, every other output the same on each backend."""
    x, fn, base, scale = _params(dtype=torch.float32)
    full = mhc_pre(*_groups_args(x, fn, base, scale, 3), convention=MhcConvention(pre_eps=0.1), backend=backend)
    post = mhc_pre(*_groups_args(x, fn, base, scale, 3), convention=MhcConvention(pre_eps=0.1, post_scale=1.5,
                                                                                  post_eps=-0.25), backend=backend)
    torch.testing.assert_close(post[2], full[2] * 0.75 - 0.25, atol=1e-6, rtol=1e-6)
    assert all(torch.equal(a, b) for i, (a, b) in enumerate(zip(post, full)) if i != 2)
    for groups in (2, 1):
        got = mhc_pre(*_groups_args(x, fn, base, scale, groups), convention=MhcConvention(pre_eps=0.1, groups=groups),
                      backend=backend)
        assert got[3].shape == x.shape[:-2] + (0, 0)
        assert got[2].shape == x.shape[:-2] + ((N,) if groups == 2 else (0,))
        for a, b in ((got[0], full[0]), (got[1], full[1])) + (((got[2], full[2]),) if groups == 2 else ()):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("backend", ["op", "torch"])
def test_gradcheck_without_h_res(backend, groups):
    x, fn, base, scale = [t.detach().double().requires_grad_() for t in _params(lead=(2,), C=2)]
    conv = MhcConvention(pre_eps=0.01, post_scale=1.5, post_eps=0.02, groups=groups)

    def f(x, fn, base, scale):
        args = _groups_args(x, fn, base, scale, groups)
        if backend == "op":
            return torch.ops.addnorm.mhc_pre(*args, None, RMS_EPS, 0, *conv.fields)[:3]
        return mhc_pre(*args, eps=RMS_EPS, convention=conv, backend="torch")[:3]

    assert torch.autograd.gradcheck(f, [x, fn, base, scale], fast_mode=True)
    assert torch.autograd.gradgradcheck(f, [x, fn, base, scale], fast_mode=True)


def _write_inputs(dtype, lead=(2, 3), C=C, seed=5):
    """(y, post, comb) of the sub-layer before: HF's comb (its H_res^T), doubly stochastic."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(*lead, C, generator=g, dtype=torch.float64).to(dtype)
    post = 2 * torch.rand(*lead, N, generator=g)
    comb = torch.softmax(torch.randn(*lead, N, N, generator=g), -1)
    return y, post, comb


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("lead, C_", [((2, 3), C), ((5,), 7), ((0, 2), 16), ((), 33)])
def test_deepseek_v4s_write_and_next_read_in_one_call(lead, C_, dtype, backend):
    """mhc_write_pre: DeepSeek-V4's write post y + comb^T X and the next connection's read of the result, on one
    operator (one pass over the stream on the C kernels), against the transcription of both; gradients too."""
    x, fn, base, scale = _params(dtype=dtype, lead=lead, C=C_)
    y, post, comb = _write_inputs(dtype, lead, C_)
    ins = [t.requires_grad_() for t in (x, y, post, comb, fn, base, scale)]
    x_, y_, post_, comb_, fn_, base_, scale_ = ins
    conv = MhcConvention.deepseek_v4(HC_EPS)
    x2, h, _, h_post, h_res = mhc_write_pre(x_, y_, post_, comb_.transpose(-1, -2), fn_.t(), scale_[0], scale_[1],
                                            scale_[2], base_[:N], base_[N:2 * N], base_[2 * N:].reshape(N, N),
                                            eps=RMS_EPS, convention=conv, backend=backend)
    assert addnorm.last_backend() == ("cpu" if backend == "cpu" else "torch")
    assert x2.dtype == h.dtype == dtype

    def reference(x, y, post, comb, fn, base, scale):
        x2 = dsv4.write(x, y, post, comb)
        p2, c2, h2 = dsv4.hyper_connection(x2, fn, base, scale, RMS_EPS, HC_EPS, 20)
        return x2, h2, p2, c2.transpose(-1, -2)

    ins64 = [t.detach().double().requires_grad_() for t in ins]
    want = reference(*ins64)
    tol = TOL[dtype]
    outs = (x2, h, h_post, h_res)
    for name, a, e in zip(("x2", "h", "H_post", "H_res"), outs, want, strict=True):
        atol = tol * 8 if name in ("x2", "h") else (2e-5 if dtype == torch.float32 else tol)
        torch.testing.assert_close(a.double(), e.detach(), atol=atol, rtol=tol, msg=name)
    g = torch.Generator().manual_seed(1)
    cots = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
    got = torch.autograd.grad(sum((o.double() * c).sum() for o, c in zip(outs, cots)), ins)
    exp = torch.autograd.grad(sum((o * c).sum() for o, c in zip(want, cots)), ins64)
    for name, a, e in zip(("x", "y", "post", "comb", "fn", "base", "scale"), got, exp, strict=True):
        scale = 1 + (e.abs().max().item() if e.numel() else 0.0)
        torch.testing.assert_close(a.double(), e, atol=tol * 16 * scale, rtol=tol * 4, msg=name)


def _deepseek_write_args(dtype=torch.float64, lead=(2,), C_=2):
    x, fn, base, scale = _params(dtype=dtype, lead=lead, C=C_)
    y, post, comb = _write_inputs(dtype, lead, C_)
    return [t.detach().to(dtype if dtype == torch.float64 else t.dtype).requires_grad_()
            for t in (x, y, post, comb, fn, base, scale)]


def _op_write_pre(x, y, post, comb, fn, base, scale, iters=5, conv=MhcConvention(0.01, 0.05, True)):
    return torch.ops.addnorm.mhc_write_pre(x, y, post, comb.transpose(-1, -2), False, fn.t(), scale[0], scale[1],
                                           scale[2], base[:N], base[N:2 * N], base[2 * N:].reshape(N, N), None,
                                           RMS_EPS, iters, *conv.fields)[:5]


def test_gradcheck_and_gradgradcheck_of_the_write_and_read_operator():
    """mhc_write_pre's own autograd (the read's backward, then the write's) with a mixing matrix, float64."""
    ins = _deepseek_write_args()
    assert torch.autograd.gradcheck(_op_write_pre, ins, fast_mode=True)
    assert torch.autograd.gradgradcheck(_op_write_pre, ins, fast_mode=True)


def test_forward_ad_of_the_write_and_read_operator():
    prim = [t.detach().float() for t in _deepseek_write_args(lead=(3,), C_=8)]
    g = torch.Generator().manual_seed(3)
    tans = [torch.randn(p.shape, generator=g) for p in prim]

    def reference(x, y, post, comb, fn, base, scale):
        x2 = dsv4.write(x, y, post, comb)
        p2, c2, h2 = dsv4.hyper_connection(x2, fn, base, scale, RMS_EPS, 0.01, 20)
        return x2.float(), h2.float(), p2.float(), c2.transpose(-1, -2).float()

    conv = MhcConvention(0.01, 0.01, True)
    with fwAD.dual_level():
        d = [fwAD.make_dual(p, t) for p, t in zip(prim, tans, strict=True)]
        got = [fwAD.unpack_dual(t).tangent for t in _op_write_pre(*d, iters=20, conv=conv)]
    _, jv = torch.func.jvp(reference, tuple(prim), tuple(tans))
    for a, e in zip([got[0], got[1], got[3], got[4]], jv, strict=True):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_opcheck_of_the_write_and_read_and_of_the_groups():
    x, y, post, comb, fn, base, scale = [t.detach() for t in _deepseek_write_args(torch.float32, (2, 3), C)]
    conv = MhcConvention.deepseek_v4(HC_EPS)
    coeffs = (scale[0], scale[1], scale[2], base[:N], base[N:2 * N], base[2 * N:].reshape(N, N))
    write = (x, y, post, comb.transpose(-1, -2).contiguous(), False)
    torch.library.opcheck(torch.ops.addnorm.mhc_write_pre.default,
                          (*write, fn.t().contiguous(), *coeffs, None, RMS_EPS, 20, *conv.fields))
    x2, _, _, _, _, p, rstd = torch.ops.addnorm.mhc_write_pre(*write, fn.t().contiguous(), *coeffs, None, RMS_EPS, 20,
                                                              *conv.fields)
    g = torch.Generator().manual_seed(4)
    grads = [torch.randn(x2.shape, generator=g), torch.randn(2, 3, C, generator=g), None, None,
             torch.randn(2, 3, N, N, generator=g)]
    torch.library.opcheck(torch.ops.addnorm.mhc_write_pre_backward.default,
                          (*grads, *write, x2, fn.t().contiguous(), *coeffs, None, p, rstd, RMS_EPS, 20, *conv.fields))
    for groups in (1, 2):
        args = _groups_args(x, fn, base, scale, groups)
        fields = MhcConvention(pre_eps=1e-3, post_scale=1.5, post_eps=1e-3, groups=groups).fields
        torch.library.opcheck(torch.ops.addnorm.mhc_pre.default, (*args, None, RMS_EPS, 0, *fields))
        _, _, _, _, p, rstd, state = torch.ops.addnorm.mhc_pre(*args, None, RMS_EPS, 0, *fields)
        assert state.shape == (2, 3, 0)  # no H_res, no Sinkhorn: no rounds kept
        g = torch.Generator().manual_seed(2)
        grads = [torch.randn(2, 3, C, generator=g), torch.randn(2, 3, N, generator=g),
                 torch.randn(2, 3, N if groups > 1 else 0, generator=g), None]
        torch.library.opcheck(torch.ops.addnorm.mhc_pre_backward.default,
                              (*grads, *args, None, p, rstd, state, RMS_EPS, 0, *fields))


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_c_kernel_runs_the_mixing_write_and_read_both_ways(dtype, monkeypatch):
    """With the formulas of the write and of the read made to raise, DeepSeek-V4's write+read still runs forward
    and backward (the C kernels; its write's backward on stream_write_backward's), and the torch backend does
    reach them."""
    ins = _deepseek_write_args(dtype, (3, 4), 19)
    ins = [t.detach().to(dtype) if i < 2 else t.detach().float() for i, t in enumerate(ins)]
    ins = [t.requires_grad_() for t in ins]

    def boom(*a, **k):
        raise AssertionError("the formulas ran")

    for mod, name in ((mhc_formulas, "pre"), (mhc_formulas, "pre_backward"), (stream_formulas, "write"),
                      (stream_formulas, "write_backward")):
        monkeypatch.setattr(mod, name, boom)
    from addnorm.kernels.cpu import mhc as cpu_mhc
    from addnorm.kernels.cpu import stream as cpu_stream

    seen = []
    for mod, name in ((cpu_mhc, "mhc_pre"), (cpu_mhc, "mhc_pre_backward"), (cpu_mhc, "mhc_write_pre"),
                      (cpu_mhc, "mhc_write_pre_backward"), (cpu_stream, "stream_write"),
                      (cpu_stream, "stream_write_backward")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _real=real, _name=name: seen.append(_name) or _real(*a))
    for backend in ("cpu", "torch"):
        x, y, post, comb, fn, base, scale = ins
        call = lambda: mhc_write_pre(x, y, post, comb, fn.t(), scale[0], scale[1], scale[2], base[:N],  # noqa: E731
                                     base[N:2 * N], base[2 * N:].reshape(N, N), convention=MhcConvention.deepseek_v4(
                                         HC_EPS), backend=backend)
        if backend == "torch":
            with pytest.raises(AssertionError, match="the formulas ran"):
                call()
            continue
        outs = call()
        assert addnorm.last_backend() == "cpu"
        torch.autograd.grad(sum(o.float().sum() for o in outs), ins)
        if native_nodes.NODES is not None:  # the C++ node calls the kernels itself, not through their Python hosts
            assert type(outs[1].grad_fn).__name__ == "CppFunction" and seen == []
        else:
            assert seen == ["mhc_write_pre", "mhc_write_pre_backward"]  # one C pass each way


@pytest.mark.parametrize("edit, error, match", [
    (dict(h_res="wrong"), ValueError, r"h_res must have shape \(2, 3, 4, 4\)"),
    (dict(y="wrong"), ValueError, r"y must have shape \(2, 3, 24\)"),
    (dict(h_post="wrong"), ValueError, r"h_post must have shape \(2, 3, 4\)"),
    (dict(products=True), ValueError, r"products=True\) is a write without a mixing matrix's: pass h_res=None"),
    (dict(products="yes"), TypeError, "products must be a bool"),
    (dict(h_res="long"), TypeError, "h_res must be a floating-point tensor"),
])
def test_bad_input_to_the_write_and_read_is_named(edit, error, match):
    x, y, post, comb, fn, base, scale = [t.detach() for t in _deepseek_write_args(torch.float32, (2, 3), C)]
    kw = dict(y=y, h_post=post, h_res=comb, products=False)
    for k, v in edit.items():
        kw[k] = v if not isinstance(v, str) or k == "products" else (
            kw[k].long() if v == "long" else kw[k][..., :1])
    with pytest.raises(error, match=match):
        mhc_write_pre(x, kw["y"], kw["h_post"], kw["h_res"], fn.t(), scale[0], scale[1], scale[2], base[:N],
                      base[N:2 * N], base[2 * N:].reshape(N, N), products=kw["products"])


ISA_SCRIPT = r"""
import sys, torch, addnorm
from addnorm.functional import MhcConvention, mhc_write_pre
ins, n, hc_eps = torch.load(sys.argv[1])
res = {}
for dt in ("float32", "bfloat16"):
    ts = [t.to(getattr(torch, dt)).requires_grad_() if i < 2 else t.clone().requires_grad_()
          for i, t in enumerate(ins)]
    x, y, post, comb, fn, base, scale = ts
    outs = mhc_write_pre(x, y, post, comb.transpose(-1, -2), fn.t(), scale[0], scale[1], scale[2], base[:n],
                         base[n:2 * n], base[2 * n:].reshape(n, n), convention=MhcConvention.deepseek_v4(hc_eps),
                         backend="cpu")
    assert addnorm.last_backend() == "cpu"
    grads = torch.autograd.grad(sum(o.double().sum() * (i + 1) for i, o in enumerate(outs)), ts)
    res[dt] = [t.detach() for t in (*outs, *grads)]
torch.save({"isa": addnorm.cpu_kernel_availability().isa, "res": res}, sys.argv[2])
"""


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_every_instruction_set_path_of_the_write_and_read(tmp_path):
    """ADDNORM_CPU_ISA=baseline|avx2: DeepSeek-V4's write+read on each path, in its own process, against the
    transcription (odd C: every loop's tail)."""
    ins = [t.detach() for t in _deepseek_write_args(torch.float64, (29,), 67)]
    ins = [t if i < 2 else t.float() for i, t in enumerate(ins)]
    torch.save((ins, N, HC_EPS), tmp_path / "in.pt")
    for isa, got in run_under_every_isa(ISA_SCRIPT, tmp_path, tmp_path / "in.pt").items():
        for dt, res in got["res"].items():
            dtype = getattr(torch, dt)
            ins64 = [t.to(dtype).double().requires_grad_() if i < 2 else t.double().requires_grad_()
                     for i, t in enumerate(ins)]
            x2 = dsv4.write(*ins64[:4])
            p2, c2, h2 = dsv4.hyper_connection(x2, *ins64[4:], RMS_EPS, HC_EPS, 20)
            pre = dsv4.pre_map(dsv4.projection(dsv4.flat_rms_norm(x2, RMS_EPS), ins64[4], N)[0], ins64[6][0],
                               ins64[5][:N], HC_EPS)
            outs = (x2, h2, pre, p2, c2.transpose(-1, -2))
            grads = torch.autograd.grad(sum(o.sum() * (i + 1) for i, o in enumerate(outs)), ins64)
            tol = TOL[dtype]
            for k, (a, e) in enumerate(zip(res, (*outs, *grads), strict=True)):
                e = e.detach()
                atol = tol * 16 * (1 + e.abs().max().item()) if k in (0, 1) or k > 4 else (
                    2e-5 if dtype == torch.float32 else tol)
                torch.testing.assert_close(a.double(), e, atol=atol, rtol=tol * 4, msg=f"{isa} {dt} output {k}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_deepseeks_last_write_and_final_collapse_in_one_call(dtype, backend):
    """hyper_write_read with h_res: DeepSeek-V4's last write (post y + comb^T X) and its head's read of the result
    (HY-V4's head form, groups 1) in one call, against the transcription of both; gradients too."""
    x, fn, base, scale = _params(dtype=dtype, lead=(3, 2), C=13)
    y, post, comb = _write_inputs(dtype, (3, 2), 13)
    ins = [t.requires_grad_() for t in (x, y, post, comb, fn[:N].clone(), base[:N].clone(), scale[:1].clone())]
    conv = ProjectedGates(RMS_EPS, pre_eps=1e-3)
    x2, h, _, h_post = hyper_write_read(ins[0], ins[1], ins[2], ins[4], ins[6], ins[5], convention=conv,
                                        h_res=ins[3].transpose(-1, -2), backend=backend)
    assert addnorm.last_backend() == ("cpu" if backend == "cpu" else "torch") and h_post.shape[-1] == 0
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    x2_64 = dsv4.write(*ins64[:4])
    h64 = dsv4.hyper_head(x2_64, *ins64[4:], RMS_EPS, 1e-3)
    tol = TOL[dtype]
    torch.testing.assert_close(x2.double(), x2_64.detach(), atol=tol * 8, rtol=tol)
    torch.testing.assert_close(h.double(), h64.detach(), atol=tol * 8, rtol=tol)
    g = torch.Generator().manual_seed(7)
    cots = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in (x2, h)]
    got = torch.autograd.grad((x2.double() * cots[0]).sum() + (h.double() * cots[1]).sum(), ins)
    exp = torch.autograd.grad((x2_64 * cots[0]).sum() + (h64 * cots[1]).sum(), ins64)
    for name, a, e in zip(("x", "y", "post", "comb", "hc_fn", "hc_base", "hc_scale"), got, exp, strict=True):
        torch.testing.assert_close(a.double(), e, atol=tol * 16 * (1 + e.abs().max().item()), rtol=tol * 4, msg=name)


SEAM_SCRIPT = r"""
import sys, torch, addnorm
import addnorm.functional as AF
x, y, post, res, phi, *coeffs = torch.load(sys.argv[1])
out = {}
for dt in ("float32", "bfloat16"):
    dtype = getattr(torch, dt)
    for fused in (True, False):
        ts = [t.to(dtype).requires_grad_() if i < 2 else t.clone().requires_grad_()
              for i, t in enumerate((x, y, post, res, phi, *coeffs))]
        if fused:
            outs = AF.mhc_write_pre(*ts, iters=7)
        else:
            x2 = AF.stream_write(*ts[:4])[0]
            outs = (x2, *AF.mhc_pre(x2, *ts[4:], iters=7))
        ups = [torch.randn(o.shape, generator=torch.Generator().manual_seed(k)).to(o.dtype) for k, o in enumerate(outs)]
        grads = torch.autograd.grad(outs, ts, ups)
        out[(dt, fused)] = [t.detach() for t in (*outs, *grads)]
torch.save({"isa": addnorm.cpu_kernel_availability().isa, "res": out}, sys.argv[2])
"""


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_the_write_and_read_in_one_pass_give_the_two_calls_bits(tmp_path):
    """mhc_write_pre (a widened sub-layer's pending write finished by the next mHC read) against stream_write then
    mhc_pre, on every instruction-set path, n = 2 and 4 (the stream kernels' own loops), odd C: X', h and the
    coefficients to the bit in float32 and bfloat16; the gradients to the bit in float32 (bfloat16's fused backward
    adds the read's gradient of X' to the one given in float32, not rounded first as two operators do)."""
    for n in (2, 4):
        g = torch.Generator().manual_seed(n)
        C, lead = 67, (3, 7)
        ins = [torch.randn(*lead, n, C, generator=g), torch.randn(*lead, C, generator=g),
               torch.rand(*lead, n, generator=g) * 2, torch.rand(*lead, n, n, generator=g),
               torch.randn(n * C, 2 * n + n * n, generator=g) * 0.05, torch.tensor(0.8), torch.tensor(0.6),
               torch.tensor(1.1), 0.5 * torch.randn(n, generator=g), 0.5 * torch.randn(n, generator=g),
               0.5 * torch.randn(n, n, generator=g)]
        torch.save(ins, tmp_path / "in.pt")
        for isa, got in run_under_every_isa(SEAM_SCRIPT, tmp_path, tmp_path / "in.pt").items():
            for dt in ("float32", "bfloat16"):
                fused, two = got["res"][(dt, True)], got["res"][(dt, False)]
                upto = len(fused) if dt == "float32" else 5  # the five outputs
                for k, (a, b) in enumerate(zip(fused[:upto], two[:upto], strict=True)):
                    assert torch.equal(a, b), (isa, n, dt, k, (a.float() - b.float()).abs().max())
                for a, b in zip(fused[5:], two[5:]):  # bfloat16's gradients: within its rounding
                    torch.testing.assert_close(a.float(), b.float(), atol=0.1, rtol=0.02)
