"""out= / residual_out= buffers that overlap themselves or a parameter; buffers checked by the product of
the normalized dims; weight gradients as close to float64 as torch's at any row count."""

import pytest
import torch
import torch.nn.functional as F

import addnorm

from backends import KERNELS as KERNEL_BACKENDS

KERNELS = addnorm.cpu_kernel_availability().available


def test_expanded_residual_written_in_place_is_refused():
    r = torch.randn(1, 8).expand(4, 8)
    with pytest.raises(ValueError, match="residual_out overlaps itself"):
        addnorm.add_rms_norm(torch.randn(4, 8), r, 8, residual_out=r)
    with pytest.raises(ValueError, match="out overlaps itself"):
        addnorm.layer_norm(torch.randn(4, 8), 8, out=torch.empty(8).expand(4, 8))
    rows = torch.empty(64).as_strided((4, 8), (4, 1))  # rows 4 apart, 8 long: they share elements
    with pytest.raises(ValueError, match="out overlaps itself"):
        addnorm.layer_norm(torch.randn(4, 8), 8, out=rows)


def test_buffer_over_a_parameter_is_refused():
    w = torch.randn(4, 8)
    with pytest.raises(ValueError, match="out overlaps weight"):
        addnorm.rms_norm(torch.randn(4, 8), 8, w[0], out=w)
    b = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="residual_out overlaps bias"):
        addnorm.add_layer_norm(torch.randn(4, 8), torch.randn(4, 8), 8, None, b[1], residual_out=b)


def test_buffers_are_checked_by_the_product_of_normalized_dims():
    x = torch.randn(4, 2, 8)
    ok = torch.empty(4, 2, 8)
    torch.testing.assert_close(addnorm.layer_norm(x, (2, 8), out=ok), F.layer_norm(x, (2, 8)))
    gappy = torch.empty(4, 2, 16)[..., :8]  # rows of 8 viewable, but not rows of 16
    with pytest.raises(ValueError, match=r"viewable as \(rows, 16\)"):
        addnorm.layer_norm(x, (2, 8), out=gappy)


def test_in_place_update_of_the_stream_is_exact():
    x, r = torch.randn(6, 32), torch.randn(6, 32)
    want_y, want_s = addnorm.add_layer_norm(x, r, 32)
    y, s = addnorm.add_layer_norm(x, r, 32, residual_out=r)
    assert s is r and torch.equal(s, want_s) and torch.equal(y, want_y)


@pytest.mark.parametrize("backend, rows", [(b, n) for b in KERNEL_BACKENDS for n in (8192, 65536)
                                           if b == "cpu" or n == 8192])  # the interpreter: 8192 rows take ~3 s
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_weight_gradients_as_close_to_float64_as_torch(kind, backend, rows):
    g = torch.Generator().manual_seed(rows)
    D = 64
    x = torch.randn(rows, D, generator=g) * 3 + 1
    w, b = torch.randn(D, generator=g), torch.randn(D, generator=g)
    dy = torch.randn(rows, D, generator=g)

    def grads(fn, dtype, backend=None):
        xx, ww, bb = (t.to(dtype).requires_grad_() for t in (x, w, b))
        kw = {} if backend is None else {"backend": backend}
        y = fn(xx, ww, bb, **kw)
        return torch.autograd.grad(y, (ww, bb) if kind == "layer" else (ww,), dy.to(dtype))

    if kind == "layer":
        ours_fn = lambda xx, ww, bb, **kw: addnorm.layer_norm(xx, D, ww, bb, **kw)  # noqa: E731
        torch_fn = lambda xx, ww, bb: F.layer_norm(xx, (D,), ww, bb)  # noqa: E731
    else:
        ours_fn = lambda xx, ww, bb, **kw: addnorm.rms_norm(xx, D, ww, eps=1e-6, **kw)  # noqa: E731
        torch_fn = lambda xx, ww, bb: F.rms_norm(xx, (D,), ww, eps=1e-6)  # noqa: E731
    ref = grads(torch_fn, torch.float64)
    theirs = grads(torch_fn, torch.float32)
    ours = grads(ours_fn, torch.float32, backend)
    again = grads(ours_fn, torch.float32, backend)
    for o, t, r, a in zip(ours, theirs, ref, again):
        assert torch.equal(o, a)  # deterministic
        e_ours, e_torch = (o.double() - r).abs().max().item(), (t.double() - r).abs().max().item()
        assert e_ours <= e_torch, f"addnorm {e_ours:.3g} vs torch {e_torch:.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("backend", KERNEL_BACKENDS + ["torch"])
def test_layer_norm_of_size_one_has_zero_weight_gradient(dtype, backend):
    x, w, b = torch.randn(5, 1).to(dtype), torch.randn(1).to(dtype), torch.randn(1).to(dtype)
    xx, ww, bb = (t.clone().requires_grad_() for t in (x, w, b))
    y = addnorm.layer_norm(xx, 1, ww, bb, backend=backend)
    gw, gx = torch.autograd.grad(y.sum(), (ww, xx))
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    gw_ref, gx_ref = torch.autograd.grad(F.layer_norm(xr, (1,), wr, br).sum(), (wr, xr))
    assert torch.equal(gw, gw_ref) and torch.equal(gx, gx_ref)


@pytest.mark.parametrize("backend", [*KERNEL_BACKENDS, "torch"])
def test_buffers_written_bump_their_version_as_torch_out_does(backend):
    """out= / residual_out= are in-place writes: the kernels wrote them through their pointers and left the version
    counters alone, so a backward that had saved a buffer ran on its new values and gave a wrong gradient."""
    x, r = torch.randn(4, 8), torch.randn(4, 8)
    p = torch.randn(4, 8, requires_grad=True)
    a = p * 2
    loss = (a * a).sum()  # saves a
    with torch.no_grad():
        addnorm.rms_norm(x, 8, out=a, backend=backend)
    assert a._version == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    res = p * 3
    loss = (res * res).sum()
    with torch.no_grad():
        addnorm.add_layer_norm(x, res, 8, residual_out=res, backend=backend)  # the stream updated in place
    assert res._version == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_buffer_that_requires_grad_is_refused_with_grad_mode_on():
    """torch.add(x, 1, out=o) with o requiring grad raises; the kernels wrote into o."""
    x = torch.randn(4, 8)
    o = torch.zeros(4, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="out= and residual_out= do not support automatic differentiation"):
        addnorm.rms_norm(x, 8, out=o)
    assert not o.detach().any()
    with torch.no_grad():  # as torch allows it
        addnorm.rms_norm(x, 8, out=o)
    torch.testing.assert_close(o.detach(), F.rms_norm(x, (8,)))
