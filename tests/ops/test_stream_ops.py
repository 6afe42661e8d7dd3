"""The widened stream's read and write (``addnorm.functional.stream``): every backend against a float64 oracle
written here from the equations, PyTorch's operator checks, gradcheck, transforms and bad input."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD

from addnorm.functional import stream_read, stream_write
from tests.backends import BACKENDS, KERNELS
from tests.compile_spy import addnorm_ops_backend
from tests.isa_paths import assert_every_isa_agrees, run_under_every_isa

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
CASES = [((2, 3), 4, 33), ((5,), 1, 8), ((2,), 8, 7), ((0, 3), 4, 16), ((), 2, 1), ((4,), 3, 769)]


def _oracle(x, y, hp, hpo, hr):
    x, y, hp, hpo, hr = (t.double() for t in (x, y, hp, hpo, hr))
    h = torch.einsum("...i,...ic->...c", hp, x)
    x2 = torch.einsum("...ij,...jc->...ic", hr, x) + hpo[..., :, None] * y[..., None, :]
    return h, x2, (x2 * x2).sum((-2, -1))


def _make(lead, n, C, dtype, layout="contiguous", seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x = r(*lead, n, C)
    if layout == "permuted" and C > 1:  # a stream whose C axis is not contiguous
        x = r(*lead, C, n).transpose(-1, -2)
    return (x.to(dtype).requires_grad_(), r(*lead, C).to(dtype).requires_grad_(),
            torch.rand(*lead, n, generator=g).requires_grad_(), (2 * torch.rand(*lead, n, generator=g)).requires_grad_(),
            torch.softmax(r(*lead, n, n), -1).float().requires_grad_())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
@pytest.mark.parametrize("lead, n, C", CASES)
def test_read_and_write_match_the_float64_oracle(lead, n, C, layout, dtype, backend):
    x, y, hp, hpo, hr = _make(lead, n, C, dtype, layout)
    h = stream_read(x, hp, backend=backend)
    x2, q = stream_write(x, y, hpo, hr, backend=backend)
    assert h.shape == x.shape[:-2] + (C,) and h.dtype == dtype and x2.shape == x.shape and x2.dtype == dtype
    assert q.shape == x.shape[:-2] and q.dtype == torch.float32
    h64, x264, _ = _oracle(x, y, hp, hpo, hr)
    tol = TOL[dtype]
    torch.testing.assert_close(h.double(), h64, atol=tol * 4, rtol=tol)
    torch.testing.assert_close(x2.double(), x264, atol=tol * 4, rtol=tol)
    torch.testing.assert_close(q.double(), (x2.double() ** 2).sum((-2, -1)), atol=1e-3, rtol=1e-5)  # X' as stored
    g = torch.Generator().manual_seed(1)
    uh, ux2 = torch.randn(h.shape, generator=g, dtype=torch.float64), torch.randn(x2.shape, generator=g,
                                                                                 dtype=torch.float64)
    uq = torch.randn(q.shape, generator=g, dtype=torch.float64)
    ins = [x, y, hp, hpo, hr]
    got = torch.autograd.grad((h.double() * uh).sum() + (x2.double() * ux2).sum() + (q.double() * uq).sum(), ins)
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    h64, x264, q64 = _oracle(*ins64)
    exp = torch.autograd.grad((h64 * uh).sum() + (x264 * ux2).sum() + (q64 * uq).sum(), ins64)
    for name, a, e in zip(("x", "y", "h_pre", "h_post", "h_res"), got, exp, strict=True):
        scale = 1 + (e.abs().max().item() if e.numel() else 0.0)
        torch.testing.assert_close(a.double(), e, atol=tol * 8 * scale, rtol=tol * 4, msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, C", [(2, 33), (4, 769), (3, 40)])
def test_write_backward_without_q_matches_the_float64_oracle(n, C, dtype, backend):
    """The model's case: X' alone is used (no gradient for q), so the kernels read dX' where it lies (float32) and
    never read X'."""
    x, y, _, hpo, hr = _make((3, 5), n, C, dtype, seed=4)
    x2, _ = stream_write(x, y, hpo, hr, backend=backend)
    u = torch.randn(x2.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ins = [x, y, hpo, hr]
    got = torch.autograd.grad((x2.double() * u).sum(), ins)
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    exp = torch.autograd.grad((_oracle(ins64[0], ins64[1], ins64[2], ins64[2], ins64[3])[1] * u).sum(), ins64)
    tol = TOL[dtype]
    for name, a, e in zip(("x", "y", "h_post", "h_res"), got, exp, strict=True):
        scale = 1 + e.abs().max().item()
        torch.testing.assert_close(a.double(), e, atol=tol * 8 * scale, rtol=tol * 4, msg=name)


@pytest.mark.parametrize("backend", ["op", "torch"])
def test_gradcheck_and_gradgradcheck_float64(backend):
    x, y, hp, hpo, hr = (t.detach().double().requires_grad_() for t in _make((2,), 3, 5, torch.float64))

    def f(x, y, hp, hpo, hr):
        if backend == "op":
            return (torch.ops.addnorm.stream_read(x, hp), *torch.ops.addnorm.stream_write(x, y, hpo, hr))
        return (stream_read(x, hp, backend="torch"), *stream_write(x, y, hpo, hr, backend="torch"))

    assert torch.autograd.gradcheck(f, (x, y, hp, hpo, hr))
    assert torch.autograd.gradgradcheck(f, (x, y, hp, hpo, hr))


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_opcheck():
    x, y, hp, hpo, hr = _make((2, 3), 4, 24, torch.float32)
    torch.library.opcheck(torch.ops.addnorm.stream_read.default, (x, hp))
    torch.library.opcheck(torch.ops.addnorm.stream_write.default, (x, y, hpo, hr))
    d = torch.randn(2, 3, 24)
    torch.library.opcheck(torch.ops.addnorm.stream_read_backward.default, (d, x.detach(), hp.detach()))
    x2, _ = torch.ops.addnorm.stream_write(x.detach(), y.detach(), hpo.detach(), hr.detach())
    for dq in (None, torch.randn(2, 3)):
        torch.library.opcheck(torch.ops.addnorm.stream_write_backward.default,
                              (torch.randn_like(x2), dq, x.detach(), y.detach(), x2, hpo.detach(), hr.detach()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_ad_matches_the_oracle(backend):
    prim = [t.detach() for t in _make((3,), 4, 16, torch.float32)]
    tans = [torch.randn_like(p) for p in prim]
    with fwAD.dual_level():
        d = [fwAD.make_dual(p, t) for p, t in zip(prim, tans, strict=True)]
        h = stream_read(d[0], d[2], backend=backend)
        x2, q = stream_write(d[0], d[1], d[3], d[4], backend=backend)
        got = [fwAD.unpack_dual(t).tangent for t in (h, x2, q)]
    _, jv = torch.func.jvp(lambda *a: tuple(t.float() for t in _oracle(*a)), tuple(prim), tuple(tans))
    for a, e in zip(got, jv, strict=True):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_compile_fullgraph_keeps_the_stream_operators():
    seen = set()
    backend = addnorm_ops_backend(seen)

    x, y, hp, hpo, hr = _make((2, 3), 4, 32, torch.float32)

    def f(x, y, hp, hpo, hr):
        h = stream_read(x, hp)
        x2, q = stream_write(x, y * h, hpo, hr)
        return x2.sum() + q.sum()

    torch._dynamo.reset()
    eager = torch.autograd.grad(f(x, y, hp, hpo, hr), [x, hr])
    comp = torch.autograd.grad(torch.compile(f, backend=backend, fullgraph=True)(x, y, hp, hpo, hr), [x, hr])
    assert {"addnorm.stream_read.default", "addnorm.stream_write.default", "addnorm.stream_read_backward.default",
            "addnorm.stream_write_backward.default"} <= seen
    for a, e in zip(comp, eager, strict=True):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


def test_vmap_uses_the_composite():
    x, y, hp, hpo, hr = (t.detach() for t in _make((3, 2), 4, 8, torch.float32))
    got = torch.vmap(lambda a, b, c, d, e: stream_write(a, b, d, e)[0])(x, y, hp, hpo, hr)
    torch.testing.assert_close(got.double(), _oracle(x, y, hp, hpo, hr)[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_inf_propagate_per_token(backend):
    x, y, hp, hpo, hr = (t.detach() for t in _make((4,), 2, 8, torch.float32))
    x[1, 0, 3] = float("nan")
    y[2, 5] = float("inf")
    h = stream_read(x, hp, backend=backend)
    x2, q = stream_write(x, y, hpo, hr, backend=backend)
    assert torch.isnan(h[1, 3]) and torch.isfinite(h[0]).all() and torch.isfinite(h[3]).all()
    assert torch.isnan(x2[1, :, 3]).all() and torch.isinf(x2[2, :, 5]).all() and torch.isfinite(x2[0]).all()
    assert torch.isnan(q[1]) and torch.isinf(q[2]) and torch.isfinite(q[[0, 3]]).all()


@pytest.mark.parametrize("call, match", [
    (lambda x, y, p, r: stream_read(x[0, 0, 0], p[0, 0]), "x must be a widened stream"),
    (lambda x, y, p, r: stream_read(x, p[..., :2]), "h_pre must have shape"),
    (lambda x, y, p, r: stream_write(x, y[..., :3], p, r), "y must have shape"),
    (lambda x, y, p, r: stream_write(x, y, p, r[..., :2]), "h_res must have shape"),
    (lambda x, y, p, r: stream_write(x, y.double(), p, r), "y dtype"),
    (lambda x, y, p, r: stream_write(x.long(), y, p, r), "x must be a floating-point tensor"),
    (lambda x, y, p, r: stream_read(x, "p"), "h_pre must be a torch.Tensor"),
    (lambda x, y, p, r: stream_read(x, p, backend="gpu"), "backend"),
])
def test_bad_input_is_refused_naming_the_argument(call, match):
    x, y, p, r = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 8), torch.rand(2, 3, 4), torch.rand(2, 3, 4, 4)
    with pytest.raises((TypeError, ValueError, RuntimeError), match=match):
        call(x, y, p, r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_streams_than_the_kernels_hold_take_the_formulas(backend):
    x, y, hp, hpo, hr = (t.detach() for t in _make((2,), 9, 8, torch.float32))
    h64, x264, _ = _oracle(x, y, hp, hpo, hr)
    torch.testing.assert_close(stream_read(x, hp, backend=backend).double(), h64, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stream_write(x, y, hpo, hr, backend=backend)[0].double(), x264, atol=1e-5, rtol=1e-5)


ISA_SCRIPT = """
import sys, torch, addnorm
from addnorm.functional import stream_read, stream_write
g = torch.Generator().manual_seed(0)
dt = getattr(torch, sys.argv[1])
x = torch.randn(37, 4, 1029, generator=g).to(dt).requires_grad_()
y = torch.randn(37, 1029, generator=g).to(dt).requires_grad_()
hp, hpo = (torch.rand(37, 4, generator=g).requires_grad_() for _ in range(2))
hr = torch.softmax(torch.randn(37, 4, 4, generator=g), -1).requires_grad_()
h = stream_read(x, hp, backend="cpu")
x2, q = stream_write(x, y, hpo, hr, backend="cpu")
loss = (h.float() * torch.linspace(-1, 1, 1029)).sum() + (x2.float() ** 2).sum() + q.sum() * 1e-3
grads = torch.autograd.grad(loss, [x, y, hp, hpo, hr])
torch.save({"isa": addnorm.cpu_kernel_availability().isa, "h": h, "x2": x2, "q": q, "grads": grads}, sys.argv[2])
"""


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_instruction_set_variant_agrees(tmp_path, dtype):
    tol = {"float32": 1e-5, "bfloat16": 1.6e-2}[dtype]
    assert_every_isa_agrees(run_under_every_isa(ISA_SCRIPT, tmp_path, dtype),
                            {"h": tol * 4, "x2": tol * 4, "q": tol * 4, "grads": tol * 40}, tol)
