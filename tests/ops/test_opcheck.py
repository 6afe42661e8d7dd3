"""torch.library.opcheck -- PyTorch's own checks for a custom operator: the schema (no hidden mutation or
aliasing), the autograd registration, the fake implementation against the real one, and AOT dispatch
with static and dynamic shapes."""

import pytest
import torch

import addnorm  # noqa: F401  (registers the operators)

D = 24


def _cases():
    g = torch.Generator().manual_seed(0)

    def t(*shape, dtype=torch.float32, grad=False):
        return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)

    yield "layer, residual, affine", (t(3, 5, D, grad=True), t(3, 5, D, grad=True), t(D, grad=True),
                                      t(D, grad=True), "layer", 1, 1e-5, 0.0, False, None, False)
    yield "rms, no residual", (t(7, D, grad=True), None, t(D, grad=True), None, "rms", 1, 1e-6, 1.0, True, None,
                               False)
    yield "rms, bf16 beside a float32 stream", (t(4, D, dtype=torch.bfloat16, grad=True), t(4, D, grad=True),
                                                t(D, dtype=torch.bfloat16, grad=True), None, "rms", 1, 1e-6, 0.0,
                                                False, None, False)
    yield "layer, residual_in_fp32, out_dtype", (t(4, D, dtype=torch.bfloat16, grad=True), None, None, None,
                                                 "layer", 1, 1e-5, 0.0, False, torch.float32, True)
    yield "layer over two dims, float64", (t(2, 3, 4, dtype=torch.float64, grad=True), None,
                                           t(3, 4, dtype=torch.float64, grad=True), None, "layer", 2, 1e-5, 0.0,
                                           False, None, False)


@pytest.mark.parametrize("name, args", list(_cases()), ids=[c[0] for c in _cases()])
def test_opcheck_add_norm(name, args):
    torch.library.opcheck(torch.ops.addnorm.add_norm.default, args)


def test_opcheck_add_norm_backward():
    g = torch.Generator().manual_seed(1)
    x, r, w, b = (torch.randn(*s, generator=g) for s in ((6, D), (6, D), (D,), (D,)))
    _, s, stats = torch.ops.addnorm.add_norm(x, r, w, b, "layer", 1, 1e-5, 0.0, False, None, False)
    dy = torch.randn(6, D, generator=g)
    torch.library.opcheck(torch.ops.addnorm.add_norm_backward.default,
                          (dy, None, s, stats, w, b, "layer", 1, 1e-5, 0.0, torch.float32, [True, True, True]))
