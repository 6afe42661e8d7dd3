"""``torch.autograd.grad(..., is_grads_batched=True)`` through every fused operator family: the backward runs under
vmap, so the incoming gradients are batched wrappers with no storage. The kernels' backward read their data
pointers ("Cannot access data pointer of Tensor that doesn't have storage"); such gradients now go to the torch-op
backward, which vmap batches (``ops.norm.autograd.differentiable_backward``). Judged against float64 torch."""

import pytest
import torch

from tests.backends import KERNELS
from tests.ops.test_forward_over_reverse import D, _fns


@pytest.mark.parametrize("op", list(_fns("torch")))
@pytest.mark.parametrize("backend", KERNELS)
def test_batched_incoming_gradients(backend, op):
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(3, D, generator=g)
    x = x0.clone().requires_grad_()
    y = _fns(backend)[op](x)
    v = torch.randn(4, *y.shape, generator=g)
    (got,) = torch.autograd.grad(y, x, v, is_grads_batched=True)
    x64 = x0.double().requires_grad_()
    (ref,) = torch.autograd.grad(_fns("torch")[op](x64), x64, v.double(), is_grads_batched=True)
    torch.testing.assert_close(got.double(), ref, atol=1e-4, rtol=1e-4)
