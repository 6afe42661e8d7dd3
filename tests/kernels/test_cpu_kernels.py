"""The fused CPU kernels: low precision judged against PyTorch's own error, determinism, ISA variants,
threads and the allocation-free out= path."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import addnorm
from addnorm.reference import oracle
from backends import KERNELS

pytestmark = pytest.mark.skipif(not addnorm.cpu_kernel_availability().available,
                                reason="the compiled CPU kernels are not built")

LOW = [torch.bfloat16, torch.float16]
SHAPES = [(1, 1), (3, 7), (17, 123), (5, 769), (64, 768), (2, 3000), (3, 65536), (300, 64)]


def _err(a, ref):
    return (a.double() - torch.as_tensor(ref)).abs().max().item()


def _eager(kind, x, r, w, b):
    s = x + r
    # PyTorch's own low-precision path: its result is what "PyTorch's error in this dtype" means
    y = F.layer_norm(s, s.shape[-1:], w, b) if kind == "layer" else F.rms_norm(s, s.shape[-1:], w)
    return y, s


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("backend", KERNELS)
def test_low_precision_within_twice_pytorchs_own_error(dtype, shape, kind, backend):
    """flash-attention's rule: |ours - fp64| <= 2 * |pytorch_in_dtype - fp64| + atol."""
    g = torch.Generator().manual_seed(sum(shape))
    D = shape[-1]
    x = torch.randn(shape, generator=g).to(dtype).requires_grad_()
    r = torch.randn(shape, generator=g).to(dtype).requires_grad_()
    w = (1 + 0.5 * torch.randn(D, generator=g)).to(dtype).requires_grad_()
    b = (0.5 * torch.randn(D, generator=g)).to(dtype).requires_grad_() if kind == "layer" else None
    dy = torch.randn(shape, generator=g).to(dtype)
    ds = torch.randn(shape, generator=g).to(dtype)
    ins = [t for t in (x, r, w, b) if t is not None]
    fn = addnorm.add_layer_norm if kind == "layer" else addnorm.add_rms_norm
    args = (w, b) if kind == "layer" else (w,)
    y, s = fn(x, r, D, *args, backend=backend)
    y_pt, s_pt = _eager(kind, x, r, w, b)
    assert torch.equal(s, s_pt)  # the rounded residual sum is exactly eager's

    # float64 truth, from the same (rounded) inputs
    s64 = s_pt.detach().double()
    if kind == "layer":
        y64 = oracle.layer_norm(s64, w, b)
        dx64, dw64, db64 = oracle.layer_norm_backward(dy, s64, w)
        truth = [dx64 + ds.double().numpy(), dx64 + ds.double().numpy(), dw64, db64]
    else:
        y64 = oracle.rms_norm(s64, w, 1e-6 if False else torch.finfo(torch.float32).eps)
        dx64, dw64 = oracle.rms_norm_backward(dy, s64, w, torch.finfo(torch.float32).eps)
        truth = [dx64 + ds.double().numpy(), dx64 + ds.double().numpy(), dw64]
    atol = {torch.bfloat16: 1e-2, torch.float16: 1e-3}[dtype]
    assert _err(y, y64) <= 2 * _err(y_pt, y64) + atol

    def grads(yy, ss):
        return torch.autograd.grad((yy.float() * dy.float()).sum() + (ss.float() * ds.float()).sum(), ins)

    for ours, theirs, t in zip(grads(y, s), grads(y_pt, s_pt), truth):
        scale = max(1.0, float(abs(torch.as_tensor(t)).max()))
        assert _err(ours, t) <= 2 * _err(theirs, t) + atol * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_dweight_is_deterministic(dtype, threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4096, 768, generator=g).to(dtype)
        w = torch.randn(768, generator=g).to(dtype).requires_grad_()
        b = torch.randn(768, generator=g).to(dtype).requires_grad_()
        dy = torch.randn(4096, 768, generator=g).to(dtype)
        first = None
        for _ in range(3):
            y = addnorm.layer_norm(x, 768, w, b, backend="cpu")
            got = torch.autograd.grad(y, [w, b], dy)
            if first is None:
                first = got
            else:
                assert all(torch.equal(a, c) for a, c in zip(got, first))
    finally:
        torch.set_num_threads(old)


def test_outputs_do_not_depend_on_thread_count():
    x, r = torch.randn(1000, 384), torch.randn(1000, 384)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = addnorm.add_rms_norm(x, r, 384, backend="cpu")
        torch.set_num_threads(2)
        two = addnorm.add_rms_norm(x, r, 384, backend="cpu")
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


ISA_SCRIPT = """
import torch, addnorm, sys
torch.manual_seed(0)
x = torch.randn(33, 1031).to(getattr(torch, sys.argv[1])).requires_grad_()
r = torch.randn(33, 1031).to(x.dtype)
w = torch.randn(1031).requires_grad_()
y, s = addnorm.add_layer_norm(x, r, 1031, w, backend="cpu")
gx, gw = torch.autograd.grad((y.float() * torch.linspace(-1, 1, 1031)).sum(), [x, w])
torch.save({"isa": addnorm.cpu_kernel_availability().isa, "y": y, "gx": gx, "gw": gw}, sys.argv[2])
"""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_every_instruction_set_variant_agrees(tmp_path, dtype):
    results = {}
    for isa in ["baseline", "avx2", "native"]:
        for stream in ("0", str(1 << 60)):  # non-temporal stores always / never
            env = dict(os.environ, ADDNORM_CPU_NT_BYTES=stream)
            if isa != "native":
                env["ADDNORM_CPU_ISA"] = isa
            out = tmp_path / f"{isa}-{stream}.pt"
            subprocess.run([sys.executable, "-c", ISA_SCRIPT, dtype, str(out)], check=True, env=env)
            results[f"{isa}-{stream}"] = torch.load(out)
    assert results["baseline-0"]["isa"] == "baseline"
    for isa in ["baseline", "avx2", "native"]:  # streaming changes where bytes go, never their values
        a, b = results[f"{isa}-0"], results[f"{isa}-{1 << 60}"]
        assert all(torch.equal(a[k], b[k]) for k in ("y", "gx", "gw"))
    ref = results["baseline-0"]
    tol = {"float32": 1e-5, "bfloat16": 1.6e-2, "float16": 2e-3}[dtype]
    for isa, res in results.items():
        for k in ("y", "gx", "gw"):
            torch.testing.assert_close(res[k].float(), ref[k].float(), atol=tol * 4, rtol=tol, msg=f"{isa} {k}")


# ---- the allocation-free path ----


@pytest.mark.parametrize("backend", KERNELS + ["torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_place_residual_update(backend, dtype):
    x, r = torch.randn(64, 96).to(dtype), torch.randn(64, 96).to(dtype)
    w = torch.randn(96).to(dtype)
    want_y, want_s = addnorm.add_rms_norm(x, r, 96, w, backend=backend)  # same backend, fresh buffers
    with torch.no_grad():
        out = torch.empty_like(x)
        y, s = addnorm.add_rms_norm(x, r, 96, w, out=out, residual_out=r, backend=backend)
    assert y is out and s is r
    assert torch.equal(r, want_s) and torch.equal(out, want_y)


@pytest.mark.parametrize("backend", KERNELS + ["torch"])
def test_out_may_be_x_itself(backend):
    x, r = torch.randn(10, 33), torch.randn(10, 33)
    want_y, want_s = addnorm.add_layer_norm(x, r, 33, backend=backend)
    rs = torch.empty_like(r)
    y, s = addnorm.add_layer_norm(x, r, 33, out=x, residual_out=rs, backend=backend)
    assert y is x and torch.equal(x, want_y) and torch.equal(rs, want_s)
    x = torch.randn(10, 33)
    want = addnorm.layer_norm(x, 33, backend=backend)
    addnorm.layer_norm(x, 33, out=x, backend=backend)
    assert torch.equal(x, want)


def test_out_buffers_rejected_when_unsafe():
    x, r = torch.randn(8, 16), torch.randn(8, 16)
    big = torch.randn(9, 16)
    with pytest.raises(ValueError, match="out partially overlaps x"):
        addnorm.add_layer_norm(big[:8], r, 16, out=big[1:])
    with pytest.raises(ValueError, match="out and residual_out overlap"):
        buf = torch.empty(8, 16)
        addnorm.add_layer_norm(x, r, 16, out=buf, residual_out=buf)
    with pytest.raises(ValueError, match="residual_out was given but residual is None"):
        addnorm.add_layer_norm(x, None, 16, residual_out=torch.empty(8, 16))
    with pytest.raises(ValueError, match=r"out must have shape \(8, 16\), dtype torch.float32"):
        addnorm.layer_norm(x, 16, out=torch.empty(8, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="out must have unit stride along its normalized dims"):
        addnorm.layer_norm(x, 16, out=torch.empty(16, 8).t())
    with pytest.raises(ValueError, match=r"out must be viewable as \(rows, 16\)"):
        addnorm.layer_norm(x.view(2, 4, 16), 16, out=torch.empty(4, 2, 16).transpose(0, 1))
    xg = x.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="out= and residual_out= do not support automatic differentiation"):
        addnorm.layer_norm(xg, 16, out=torch.empty(8, 16))


def test_non_contiguous_inputs_are_read_correctly():
    base = torch.full((8, 40), float("nan"))
    x = base[:, 3:35]  # rows with stride 40: passed to the kernel as is
    x.copy_(torch.randn(8, 32))
    xt = torch.randn(32, 8).t()  # unit stride along rows, not along D: copied first
    for t in (x, xt):
        torch.testing.assert_close(addnorm.layer_norm(t, 32, backend="cpu"), F.layer_norm(t, (32,)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("xdt, wdt, bdt", [
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),  # HF bf16 models: the kernel reads 16-bit weights itself
    (torch.float16, torch.float16, torch.float16),
    (torch.bfloat16, torch.float32, torch.float32),    # mixed precision: norms kept in float32
    (torch.float32, torch.bfloat16, torch.float32),    # mixed parameter dtypes: converted to float32 first
    (torch.float32, torch.float64, torch.float64),
])
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("backend", KERNELS)
def test_parameter_gradients_keep_each_parameters_dtype(xdt, wdt, bdt, kind, backend):
    g = torch.Generator().manual_seed(3)
    x, r = (torch.randn(6, 5, 48, generator=g).to(xdt).requires_grad_() for _ in range(2))
    w = (1 + 0.5 * torch.randn(48, generator=g)).to(wdt).requires_grad_()
    b = torch.randn(48, generator=g).to(bdt).requires_grad_() if kind == "layer" else None
    dy = torch.randn(6, 5, 48, generator=g).to(xdt)
    grads = {}
    for which in (backend, "torch"):
        fn = addnorm.add_layer_norm if kind == "layer" else addnorm.add_rms_norm
        args = (x, r, 48, w, b) if kind == "layer" else (x, r, 48, w)
        y, s = fn(*args, backend=which)
        params = [t for t in (x, w, b) if t is not None]
        grads[which] = torch.autograd.grad(y, params, dy)
    for ours, ref, p in zip(grads[backend], grads["torch"], [t for t in (x, w, b) if t is not None]):
        assert ours.dtype == p.dtype and ours.shape == p.shape
        tol = 1e-4 if ours.dtype in (torch.float32, torch.float64) else 3e-2
        torch.testing.assert_close(ours.double(), ref.double(), atol=tol * max(1.0, ref.abs().max().item()), rtol=tol)


def test_functorch_transforms_run_on_the_torch_backend():
    x, r = torch.randn(3, 4, 16), torch.randn(3, 4, 16)
    y = torch.func.vmap(lambda a, b: addnorm.add_layer_norm(a, b, 16)[0])(x, r)
    torch.testing.assert_close(y, F.layer_norm(x + r, (16,)), atol=1e-6, rtol=0)
    g = torch.func.grad(lambda a: addnorm.rms_norm(a, 16).pow(3).sum())(x)
    ref = torch.func.grad(lambda a: F.rms_norm(a, (16,)).pow(3).sum())(x)
    torch.testing.assert_close(g, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="torch.func transform"):
        torch.func.vmap(lambda a: addnorm.layer_norm(a, 16, backend="cpu"))(x)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_large_calls_cut_into_many_chunks_match_the_torch_backend(kind):
    # >= 2^20 elements: rows are cut into several chunks per thread, taken dynamically; 1037 rows do not
    # divide evenly, so chunks differ in size
    g = torch.Generator().manual_seed(5)
    x, r = (torch.randn(1037, 1031, generator=g).requires_grad_() for _ in range(2))
    w = torch.randn(1031, generator=g).requires_grad_()
    b = torch.randn(1031, generator=g).requires_grad_() if kind == "layer" else None
    dy, ds = torch.randn(1037, 1031, generator=g), torch.randn(1037, 1031, generator=g)
    res = {}
    for backend in ("cpu", "torch"):
        fn = addnorm.add_layer_norm if kind == "layer" else addnorm.add_rms_norm
        y, s = fn(x, r, 1031, w, b, backend=backend) if kind == "layer" else fn(x, r, 1031, w, backend=backend)
        params = [t for t in (x, w, b) if t is not None]
        res[backend] = (y, s, *torch.autograd.grad([y, s], params, [dy, ds]))
    for ours, ref in zip(res["cpu"], res["torch"]):
        torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-5)
