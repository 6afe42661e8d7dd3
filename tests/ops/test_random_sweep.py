"""Random calls across the whole option space (dtypes incl. a float32 stream beside 16-bit x, several
normalized dims, strided and empty inputs, absent or differently-typed parameters, Gemma offset, Llama
cast order, out_dtype, residual_in_fp32, expanded upstream gradients): the kernels (backend="cpu") give
the torch backend's outputs, gradients and dtypes."""

import random

import pytest
import torch

import addnorm

pytestmark = pytest.mark.skipif(not addnorm.cpu_kernel_availability().available,
                                reason="the compiled kernels are not built")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _case(rng: random.Random):
    kind = rng.choice(["layer", "rms"])
    add = rng.random() < 0.6
    xdt = rng.choice(DTYPES)
    rdt = torch.float32 if add and xdt != torch.float32 and rng.random() < 0.4 else xdt
    norm_dims = [rng.choice([1, 3, 7, 64, 129, 300]) for _ in range(rng.choice([1, 1, 1, 2]))]
    shape = [rng.choice([0, 1, 2, 5]) for _ in range(rng.choice([0, 1, 2]))] + norm_dims

    def tensor(dt):
        t = torch.randn(*shape).to(dt)
        if rng.random() < 0.3 and t.dim() >= 2:
            t = t.transpose(0, 1).contiguous().transpose(0, 1)  # strided rows
        if rng.random() < 0.2:
            t = torch.randn(*(shape[:-1] + [shape[-1] + 3])).to(dt)[..., :shape[-1]]  # padded rows
        return t

    pdt = rng.choice([xdt, torch.float32])
    return dict(
        kind=kind, x=tensor(xdt), r=tensor(rdt) if add else None,
        w=torch.randn(*norm_dims).to(pdt) if rng.random() < 0.8 else None,
        b=torch.randn(*norm_dims).to(pdt) if kind == "layer" and rng.random() < 0.7 else None,
        ns=tuple(norm_dims) if len(norm_dims) > 1 or rng.random() < 0.5 else norm_dims[0],
        kw=dict(eps=rng.choice([1e-5, 1e-6, 0.1]), weight_offset=rng.choice([0.0, 0.0, 1.0]),
                out_dtype=rng.choice([None, None, torch.float32]), residual_in_fp32=(not add) and rng.random() < 0.3,
                **({"cast_before_weight": rng.random() < 0.3} if kind == "rms" else {})),
        expand_grad=rng.random() < 0.2, exact=xdt == torch.float32)


def _run(c, backend, seed):
    leaves = [None if t is None else t.clone().requires_grad_() for t in (c["x"], c["r"], c["w"], c["b"])]
    x, r, w, b = leaves
    if c["kind"] == "layer":
        y, s = addnorm.add_layer_norm(x, r, c["ns"], w, b, backend=backend, **c["kw"])
    else:
        y, s = addnorm.add_rms_norm(x, r, c["ns"], w, backend=backend, **c["kw"])
    g = torch.Generator().manual_seed(seed)
    gy = torch.randn(y.shape, generator=g).to(y.dtype)
    if c["expand_grad"] and y.dim() and y.shape[-1]:
        gy = gy[..., :1].expand_as(y)
    gs = torch.randn(s.shape, generator=g).to(s.dtype)
    live = [t for t in leaves if t is not None]
    return y, s, torch.autograd.grad((y, s), live, (gy, gs))


@pytest.mark.parametrize("seed", range(4))
def test_kernels_match_the_torch_backend_on_random_calls(seed):
    rng = random.Random(seed)
    for i in range(40):
        c = _case(rng)
        y1, s1, g1 = _run(c, "cpu", i)
        y2, s2, g2 = _run(c, "torch", i)
        assert (y1.dtype, s1.dtype) == (y2.dtype, s2.dtype)
        tol = 1e-4 if c["exact"] and c["kw"]["out_dtype"] in (None, torch.float32) else 2e-2
        torch.testing.assert_close(y1.float(), y2.float(), atol=4 * tol, rtol=tol, msg=lambda m: f"case {i}: {m}")
        torch.testing.assert_close(s1.float(), s2.float(), atol=tol, rtol=tol)
        for a, e in zip(g1, g2):
            assert a.dtype == e.dtype
            scale = max(1.0, e.float().abs().max().item()) if e.numel() else 1.0
            torch.testing.assert_close(a.float(), e.float(), atol=8 * tol * scale, rtol=4 * tol,
                                       msg=lambda m: f"case {i}: {m}")
