"""DyT and Derf fused with the residual add (``addnorm.functional.pointwise``): every backend against an
independent float64 transcription of the papers' formulas, PyTorch's operator checks, gradcheck, forward AD,
compile, special values, bad input and every instruction set."""

import math

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as fwAD

from addnorm.functional import add_derf, add_dyt
from tests.backends import BACKENDS, KERNELS
from tests.compile_spy import addnorm_ops_backend
from tests.isa_paths import assert_every_isa_agrees, run_under_every_isa
from tests.samples import SAMPLES, make, params, upstream

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 2e-6, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
ERF = np.vectorize(math.erf, otypes=[np.float64])


def _oracle(kind, s, alpha, shift, w, b):
    """DyT: gamma * tanh(alpha x) + beta; Derf: gamma * erf(alpha x + s) + beta -- NumPy, float64."""
    u = alpha * s + (shift if kind == "derf" else 0.0)
    f = np.tanh(u) if kind == "dyt" else ERF(u)
    return (1.0 if w is None else w) * f + (0.0 if b is None else b)


def _call(kind, x, r, a, sh, w, b, backend):
    if kind == "dyt":
        return add_dyt(x, r, a, w, b, backend=backend)
    return add_derf(x, r, a, sh, w, b, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["dyt", "derf"])
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("sample", SAMPLES, ids=str)
def test_matches_the_papers_formula_in_float64(sample, residual, kind, dtype, backend):
    x = make(sample, dtype, scale=2.0, requires_grad=True)
    r = make(sample, dtype, seed=3, requires_grad=True) if residual else None
    w, b = (p.requires_grad_() for p in params(sample, dtype))
    a = torch.tensor(0.8, requires_grad=True)
    sh = torch.tensor(-0.2, requires_grad=True)
    y, s = _call(kind, x, r, a, sh, w, b, backend)
    assert y.shape == x.shape and y.dtype == dtype and (s is x if r is None else s.dtype == dtype)
    s64 = x.detach().double() + (0 if r is None else r.detach().double())
    if r is not None:
        torch.testing.assert_close(s.double(), s64, atol=TOL[dtype] * 8, rtol=TOL[dtype])
    s_np = s.detach().double().numpy()  # the stream as stored: the oracle normalizes exactly what was stored
    ref = _oracle(kind, s_np, 0.8, -0.2, w.detach().double().numpy(), b.detach().double().numpy())
    torch.testing.assert_close(y.double(), torch.from_numpy(np.asarray(ref)), atol=TOL[dtype] * 8, rtol=TOL[dtype])
    up = upstream(sample, dtype).double()
    names = ["x", "r", "a", "sh", "w", "b"]
    vals = dict(zip(names, (x, r, a, sh if kind == "derf" else None, w, b), strict=True))
    live = [k for k in names if vals[k] is not None]
    got = torch.autograd.grad((y.double() * up).sum(), [vals[k] for k in live])
    v64 = {k: (vals[k].detach().double().requires_grad_() if vals[k] is not None else None) for k in names}
    s_ = v64["x"] if r is None else v64["x"] + v64["r"]
    u = v64["a"] * s_ + (v64["sh"] if kind == "derf" else 0)
    y64 = v64["w"] * (torch.tanh(u) if kind == "dyt" else torch.erf(u)) + v64["b"]
    exp = torch.autograd.grad((y64 * up).sum(), [v64[k] for k in live])
    n = max(1, math.prod(sample.lead))
    for k, g, e in zip(live, got, exp, strict=True):
        scale = 1 + (e.abs().max().item() if e.numel() else 0.0)
        torch.testing.assert_close(g.double(), e, atol=TOL[dtype] * 16 * n ** 0.5 * scale, rtol=TOL[dtype] * 8,
                                   msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_gradcheck_and_gradgradcheck_float64(kind):
    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(3, 6, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))
    a, sh = (torch.tensor(v, dtype=torch.float64).requires_grad_() for v in (0.6, 0.1))
    w, b = (torch.randn(6, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))

    def op(x, r, a, sh, w, b):
        return torch.ops.addnorm.add_pointwise_norm(x, r, a, sh if kind == "derf" else None, w, b, kind)

    args = (x, r, a, sh, w, b)
    assert torch.autograd.gradcheck(op, args)
    assert torch.autograd.gradgradcheck(op, args)


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_opcheck(kind):
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(4, 24, generator=g).requires_grad_() for _ in range(2))
    a, sh = torch.tensor(0.5, requires_grad=True), torch.tensor(0.2, requires_grad=True)
    w, b = (torch.randn(24, generator=g).requires_grad_() for _ in range(2))
    shift = sh if kind == "derf" else None
    torch.library.opcheck(torch.ops.addnorm.add_pointwise_norm.default, (x, r, a, shift, w, b, kind))
    torch.library.opcheck(torch.ops.addnorm.add_pointwise_norm.default, (x, None, a, shift, None, b, kind))
    y, s = torch.ops.addnorm.add_pointwise_norm(x.detach(), r.detach(), a.detach(), shift, w.detach(), b.detach(),
                                                 kind)
    torch.library.opcheck(torch.ops.addnorm.add_pointwise_norm_backward.default,
                          (torch.randn_like(y), torch.randn_like(s), s, a.detach(),
                           None if shift is None else shift.detach(), w.detach(), b.detach(), kind,
                           [True, shift is not None, True, True]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_forward_ad_matches_the_composite(kind, backend):
    g = torch.Generator().manual_seed(2)
    prim = [torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g), torch.tensor(0.7), torch.tensor(0.1),
            torch.randn(16, generator=g), torch.randn(16, generator=g)]
    tans = [torch.randn_like(p) for p in prim]

    def ref(x, r, a, sh, w, b):
        s = x + r
        u = a * s + (sh if kind == "derf" else 0)
        return w * (torch.tanh(u) if kind == "dyt" else torch.erf(u)) + b, s

    with fwAD.dual_level():
        d = [fwAD.make_dual(p, t) for p, t in zip(prim, tans, strict=True)]
        y, s = _call(kind, d[0], d[1], d[2], d[3], d[4], d[5], backend)
        got = [fwAD.unpack_dual(t).tangent for t in (y, s)]
    _, exp = torch.func.jvp(ref, tuple(prim), tuple(tans))
    for a_, e in zip(got, exp, strict=True):
        torch.testing.assert_close(a_, e, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_compile_fullgraph_keeps_the_operator():
    seen = set()
    backend = addnorm_ops_backend(seen)

    from addnorm.nn import Derf

    m = Derf(32)
    x, r = torch.randn(4, 8, 32, requires_grad=True), torch.randn(4, 8, 32, requires_grad=True)
    eager = torch.autograd.grad(m(x, r)[0].sum(), [x, m.alpha, m.shift, m.weight])
    torch._dynamo.reset()
    comp = torch.autograd.grad(torch.compile(m, backend=backend, fullgraph=True)(x, r)[0].sum(),
                               [x, m.alpha, m.shift, m.weight])
    assert {"addnorm.add_pointwise_norm.default", "addnorm.add_pointwise_norm_backward.default"} <= seen
    for a_, e in zip(comp, eager, strict=True):
        torch.testing.assert_close(a_, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_special_values(kind, backend):
    x = torch.tensor([[0.0, 1e-30, -3e-4, 50.0, -50.0, float("inf"), float("-inf"), float("nan")]])
    a = torch.tensor(1.0)
    y, _ = _call(kind, x, None, a, torch.tensor(0.0), None, None, backend)
    f = torch.tanh if kind == "dyt" else torch.erf
    torch.testing.assert_close(y, f(x), atol=2e-7, rtol=3e-7, equal_nan=True)



@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_f_keeps_its_relative_accuracy_at_every_magnitude(kind, backend):
    """f(u) within a few float32 ulps of the float64 truth from 1e-38 to 9, both signs, and so the weight's
    gradient sum(dy f(u)). An absolute tolerance (test_special_values') hides a small u's relative error: the
    Triton DyT took tanh as (1 - e) / (1 + e) at every u, which gave 0 at 1e-8 and was 1.3 % off at 1e-6."""
    rng = np.random.default_rng(0)
    mag = np.exp(rng.uniform(math.log(1e-38), math.log(9.0), 3000))
    u = np.concatenate([mag, -mag, np.linspace(-9, 9, 2001)]).astype(np.float32)
    truth = np.tanh(u.astype(np.float64)) if kind == "dyt" else ERF(u.astype(np.float64))
    ulp = np.spacing(np.abs(truth).astype(np.float32)).astype(np.float64)
    x = torch.from_numpy(u).view(1, -1)
    w = torch.ones(x.shape[1], requires_grad=True)
    y, _ = _call(kind, x, None, torch.tensor(1.0), torch.tensor(0.0), w, None, backend)
    (dw,) = torch.autograd.grad(y, [w], torch.ones_like(y))
    for got, what in ((y, "y"), (dw, "dweight")):
        err = np.abs(got.detach().double().numpy().ravel() - truth) / ulp
        assert err.max() <= 4.0, f"{what}: {err.max():.1f} ulp at u = {u[err.argmax()]!r}"

@pytest.mark.parametrize("call, match", [
    (lambda x: add_dyt(x, None, True), "alpha must be a number or a one-element torch.Tensor"),
    (lambda x: add_dyt(x, None, torch.ones(2)), "alpha must be a one-element"),
    (lambda x: add_derf(x, None, torch.tensor(0.5), "0.1"), "shift must be a number or a one-element torch.Tensor"),
    (lambda x: add_dyt(x, torch.randn(3, 7), torch.tensor(0.5)), "residual must have x's shape"),
    (lambda x: add_dyt(x, None, torch.tensor(0.5), torch.randn(5)), "weight of shape \\(5,\\) must equal the trailing"),
    (lambda x: add_dyt(x.long(), None, torch.tensor(0.5)), "x must be a floating-point tensor"),
    (lambda x: add_dyt(x, None, torch.tensor(0.5), backend="gpu"), "backend"),
])
def test_bad_input_is_refused_naming_the_argument(call, match):
    with pytest.raises((TypeError, ValueError, RuntimeError), match=match):
        call(torch.randn(3, 8))


ISA_SCRIPT = """
import sys, torch, addnorm
from addnorm.functional import add_derf, add_dyt
g = torch.Generator().manual_seed(0)
dt = getattr(torch, sys.argv[1])
x, r = (torch.randn(37, 1029, generator=g).mul(3).to(dt).requires_grad_() for _ in range(2))
a, sh = torch.tensor(0.7, requires_grad=True), torch.tensor(0.1, requires_grad=True)
w, b = (torch.randn(1029, generator=g).requires_grad_() for _ in range(2))
out = {"isa": addnorm.cpu_kernel_availability().isa}
for name, (y, s) in (("dyt", add_dyt(x, r, a, w, b, backend="cpu")), ("derf", add_derf(x, r, a, sh, w, b, backend="cpu"))):
    out[name] = (y,) + torch.autograd.grad((y.float() * torch.linspace(-1, 1, 1029)).sum(), [x, a, w, b])
torch.save(out, sys.argv[2])
"""


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_instruction_set_variant_agrees(tmp_path, dtype):
    tol = {"float32": 2e-6, "bfloat16": 1.6e-2}[dtype]
    assert_every_isa_agrees(run_under_every_isa(ISA_SCRIPT, tmp_path, dtype), {"dyt": tol * 50, "derf": tol * 50}, tol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("D", [1, 3, 64])
def test_repeated_calls_give_the_same_gradients(D, backend):
    """Scratch memory is kept between calls: every accumulator must start from zero on every call (a stale
    dshift once summed over calls when D = 1)."""
    from addnorm.functional import parallel_add_layer_norm

    g = torch.Generator().manual_seed(5)
    x, r = (torch.randn(7, D, generator=g).requires_grad_() for _ in range(2))
    a, sh = torch.tensor(0.8, requires_grad=True), torch.tensor(-0.2, requires_grad=True)
    w, b = (torch.randn(D, generator=g).requires_grad_() for _ in range(2))
    first = None
    for _ in range(3):
        y, _ = add_derf(x, r, a, sh, w, b, backend=backend)
        y2, y3, s = parallel_add_layer_norm(x, r, x, D, w, b, w, b, backend=backend)
        loss = y.sum() + (y2 * y3).sum() + s.sum()
        grads = torch.autograd.grad(loss, [x, a, sh, w, b])
        if first is None:
            first = grads
        for a_, e in zip(grads, first, strict=True):
            assert torch.equal(a_, e)
