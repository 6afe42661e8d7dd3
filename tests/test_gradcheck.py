"""gradcheck and gradgradcheck in float64 for every differentiable function of the torch API."""

import pytest
import torch

import addnorm

D = 6


def _inputs(affine, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, D, dtype=torch.float64, generator=g, requires_grad=True)
    r = torch.randn(3, D, dtype=torch.float64, generator=g, requires_grad=True)
    w = (1 + torch.randn(D, dtype=torch.float64, generator=g)).requires_grad_() if affine else None
    b = torch.randn(D, dtype=torch.float64, generator=g).requires_grad_() if affine else None
    return x, r, w, b


FUNCS = {
    "layer_norm": lambda x, r, w, b: addnorm.layer_norm(x, D, w, b),
    "rms_norm": lambda x, r, w, b: addnorm.rms_norm(x, D, w, 1e-6),
    "add_layer_norm": lambda x, r, w, b: addnorm.add_layer_norm(x, r, D, w, b),
    "add_rms_norm": lambda x, r, w, b: addnorm.add_rms_norm(x, r, D, w, 1e-6),
    "rms_norm_gemma": lambda x, r, w, b: addnorm.rms_norm(x, D, w, 1e-6, weight_offset=1.0),
    "add_layer_norm_gemma": lambda x, r, w, b: addnorm.add_layer_norm(x, r, D, w, b, weight_offset=1.0),
    "rms_norm_llama_order": lambda x, r, w, b: addnorm.rms_norm(x, D, w, 1e-6, cast_before_weight=True),
    "tutorial_layer_norm": lambda x, r, w, b: addnorm.tutorial_layer_norm(x, w, b),
}


@pytest.mark.parametrize("name", list(FUNCS))
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
def test_gradcheck_and_gradgradcheck(name, affine):
    x, r, w, b = _inputs(affine)
    fn = FUNCS[name]
    if name.startswith("add_"):
        inputs = [t for t in (x, r, w, b) if t is not None]
    else:
        inputs = [t for t in (x, w, b) if t is not None]

    def f(*args):
        it = iter(args)
        xx = next(it)
        rr = next(it) if name.startswith("add_") else None
        ww = next(it) if affine else None
        bb = next(it) if affine else None
        return fn(xx, rr, ww, bb)

    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)
    assert addnorm.last_backend() == "torch"


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_cpu_kernel_backward_is_differentiable_again(name):
    """create_graph=True through the fused kernel gives a differentiable gradient equal to torch's."""
    torch.manual_seed(0)
    fn = getattr(addnorm, name)
    x0, r0 = torch.randn(3, 8), torch.randn(3, 8)
    w0, b0 = torch.randn(8), torch.randn(8)

    def second(backend):
        x, r, w, b = (t.clone().requires_grad_() for t in (x0, r0, w0, b0))
        extra = (b,) if "layer" in name else ()
        args = (x, r) if name.startswith("add_") else (x,)
        y = fn(*args, 8, w, *extra, backend=backend)
        y = y[0] if isinstance(y, tuple) else y
        gx, gw = torch.autograd.grad(y.pow(3).sum(), (x, w), create_graph=True)
        assert gx.requires_grad and gw.requires_grad
        return torch.autograd.grad(gx.pow(2).sum() + gw.sin().sum(), (x, w) + args[1:])

    for a, b in zip(second("cpu"), second("torch")):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
