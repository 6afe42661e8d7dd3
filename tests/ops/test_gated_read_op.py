"""Qwen4-exp's gated read on its own C kernels (``addnorm.functional.hyper``: ``stream_rms_norm``,
``hyper_write_norm``, ``sigmoid_gated_collapse``; ``torch.ops.addnorm.hyper_*``), against the float64 transcription of
the model's equations (``addnorm.reference.gated_streams``) and against eager 16-bit code spelled as HF spells it:
values and every gradient, one kernel call each way, where eager rounds, gradcheck and forward AD, opcheck,
torch.compile, the instruction-set paths, non-contiguous input, and bad input named."""

import os
import subprocess
import sys

import pytest
import torch

from addnorm.functional import (StreamNorm, hyper_write, hyper_write_norm, last_backend, sigmoid_gated_collapse,
                                stream_rms_norm)
from addnorm.functional.hyper import ONCE, PRODUCTS, Rounding
from addnorm.ops.hyper import formulas as hyper_formulas
from addnorm.reference import gated_streams as ref
from tests.backends import KERNELS
from tests.compile_spy import addnorm_ops_backend

CPU = "cpu" in KERNELS
needs_cpu = pytest.mark.skipif(not CPU, reason="the compiled kernels are not built")
BACKENDS = (["cpu"] if CPU else []) + ["torch"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# odd C (not a multiple of the kernels' lanes), n = 1, 2, 3, 4, 8 and 9 (beyond the stream family's 8), no tokens,
# one token without a batch, C = 1
CASES = [((2, 3), 4, 16), ((5,), 1, 8), ((2,), 3, 7), ((0, 3), 4, 16), ((), 2, 1), ((3,), 8, 5), ((4,), 2, 33),
         ((2,), 9, 6)]
CONV = StreamNorm(eps=1e-6)
F32_TOL = 1e-5  # the project's bar for float32: every value and gradient within 1e-5 of the float64 equations


def _rand(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def _inputs(lead, n, C, dtype, permuted=False):
    """x (a non-contiguous stream when ``permuted``), the norm's weight (n, C), y, H_post and the gates' logits."""
    x = (_rand(*lead, C, n, seed=1, scale=3).transpose(-1, -2) if permuted else _rand(*lead, n, C, seed=1, scale=3))
    w = _rand(n, C, seed=2, scale=0.3)
    y = _rand(*lead, C, seed=3)
    hp = 2 * torch.sigmoid(_rand(*lead, n, seed=4))
    u = _rand(*lead, n, C, seed=5, scale=2)
    return [t.to(dtype).requires_grad_() for t in (x, w, y, hp, u)]


def _f64(ts):
    return [t.detach().double().requires_grad_() for t in ts]


def _f32_close(got, want):
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), e.double(), atol=F32_TOL, rtol=F32_TOL)


def _err(a, e):
    return (a.double() - e.double()).abs().max().item() if a.numel() else 0.0


def _grads(outs, ins, seed=20):
    cots = [_rand(*o.shape, seed=seed + i).to(o.dtype) for i, o in enumerate(outs)]
    return torch.autograd.grad(outs, ins, cots), cots


# ---- eager 16-bit code as HF's Qwen4-exp spells it (the bar for the 16-bit results: no further from float64)


def _eager_norm(x, w, eps):
    """Qwen4ExpTextRMSNorm with group_size C: float32 statistics, (x rstd) (1 + w) in float32, rounded once."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())).type_as(x)


def _eager_write(x, y, a):
    return x + a.unsqueeze(-1) * y.unsqueeze(-2)


def _eager_gate(N, u):
    return (torch.sigmoid(u) * N).mean(-2)


def _skip_float64_on_kernels(dtype, backend):
    if dtype == torch.float64 and backend != "torch":
        pytest.skip("the kernels take float32, bfloat16 and float16 (backend='cpu' refuses float64 by name)")


def _no_worse_than_eager(got, eager, want):
    """Each of ``got`` no further from the float64 ``want`` than eager's, in the largest and the mean error -- up to
    float32's own noise (both compute in float32: a gradient that cancels to ~1e-7, C = 1's, is that noise alone).
    For samples large enough that one element's rounding luck does not decide the largest error."""
    for k, (a, b, e) in enumerate(zip(got, eager, want, strict=True)):
        ea, eb = (a.double() - e).abs(), (b.double() - e).abs()
        floor = 4 * torch.finfo(torch.float32).eps * (1 + e.abs().max().item())
        assert ea.max().item() <= eb.max().item() + floor, (k, ea.max().item(), eb.max().item())
        assert ea.mean().item() <= eb.mean().item() + floor, (k, ea.mean().item(), eb.mean().item())


def _within_a_rounding_of_eager(got, eager, want, dtype):
    """Each of ``got`` at most one rounding at the tensor's scale (an ulp of ``dtype`` at its largest value) further
    from the float64 ``want`` than eager's, in the largest error: the small tables' bound, where one element's
    rounding can go either way (and a sum's, dy's over the streams, either way at the scale of its terms)."""
    for k, (a, b, e) in enumerate(zip(got, eager, want, strict=True)):
        if not e.numel():
            continue
        ea, eb = (a.double() - e).abs().max().item(), (b.double() - e).abs().max().item()
        scale = e.abs().max().item()
        assert ea <= eb + torch.finfo(dtype).eps * scale + 4 * torch.finfo(torch.float32).eps * (1 + scale), (k, ea, eb)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, *DTYPES], ids=str)
@pytest.mark.parametrize("lead, n, C", CASES)
def test_stream_norm_matches_the_float64_equations(lead, n, C, dtype, backend):
    _skip_float64_on_kernels(dtype, backend)
    x, w, *_ = _inputs(lead, n, C, dtype, permuted=n == 4)
    N = stream_rms_norm(x, w, convention=CONV, backend=backend)
    assert last_backend() == backend
    assert N.dtype == dtype and N.shape == x.shape
    x64, w64 = _f64((x, w))
    N64 = ref.stream_rms_norm(x64, w64, CONV.eps)
    (gx, gw), (c,) = _grads([N], [x, w])
    want = torch.autograd.grad(N64, [x64, w64], c.double())
    if dtype in (torch.float32, torch.float64):
        _f32_close((N, gx, gw), (N64, *want))
    else:
        eager = _eager_norm(x, w, CONV.eps)
        _within_a_rounding_of_eager((N, gx, gw), (eager, *torch.autograd.grad(eager, [x, w], c)), (N64, *want), dtype)


@pytest.mark.parametrize("rounding", [ONCE, PRODUCTS], ids=["once", "products"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, *DTYPES], ids=str)
@pytest.mark.parametrize("lead, n, C", CASES)
def test_sigmoid_gated_collapse_matches_the_float64_equations(lead, n, C, dtype, backend, rounding):
    _skip_float64_on_kernels(dtype, backend)
    N, _, _, _, u = _inputs(lead, n, C, dtype, permuted=n == 4)
    h = sigmoid_gated_collapse(N, u, rounding=rounding, backend=backend)
    assert last_backend() == backend
    assert h.dtype == dtype and h.shape == N.shape[:-2] + (C,)
    N64, u64 = _f64((N, u))
    h64 = ref.gated_collapse(torch.sigmoid(u64), N64)
    (gN, gu), (c,) = _grads([h], [N, u])
    want = torch.autograd.grad(h64, [N64, u64], c.double())
    if dtype in (torch.float32, torch.float64):
        _f32_close((h, gN, gu), (h64, *want))
    else:
        eager = _eager_gate(N, u)
        _within_a_rounding_of_eager((h, gN, gu), (eager, *torch.autograd.grad(eager, [N, u], c)), (h64, *want), dtype)


@pytest.mark.parametrize("rounding", [ONCE, PRODUCTS], ids=["once", "products"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, *DTYPES], ids=str)
@pytest.mark.parametrize("lead, n, C", CASES)
def test_write_and_norm_together_match_the_float64_equations(lead, n, C, dtype, backend, rounding):
    """hyper_write_norm: X' is hyper_write's to the bit and N' stream_rms_norm's of X' as stored; X', N' and the
    gradients of x, y, H_post and w against the float64 equations (float32: within 1e-5), or no further from them
    than eager 16-bit code's write then HF's norm."""
    _skip_float64_on_kernels(dtype, backend)
    x, w, y, hp, _ = _inputs(lead, n, C, dtype, permuted=n == 4)
    if rounding is ONCE:  # H_post in float32, as HY-V4's casts keep it; PRODUCTS: in the stream's dtype, as eager's
        hp = hp.detach().float().requires_grad_()
    x2, N = hyper_write_norm(x, y, hp, w, convention=CONV, rounding=rounding, backend=backend)
    assert last_backend() == backend
    assert torch.equal(x2, hyper_write(x, y, hp, rounding=rounding))
    assert torch.equal(N, stream_rms_norm(x2, w, convention=CONV, backend=backend))
    ins64 = _f64((x, y, hp, w))
    x2_64 = ref.expand(*ins64[:3])
    N64 = ref.stream_rms_norm(x2_64, ins64[3], CONV.eps)
    grads, cots = _grads([x2, N], [x, y, hp, w])
    want = torch.autograd.grad([x2_64, N64], ins64, [c.double() for c in cots])
    if dtype in (torch.float32, torch.float64):
        _f32_close((x2, N, *grads), (x2_64, N64, *want))
    else:
        ex2 = _eager_write(x, y, hp) if rounding is PRODUCTS else _eager_write(x.float(), y.float(), hp).to(dtype)
        eN = _eager_norm(ex2, w, CONV.eps)
        eager = torch.autograd.grad([ex2, eN], [x, y, hp, w], cots)
        # the norm's gradient of X' joins X''s own in float32 here, where eager rounds it to the stream's dtype first
        _within_a_rounding_of_eager((x2, N, *grads), (ex2, eN, *eager), (x2_64, N64, *want), dtype)


@needs_cpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_products_is_eager_16_bit_gated_collapse(dtype):
    """PRODUCTS rounds where eager's ``(sigmoid(U) * N).mean(-2)`` rounds -- sigmoid(U), each product, the float32
    mean once --: the kernel's h is eager's bit for bit on almost every element (an ulp of float32 in the
    vectorized exp moves a rare 16-bit rounding), and no further from the float64 equations; ONCE (the gates in
    float32, one rounding) is nearer still."""
    g = torch.Generator().manual_seed(0)
    N = (torch.randn(512, 4, 256, generator=g) * 1.5).to(dtype).requires_grad_()
    u = (torch.randn(512, 4, 256, generator=g) * 2).to(dtype).requires_grad_()
    h = sigmoid_gated_collapse(N, u, rounding=PRODUCTS, backend="cpu")
    eager = _eager_gate(N, u)
    assert (h == eager).float().mean().item() >= 0.999
    h64 = ref.gated_collapse(torch.sigmoid(u.detach().double()), N.detach().double())
    assert _err(h, h64) <= _err(eager, h64)
    assert _err(sigmoid_gated_collapse(N, u, rounding=ONCE, backend="cpu"), h64) < _err(eager, h64)
    # the gradients from float32, rounded once: no further from float64's than eager's, which rounds each step
    N64, u64 = _f64((N, u))
    c = torch.randn(h.shape, generator=g).to(dtype)
    want = torch.autograd.grad(ref.gated_collapse(torch.sigmoid(u64), N64), [N64, u64], c.double())
    _no_worse_than_eager(torch.autograd.grad(h, [N, u], c), torch.autograd.grad(eager, [N, u], c), want)


@needs_cpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_norm_and_write_norm_are_no_further_from_float64_than_eager(dtype):
    """On a sample large enough for the largest and the mean error to say something (256 tokens x 4 x 128): the
    stream norm, and the write with the norm after it, values and every gradient, no further from the float64
    equations than eager 16-bit code spelled as HF spells it (its write, rounded per product; its norm)."""
    x, w, y, hp, _ = _inputs((256,), 4, 128, dtype)
    w = w.detach().float().requires_grad_()  # HF keeps the norm's weight in float32 beside 16-bit activations
    N = stream_rms_norm(x, w, convention=CONV, backend="cpu")
    eN = _eager_norm(x, w, CONV.eps)
    x64, w64 = _f64((x, w))
    N64 = ref.stream_rms_norm(x64, w64, CONV.eps)
    (gx, gw), (c,) = _grads([N], [x, w])
    _no_worse_than_eager((N, gx, gw), (eN, *torch.autograd.grad(eN, [x, w], c)),
                         (N64, *torch.autograd.grad(N64, [x64, w64], c.double())))
    x2, N2 = hyper_write_norm(x, y, hp, w, convention=CONV, rounding=PRODUCTS, backend="cpu")
    ex2 = _eager_write(x, y, hp)
    eN2 = _eager_norm(ex2, w, CONV.eps)
    assert torch.equal(x2, ex2)
    ins64 = _f64((x, y, hp, w))
    x2_64 = ref.expand(*ins64[:3])
    N2_64 = ref.stream_rms_norm(x2_64, ins64[3], CONV.eps)
    grads, cots = _grads([x2, N2], [x, y, hp, w])
    _no_worse_than_eager((N2, *grads), (eN2, *torch.autograd.grad([ex2, eN2], [x, y, hp, w], cots)),
                         (N2_64, *torch.autograd.grad([x2_64, N2_64], ins64, [t.double() for t in cots])))


@needs_cpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_is_one_kernel_call_each_way(dtype, monkeypatch):
    """On the CPU kernels each function is one kernel call forward and one backward (no per-stream calls, no stack),
    and no formula runs; on the torch backend the formulas do run (so the patch would have caught a fallback)."""
    from addnorm.kernels.cpu import hyper as cpu_hyper

    counts = {}
    for name in ("stream_norm", "stream_norm_backward", "write_norm", "write_norm_backward", "sigmoid_collapse",
                 "sigmoid_collapse_backward"):
        real = getattr(cpu_hyper, name)

        def spy(*a, _real=real, _name=name):
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*a)

        monkeypatch.setattr(cpu_hyper, name, spy)

    def boom(*a, **k):
        raise AssertionError("the formulas ran")

    for name in ("stream_norm", "stream_norm_backward", "stream_norm_grads", "write", "write_norm",
                 "write_norm_backward", "gated_collapse", "sigmoid_gated_collapse", "sigmoid_gated_collapse_backward"):
        monkeypatch.setattr(hyper_formulas, name, boom)
    monkeypatch.setattr(torch, "stack", boom)

    def calls(backend):
        x, w, y, hp, u = _inputs((3, 5), 4, 19, dtype)
        hp = hp.detach().to(dtype).requires_grad_()
        outs = [stream_rms_norm(x, w, convention=CONV, backend=backend),
                *hyper_write_norm(x, y, hp, w, convention=CONV, rounding=PRODUCTS, backend=backend),
                sigmoid_gated_collapse(x, u, rounding=PRODUCTS, backend=backend)]
        assert last_backend() == backend
        torch.autograd.grad(sum(o.float().sum() for o in outs), [x, w, y, hp, u])

    calls("cpu")
    assert counts == {name: 1 for name in counts} and len(counts) == 6, counts
    with pytest.raises(AssertionError, match="the formulas ran"):
        calls("torch")


@needs_cpu
def test_rows_beyond_float32s_range_and_infs_stay_in_their_stream():
    """A row whose sum of squares overflows float32 is normed in float64 (as the norm family's kernels do), forward
    and backward; an inf written into one stream makes that stream's N NaN and leaves the others finite."""
    x, w, *_ = (t.detach() for t in _inputs((3,), 4, 9, torch.float32))
    x[1, 2] *= 1e19
    x.requires_grad_()
    w.requires_grad_()
    N = stream_rms_norm(x, w, convention=CONV, backend="cpu")
    x64, w64 = _f64((x, w))
    N64 = ref.stream_rms_norm(x64, w64, CONV.eps)
    (gx, gw), (c,) = _grads([N], [x, w])
    want = torch.autograd.grad(N64, [x64, w64], c.double())
    torch.testing.assert_close(N.double(), N64, atol=F32_TOL, rtol=F32_TOL)
    torch.testing.assert_close(gw.double(), want[1], atol=F32_TOL, rtol=F32_TOL)
    torch.testing.assert_close(gx.double(), want[0], atol=1e-30, rtol=1e-5)  # that row's gradient is ~1e-19
    x = x.detach()
    x[0, 0, 3] = float("inf")
    y, hp = torch.ones(3, 9), torch.ones(3, 4)
    x2, N2 = hyper_write_norm(x, y, hp, w.detach(), convention=CONV, backend="cpu")
    assert torch.isnan(N2[0, 0, 3]) and torch.isfinite(N2[0, 1:]).all() and torch.isfinite(N2[1:]).all()
    torch.testing.assert_close(N2.double(), ref.stream_rms_norm(x2, w.detach(), CONV.eps), equal_nan=True,
                               atol=F32_TOL, rtol=F32_TOL)  # the row of 1e19s too, where float32 formulas give 0


@needs_cpu
def test_non_contiguous_and_negative_views_are_read_as_their_values():
    x, w, y, hp, u = (t.detach() for t in _inputs((4, 3), 4, 10, torch.bfloat16))
    xs, us = x.transpose(0, 1), u.transpose(0, 1)  # strided streams: copied by the host, same values
    for got, want in ((stream_rms_norm(xs, w, convention=CONV), stream_rms_norm(xs.contiguous(), w, convention=CONV)),
                      (sigmoid_gated_collapse(xs, us, rounding=PRODUCTS),
                       sigmoid_gated_collapse(xs.contiguous(), us.contiguous(), rounding=PRODUCTS)),
                      (sigmoid_gated_collapse(x, torch._neg_view(-u)), sigmoid_gated_collapse(x, u))):
        assert torch.equal(got, want)


def test_gradcheck_forward_ad_and_double_backward_in_float64():
    """Through the operators (their autograd; float64 takes the formulas): gradients, forward-mode tangents and
    second derivatives against finite differences."""
    x, w, y, hp, u = _f64(_inputs((2,), 3, 4, torch.float64))
    ops = torch.ops.addnorm
    cases = [(lambda a, b: ops.hyper_stream_norm(a, b, 1e-6, 1.0), (x, w)),
             (lambda *a: ops.hyper_write_norm(*a, 1e-6, 1.0, "once"), (x, y, hp, w)),
             (lambda *a: ops.hyper_write_norm(*a, 1e-6, 1.0, "products"), (x, y, hp, w)),
             (lambda a, b: ops.hyper_sigmoid_gated_collapse(a, b, "once"), (x, u)),
             (lambda a, b: ops.hyper_sigmoid_gated_collapse(a, b, "products"), (x, u))]
    for f, ins in cases:
        torch.autograd.gradcheck(f, ins, check_forward_ad=True)
        torch.autograd.gradgradcheck(f, ins)


@needs_cpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_kernels_backward_is_differentiable_again_and_their_tangents_agree(dtype):
    """create_graph=True takes the formulas (the kernels' backward is not differentiable): the second derivative
    through a kernel call equals the formulas'; forward-mode tangents of the kernel ops equal the torch backend's."""
    import torch.autograd.forward_ad as fwad

    x, w, y, hp, u = _inputs((3,), 2, 6, dtype)
    for backend in ("cpu", "torch"):
        h = sigmoid_gated_collapse(stream_rms_norm(x, w, convention=CONV, backend=backend), u, backend=backend)
        g = torch.autograd.grad(h.float().square().sum(), [x, w, u], create_graph=True)
        hess = torch.autograd.grad(sum(t.float().sum() for t in g), [x, w, u])
        if backend == "cpu":
            want = (g, hess)
        else:
            for a, e in zip((*g, *hess), (*want[0], *want[1]), strict=True):
                torch.testing.assert_close(a, e, atol=1e-5 if dtype == torch.float32 else 0.05, rtol=1e-3)
    tangents = [_rand(*t.shape, seed=30 + i).to(dtype) for i, t in enumerate((x, w, y, hp, u))]
    outs = {}
    for backend in ("cpu", "torch"):
        with fwad.dual_level():
            dx, dw, dy, dhp, du = (fwad.make_dual(t.detach(), tt) for t, tt in zip((x, w, y, hp, u), tangents))
            x2, N = hyper_write_norm(dx, dy, dhp, dw, convention=CONV, backend=backend)
            h = sigmoid_gated_collapse(N, du, backend=backend)
            outs[backend] = [fwad.unpack_dual(t).tangent for t in (x2, N, h)]
    for a, e in zip(outs["cpu"], outs["torch"], strict=True):
        torch.testing.assert_close(a, e, atol=1e-5 if dtype == torch.float32 else 0.05, rtol=1e-3)


def test_torch_func_transforms_take_the_formulas():
    """vmap and torch.func.grad (whose wrapped tensors the kernels cannot read) run the formulas, with the same
    values as the unbatched call and the gradients of the float64 equations."""
    x, w, y, hp, u = (t.detach() for t in _inputs((5, 3), 4, 8, torch.float32))
    for f, ins in ((lambda a, b: sigmoid_gated_collapse(a, b, rounding=PRODUCTS), (x, u)),
                   (lambda a, b, c: hyper_write_norm(a, b, c, w, convention=CONV)[1], (x, y, hp)),
                   (lambda a: stream_rms_norm(a, w, convention=CONV), (x,))):
        torch.testing.assert_close(torch.vmap(f)(*ins), f(*ins), atol=F32_TOL, rtol=F32_TOL)
    got = torch.func.grad(lambda a, b: sigmoid_gated_collapse(stream_rms_norm(a, w, convention=CONV), b).sum(),
                          argnums=(0, 1))(x, u)
    x64, u64 = _f64((x, u))
    want = torch.autograd.grad(ref.gated_collapse(torch.sigmoid(u64), ref.stream_rms_norm(x64, w.double(), CONV.eps))
                               .sum(), [x64, u64])
    _f32_close(got, want)


def test_opcheck():
    """PyTorch's own checks of each operator: schema, fake tensors, autograd registration, AOT dispatch."""
    x, w, y, hp, u = (t.detach().float() for t in _inputs((2, 3), 4, 8, torch.float32))
    ops = torch.ops.addnorm
    req = [t.clone().requires_grad_() for t in (x, w, y, hp, u)]
    torch.library.opcheck(ops.hyper_stream_norm.default, (req[0], req[1], 1e-6, 1.0))
    torch.library.opcheck(ops.hyper_stream_norm_backward.default, (x, x, w, 1e-6, 1.0))
    for rounding in ("once", "products"):
        torch.library.opcheck(ops.hyper_write_norm.default, (*req[:1], req[2], req[3], req[1], 1e-6, 1.0, rounding))
        torch.library.opcheck(ops.hyper_sigmoid_gated_collapse.default, (req[0], req[4], rounding))
        torch.library.opcheck(ops.hyper_sigmoid_gated_collapse_backward.default, (y, x, u, rounding))
    x2 = hyper_write(x, y, hp)
    for dx2, dn in ((x, x * 2), (None, x), (x, None)):
        torch.library.opcheck(ops.hyper_write_norm_backward.default, (dx2, dn, x2, y, hp, w, 1e-6, 1.0))


@needs_cpu
def test_compiled_calls_keep_the_operators_and_their_results():
    """torch.compile(fullgraph=True) traces each function to its operator, forward and backward (what AOTAutograd
    hands the backend), and the compiled results are the eager ones."""
    seen = set()
    backend = addnorm_ops_backend(seen)
    x, w, y, hp, u = _inputs((2, 3), 4, 24, torch.float32)

    def f(x, w, y, hp, u):
        N = stream_rms_norm(x, w, convention=CONV)
        x2, N2 = hyper_write_norm(x, y, hp, w, convention=CONV, rounding=PRODUCTS)
        return sigmoid_gated_collapse(N + N2, u, rounding=PRODUCTS).sum() + x2.sum()

    torch._dynamo.reset()
    ins = [x, w, y, hp, u]
    eager = torch.autograd.grad(f(*ins), ins)
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    got = torch.autograd.grad(compiled(*ins), ins)
    assert {"addnorm.hyper_stream_norm.default", "addnorm.hyper_stream_norm_backward.default",
            "addnorm.hyper_write_norm.default", "addnorm.hyper_write_norm_backward.default",
            "addnorm.hyper_sigmoid_gated_collapse.default",
            "addnorm.hyper_sigmoid_gated_collapse_backward.default"} <= seen, seen
    for a, e in zip(got, eager, strict=True):
        torch.testing.assert_close(a, e, atol=0, rtol=0)


@pytest.mark.parametrize("call, error, match", [
    (lambda x, w, y, hp, u: sigmoid_gated_collapse(x, u[..., :1, :]), ValueError,
     r"logits must have shape \(2, 3, 4, 8\)"),
    (lambda x, w, y, hp, u: sigmoid_gated_collapse(x, u.long()), TypeError, "logits must be a floating-point tensor"),
    (lambda x, w, y, hp, u: sigmoid_gated_collapse(x, u.to("meta")), ValueError, "logits is on meta but x is on cpu"),
    (lambda x, w, y, hp, u: sigmoid_gated_collapse(x, u, rounding="products"), TypeError,
     "rounding must be an addnorm.functional.Rounding"),
    (lambda x, w, y, hp, u: sigmoid_gated_collapse(x[0, 0, 0], u), ValueError,
     r"x must be a widened stream \(\.\.\., n >= 1, C >= 1\)"),
    (lambda x, w, y, hp, u: sigmoid_gated_collapse(x, u, backend="gpu"), ValueError, "backend must be"),
    (lambda x, w, y, hp, u: hyper_write_norm(x, y, hp, w[:, :-1], convention=CONV), ValueError,
     "weight must have 32 elements"),
    (lambda x, w, y, hp, u: hyper_write_norm(x, y[..., :3], hp, w, convention=CONV), ValueError,
     r"y must have shape \(2, 3, 8\)"),
    (lambda x, w, y, hp, u: hyper_write_norm(x, y, hp, w, convention=ONCE), TypeError,
     "convention must be an addnorm.functional.StreamNorm"),
    (lambda x, w, y, hp, u: hyper_write_norm(x, y, hp, w, convention=CONV, rounding="once"), TypeError,
     "rounding must be an addnorm.functional.Rounding"),
    (lambda x, w, y, hp, u: hyper_write_norm(x, y, hp.to("meta"), w, convention=CONV), ValueError,
     "h_post is on meta but x is on cpu"),
    (lambda x, w, y, hp, u: stream_rms_norm(x.double(), w, convention=CONV, backend="cpu"), RuntimeError,
     "backend='cpu' cannot run this call: x has dtype torch.float64"),
])
def test_bad_input_is_named(call, error, match):
    x, w, y, hp, u = (t.detach() for t in _inputs((2, 3), 4, 8, torch.float32))
    with pytest.raises(error, match=match):
        call(x, w, y, hp, u)
    assert Rounding("products") == PRODUCTS


ISA_SCRIPT = r"""
import sys, torch, addnorm
from addnorm.functional import StreamNorm, hyper_write_norm, sigmoid_gated_collapse, stream_rms_norm
from addnorm.functional.hyper import PRODUCTS
ins = torch.load(sys.argv[1])
res = {}
for dt in ("float32", "bfloat16"):
    x, w, y, hp, u = (t.to(getattr(torch, dt)).requires_grad_() for t in ins)
    conv = StreamNorm(1e-6)
    outs = [stream_rms_norm(x, w, convention=conv, backend="cpu"),
            *hyper_write_norm(x, y, hp, w, convention=conv, rounding=PRODUCTS, backend="cpu"),
            sigmoid_gated_collapse(x, u, rounding=PRODUCTS, backend="cpu")]
    assert addnorm.last_backend() == "cpu"
    grads = torch.autograd.grad(sum(o.double().sum() * (i + 1) for i, o in enumerate(outs)), [x, w, y, hp, u])
    res[dt] = [t.detach() for t in (*outs, *grads)]
torch.save({"isa": addnorm.cpu_kernel_availability().isa, "res": res}, sys.argv[2])
"""


@needs_cpu
def test_every_instruction_set_path_meets_the_float64_tolerance(tmp_path):
    """ADDNORM_CPU_ISA=baseline|avx2 caps the kernels' instruction set (read once per process): the norm, the
    write+norm and the sigmoid-gated collapse of each path, in its own process, against the float64 equations (odd
    C: every loop's tail; 37 tokens: more than one dw block)."""
    n, C = 4, 259
    ins = [t.detach().double() for t in _inputs((37,), n, C, torch.float64)]
    torch.save(ins, tmp_path / "in.pt")
    want = {"baseline": "baseline", "avx2": "avx2+fma+f16c", "native": None}
    for isa, name in want.items():
        env = dict(os.environ)
        env.pop("ADDNORM_CPU_ISA", None)
        if isa != "native":
            env["ADDNORM_CPU_ISA"] = isa
        out = tmp_path / f"{isa}.pt"
        subprocess.run([sys.executable, "-c", ISA_SCRIPT, str(tmp_path / "in.pt"), str(out)], env=env, check=True,
                       timeout=300)
        got = torch.load(out)
        assert name is None or got["isa"] == name
        for dt, res in got["res"].items():
            dtype = getattr(torch, dt)
            x, w, y, hp, u = (t.to(dtype).double().requires_grad_() for t in ins)
            x2 = ref.expand(x, y, hp)
            outs = (ref.stream_rms_norm(x, w, 1e-6), x2, ref.stream_rms_norm(x2, w, 1e-6),
                    ref.gated_collapse(torch.sigmoid(u), x))
            grads = torch.autograd.grad(sum(o.sum() * (i + 1) for i, o in enumerate(outs)), [x, w, y, hp, u])
            for k, (a, e) in enumerate(zip(res, (*outs, *grads), strict=True)):
                e = e.detach()
                if dtype == torch.float32:
                    torch.testing.assert_close(a.double(), e, atol=F32_TOL * (1 + e.abs().max().item()), rtol=F32_TOL,
                                               msg=f"{isa} {dt} output {k}")
                else:  # 16-bit storage, one rounding of each output (and of the rounded inputs' products)
                    torch.testing.assert_close(a.double(), e, atol=1.6e-2 * (1 + e.abs().max().item()), rtol=1.6e-2,
                                               msg=f"{isa} {dt} output {k}")
