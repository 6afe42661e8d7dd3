"""The projection phi as a model holds it: HF's hyper-connections keep their weight (m, nC) and pass its transpose,
a strided view. The C kernels take that view as it lies (``kernels.cpu.mhc``: the kernel pads the transpose itself),
with the same bits as a contiguous phi forward and backward, and without a host copy of the weight on each call --
at one decoded token that copy was most of the read's time."""

import math

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from addnorm.functional import mhc_pre
from addnorm.kernels.cpu import mhc as cpu_mhc
from tests.backends import KERNELS

pytestmark = pytest.mark.skipif("cpu" not in KERNELS, reason="the C kernels are not built here")


def _args(lead, n, C, m_groups, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = n * n + 2 * n if m_groups == 3 else m_groups * n
    x = torch.randn(*lead, n, C, generator=g)
    weight = torch.randn(m, n * C, generator=g) / math.sqrt(n * C)  # the model's layout: (m, nC)
    return x, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,C,lead", [(4, 33, (2, 3)), (4, 2048, (1, 1)), (2, 7, (5,))])
def test_transposed_weight_gives_the_contiguous_bits(dtype, n, C, lead):
    x, weight = _args(lead, n, C, 3)
    m = weight.shape[0]
    coeffs = [torch.tensor(v) for v in (0.8, 0.6, 1.1)] + [0.5 * torch.randn(n), 0.5 * torch.randn(n),
                                                           0.5 * torch.randn(n, n)]
    outs, grads = [], []
    for phi in (weight.t(), weight.t().contiguous()):
        xi = x.to(dtype).requires_grad_()
        phi = phi.detach().requires_grad_()
        out = mhc_pre(xi, phi, *coeffs, backend="cpu")
        torch.autograd.backward([o for o in out], [torch.ones_like(o) for o in out])
        outs.append(out)
        grads.append((xi.grad, phi.grad))
    assert outs[0][0].shape[-1] == C and m == 2 * n + n * n
    for a, b in zip(outs[0], outs[1], strict=True):
        assert torch.equal(a, b)
    for a, b in zip(grads[0], grads[1], strict=True):
        assert torch.equal(a, b)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        held = {a.untyped_storage().data_ptr() for a in pytree.tree_leaves((args, kwargs))
                if isinstance(a, torch.Tensor)}
        if isinstance(out, torch.Tensor) and out.untyped_storage().data_ptr() not in held:  # new memory, no view
            self.calls.append((str(func), tuple(out.shape)))
        return out


@pytest.mark.parametrize("groups", [1, 2, 3])
def test_the_host_copies_no_transposed_weight(groups):
    """The host entry builds its outputs and hands the weight over as it lies: no op makes a (nC, m) tensor."""
    n, C = 4, 256
    x, weight = _args((1, 1), n, C, groups)
    m = weight.shape[0]
    r = n * n if groups == 3 else 0
    scal, bias = torch.tensor([0.8, 0.6 if groups > 1 else 0.0, 1.1 if groups == 3 else 0.0]), torch.randn(m)
    with _Ops() as ops:
        out = cpu_mhc.mhc_pre(x, weight.t(), scal, bias, None, 1e-6, 20 if r else 0, 0.0, 0.0, False, 2.0, 0.0,
                              groups)
    big = [c for c in ops.calls if math.prod(c[1]) >= n * C * m]
    assert not big, f"the host copied the weight: {big}"
    ref = cpu_mhc.mhc_pre(x, weight.t().contiguous(), scal, bias, None, 1e-6, 20 if r else 0, 0.0, 0.0, False, 2.0,
                          0.0, groups)
    for a, b in zip(out, ref, strict=True):
        assert torch.equal(a, b)
