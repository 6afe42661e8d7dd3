"""A Hessian-vector product taken forward-over-reverse (a gradient inside a forward-mode AD level) through every
fused operator family: the kernels' backward reads primal values only, so the tangents of the saved tensors and of
the incoming gradients were dropped -- the gradient came back with no tangent (H v = 0), silently. Every backward
now runs as torch ops inside a dual level (``ops.norm.autograd.differentiable_backward``); judged against float64
double backward of the same function."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import addnorm
from addnorm.functional import add_dyt, layer_norm_add, mhc_pre, parallel_add_rms_norm, stream_read, stream_write
from tests.backends import KERNELS

D = 16


def _fns(backend):
    g = torch.Generator().manual_seed(0)
    w, b = 1 + 0.3 * torch.randn(D, generator=g), 0.2 * torch.randn(D, generator=g)
    r = torch.randn(3, D, generator=g)
    X = torch.randn(3, 4, D, generator=g)
    hp, hpo, hr = torch.rand(3, 4, generator=g), torch.rand(3, 4, generator=g), torch.rand(3, 4, 4, generator=g)
    phi = torch.randn(4 * D, 24, generator=g) / 8
    coeffs = (torch.tensor(0.8), torch.tensor(0.6), torch.tensor(1.1), torch.zeros(4), torch.zeros(4),
              torch.zeros(4, 4))
    c = lambda *ts: [t.to(ts[0].dtype) for t in ts[1:]]  # noqa: E731  (parameters in the input's dtype)
    return {
        "add_layer_norm": lambda x: addnorm.add_layer_norm(x, r.to(x.dtype), D, *c(x, w, b), backend=backend)[0],
        "layer_norm_add": lambda x: layer_norm_add(x, r.to(x.dtype), D, *c(x, w, b), backend=backend),
        "parallel_add_rms_norm": lambda x: parallel_add_rms_norm(x, x * 0.5, r.to(x.dtype), D, *c(x, w),
                                                                 backend=backend)[0],
        "add_dyt": lambda x: add_dyt(x, r.to(x.dtype), torch.tensor(0.7, dtype=x.dtype), *c(x, w, b),
                                     backend=backend)[0],
        "stream_read": lambda x: stream_read(X.to(x.dtype) * x.unsqueeze(-2), hp.to(x.dtype), backend=backend),
        "stream_write": lambda x: stream_write(X.to(x.dtype) * x.unsqueeze(-2), x, hpo.to(x.dtype), hr.to(x.dtype),
                                               backend=backend)[0],
        "mhc_pre": lambda x: mhc_pre(X.to(x.dtype) * x.unsqueeze(-2), *c(x, phi, *coeffs), backend=backend)[0],
    }


@pytest.mark.parametrize("op", list(_fns("torch")))
@pytest.mark.parametrize("backend", KERNELS)
def test_hessian_vector_product_forward_over_reverse(backend, op):
    g = torch.Generator().manual_seed(1)
    x0, v = torch.randn(3, D, generator=g), torch.randn(3, D, generator=g)
    f = _fns(backend)[op]
    x = x0.clone().requires_grad_()
    with fwAD.dual_level():
        xd = fwAD.make_dual(x, v)
        (gx,) = torch.autograd.grad((f(xd) ** 2).sum(), xd)
        hv = fwAD.unpack_dual(gx).tangent
    x64 = x0.double().requires_grad_()
    (g64,) = torch.autograd.grad((_fns("torch")[op](x64) ** 2).sum(), x64, create_graph=True)
    (hv64,) = torch.autograd.grad(g64, x64, v.double())
    assert hv is not None, "the gradient carries no tangent: H v was dropped"
    torch.testing.assert_close(gx.double(), g64.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(hv.double(), hv64, atol=2e-4, rtol=2e-4)
