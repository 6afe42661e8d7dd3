"""The fused forms' Triton kernels compiled for a GPU: every new operator on CUDA tensors against the float64
formulas on the CPU, forward and backward, float32 and bfloat16. Needs CUDA (and Triton): skipped without
it -- CI has no GPU; the same kernels run under Triton's interpreter in every other test."""

import pytest
import torch

import addnorm
from addnorm.ops import fused_formulas, pointwise_formulas, stream_formulas

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def _both(*shapes, dtype):
    g = torch.Generator().manual_seed(0)
    cpu = [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]
    return cpu, [t.to("cuda", dtype).requires_grad_() for t in cpu]


def _check(got, ref, dtype):
    for a, e in zip(got, ref, strict=True):
        if a is None:
            continue
        scale = 1 + e.abs().max().item() if e.numel() else 1
        torch.testing.assert_close(a.detach().double().cpu(), e.detach(), atol=TOL[dtype] * scale, rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("D", [7, 768, 5000])
def test_norm_add_and_parallel(D, dtype):
    cpu, dev = _both((33, D), (33, D), (33, D), (D,), (D,), (D,), (D,), dtype=dtype)
    y, y2, s = addnorm.parallel_add_layer_norm(dev[0], dev[1], dev[2], D, *dev[3:], backend="triton")
    o = addnorm.layer_norm_add(dev[0], dev[2], D, dev[3], dev[4], backend="triton")
    loss = (y.float() ** 2).sum() + (y2.float() * 0.5).sum() + s.float().sum() + (o.float() ** 2).sum()
    got = [y, y2, s, o, *torch.autograd.grad(loss, dev)]
    c = [t.clone().requires_grad_() for t in cpu]
    ry, ry2, rs, _ = fused_formulas.parallel_add_norm(c[0], c[1], c[2], *c[3:], "layer", 1, 1e-5, 0.0, False, True,
                                                      True)
    ro, _ = fused_formulas.norm_add(c[0], c[2], c[3], c[4], "layer", 1, 1e-5, 0.0, False)
    rloss = (ry ** 2).sum() + (ry2 * 0.5).sum() + rs.sum() + (ro ** 2).sum()
    _check(got, [ry, ry2, rs, ro, *torch.autograd.grad(rloss, c)], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_dyt_and_derf(kind, dtype):
    cpu, dev = _both((33, 768), (33, 768), (768,), (768,), dtype=dtype)
    a, sh = torch.tensor(0.7, device="cuda", requires_grad=True), torch.tensor(0.1, device="cuda", requires_grad=True)
    fn = addnorm.add_dyt if kind == "dyt" else addnorm.add_derf
    extra = (sh,) if kind == "derf" else ()
    y, s = fn(dev[0], dev[1], a, *extra, dev[2], dev[3], backend="triton")
    ins = [*dev, a, *extra]
    got = [y, s, *torch.autograd.grad((y.float() ** 2).sum() + s.float().sum(), ins)]
    c = [t.clone().requires_grad_() for t in cpu]
    ca, csh = torch.tensor(0.7, dtype=torch.float64, requires_grad=True), torch.tensor(0.1, dtype=torch.float64,
                                                                                    requires_grad=True)
    ry, rs = pointwise_formulas.forward(c[0], c[1], ca, csh if kind == "derf" else None, c[2], c[3], kind)
    rins = [*c, ca] + ([csh] if kind == "derf" else [])
    _check(got, [ry, rs, *torch.autograd.grad((ry ** 2).sum() + rs.sum(), rins)], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_stream_read_and_write(dtype):
    cpu, dev = _both((65, 4, 768), (65, 768), dtype=dtype)
    g = torch.Generator().manual_seed(1)
    coeffs = [torch.rand(65, 4, generator=g), torch.rand(65, 4, generator=g), torch.rand(65, 4, 4, generator=g)]
    cdev = [t.cuda().requires_grad_() for t in coeffs]
    h = addnorm.stream_read(dev[0], cdev[0], backend="triton")
    x2, q = addnorm.stream_write(dev[0], dev[1], cdev[1], cdev[2], backend="triton")
    loss = (h.float() ** 2).sum() + (x2.float() * 0.5).sum() + q.sum() * 1e-3
    got = [h, x2, q, *torch.autograd.grad(loss, dev + cdev)]
    c = [t.clone().requires_grad_() for t in cpu]
    cc = [t.double().requires_grad_() for t in coeffs]
    rh = stream_formulas.read(c[0], cc[0])
    rx2, rq = stream_formulas.write(c[0], c[1], cc[1], cc[2])
    rloss = (rh ** 2).sum() + (rx2 * 0.5).sum() + rq.sum() * 1e-3
    _check(got, [rh, rx2, rq, *torch.autograd.grad(rloss, c + cc)], dtype)
