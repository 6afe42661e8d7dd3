"""Bad input gets an error that names the argument, what was expected and what was given."""

import pytest
import torch

import addnorm
from addnorm import nn as ann


def test_wrong_trailing_shape():
    with pytest.raises(ValueError, match=r"x of shape \(2, 5\) does not end in normalized_shape \(4,\)"):
        addnorm.layer_norm(torch.randn(2, 5), 4)


def test_wrong_weight_and_bias_shape():
    with pytest.raises(ValueError, match=r"weight must have shape normalized_shape=\(4,\), got \(3,\)"):
        addnorm.layer_norm(torch.randn(2, 4), 4, torch.ones(3))
    with pytest.raises(ValueError, match=r"bias must have shape normalized_shape=\(4,\), got \(4, 1\)"):
        addnorm.layer_norm(torch.randn(2, 4), 4, None, torch.ones(4, 1))


@pytest.mark.parametrize("eps", [float("nan"), float("inf"), -float("inf")])
def test_bad_eps(eps):
    with pytest.raises(ValueError, match="eps must be a finite number"):
        addnorm.rms_norm(torch.randn(2, 4), 4, eps=eps)
    with pytest.raises(ValueError, match="eps must be a finite number"):
        ann.LayerNorm(4, eps=eps)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_non_float_dtypes(dtype):
    x = torch.zeros(2, 4, dtype=dtype)
    with pytest.raises(TypeError, match=f"x must be a floating-point tensor .* got {dtype}"):
        addnorm.layer_norm(x, 4)
    with pytest.raises(TypeError, match=f"weight must be floating-point, got {dtype}"):
        addnorm.layer_norm(torch.zeros(2, 4), 4, torch.zeros(4, dtype=dtype))


def test_residual_mismatch():
    with pytest.raises(ValueError, match=r"residual must have x's shape \(2, 4\), got \(1, 4\)"):
        addnorm.add_layer_norm(torch.randn(2, 4), torch.randn(1, 4), 4)
    with pytest.raises(TypeError, match="residual dtype torch.float64 must equal x dtype torch.float32"):
        addnorm.add_rms_norm(torch.randn(2, 4), torch.randn(2, 4, dtype=torch.float64), 4)


def test_unknown_backend_and_bad_normalized_shape():
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'cpu', 'triton', 'torch'\), got 'gpu'"):
        addnorm.layer_norm(torch.randn(2, 4), 4, backend="gpu")
    with pytest.raises(ValueError, match="backend must be one of"):
        with addnorm.use_backend("fast"):
            pass
    with pytest.raises(TypeError, match="normalized_shape must be an int or a tuple of ints, got str"):
        addnorm.layer_norm(torch.randn(2, 4), "4")
    with pytest.raises(ValueError, match="normalized_shape must have at least one dimension"):
        addnorm.layer_norm(torch.randn(2, 4), ())


def test_x_not_a_tensor():
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        addnorm.layer_norm([1.0, 2.0], 2)


@pytest.mark.parametrize("module", [ann.LayerNorm, ann.RMSNorm, ann.DyT, ann.Derf])
@pytest.mark.parametrize("bad", [[64.7], ["8"], True, 64.0, (True,), "8"])
def test_modules_refuse_a_normalized_shape_that_is_not_ints(module, bad):
    """torch.nn.LayerNorm raises for these; int() had truncated 64.7 to 64 and read "8" as 8."""
    with pytest.raises(TypeError, match="normalized_shape"):
        module(bad)


def test_modules_take_what_torch_takes_as_ints():
    import numpy as np
    assert ann.LayerNorm(torch.Size([4, 8])).normalized_shape == (4, 8)
    assert ann.RMSNorm(np.int64(8)).normalized_shape == (8,)
    assert ann.LayerNorm(torch.tensor(5)).normalized_shape == (5,)
    with pytest.raises(ValueError, match="non-negative"):
        ann.LayerNorm([-1])


def test_layer_norm_refuses_eps_none_as_torch_does():
    """RMSNorm's eps=None is torch's default (the dtype's eps); LayerNorm has no such default: torch raises."""
    x = torch.randn(2, 8)
    for call in (lambda: addnorm.layer_norm(x, 8, eps=None), lambda: addnorm.add_layer_norm(x, x, 8, eps=None)):
        with pytest.raises(TypeError, match="eps must be a float"):
            call()
    with pytest.raises(TypeError):
        torch.nn.functional.layer_norm(x, (8,), eps=None)
    torch.testing.assert_close(addnorm.rms_norm(x, 8, eps=None), torch.nn.functional.rms_norm(x, (8,)))


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_freed_scalars_are_named_not_a_crash(backend):
    """DyT's alpha is a Parameter: FSDP frees Parameters' storage. It segfaulted on the torch backend."""
    if backend == "cpu" and not addnorm.cpu_kernel_availability().available:
        pytest.skip("the compiled CPU kernels are not built")
    x = torch.randn(2, 8)
    alpha = torch.nn.Parameter(torch.tensor(0.5))
    alpha.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError, match="alpha has 1 elements but its storage has been freed"):
        addnorm.add_dyt(x, torch.randn(2, 8), alpha, backend=backend)
    shift = torch.tensor(0.1)
    shift.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError, match="shift has 1 elements but its storage has been freed"):
        addnorm.add_derf(x, None, torch.tensor(0.5), shift, backend=backend)
    w = torch.nn.Parameter(torch.ones(8))
    w.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError, match="weight has 8 elements but its storage has been freed"):
        addnorm.layer_norm(x, 8, w, backend=backend)


_FREED_VIEWS = r"""
import os, sys, torch
import addnorm, addnorm.functional as F
D, N, n = 64, 8, 4
def freed(shape, offset):  # a view of a storage FSDP freed: at an offset its data pointer is not null
    k = 1
    for s in shape:
        k *= s
    base = torch.randn(offset + k)
    v = base[offset:].view(shape)
    base.untyped_storage().resize_(0)
    return v
x, r, w, b, a = torch.randn(N, D), torch.randn(N, D), torch.randn(D), torch.randn(D), torch.tensor(0.5)
X = torch.randn(N, n, D)
for offset in (0, 1 << 20):
    f = lambda *shape: freed(shape, offset)
    calls = {
        "add_layer_norm x": lambda: addnorm.add_layer_norm(f(N, D), r, (D,), w, b),
        "add_layer_norm residual": lambda: addnorm.add_layer_norm(x, f(N, D), (D,), w, b),
        "add_rms_norm weight": lambda: addnorm.add_rms_norm(x, r, (D,), f(D)),
        "rms_norm x": lambda: addnorm.rms_norm(f(N, D), (D,), w),
        "layer_norm_add bias": lambda: F.layer_norm_add(x, r, (D,), w, f(D)),
        "parallel x2": lambda: F.parallel_add_layer_norm(x, f(N, D), r, (D,), w, b),
        "add_dyt x": lambda: F.add_dyt(f(N, D), r, a, w, b),
        "stream_write y": lambda: F.stream_write(X, f(N, D), torch.rand(N, n), torch.rand(N, n, n)),
        "attn_res source": lambda: F.attn_res([f(N, D), x], torch.randn(D)),
    }
    for name, call in calls.items():
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                try:
                    call()
                    print(offset, name, grad, "returned")
                except RuntimeError as e:
                    print(offset, name, grad, "refused" if "storage has been freed" in str(e) else repr(e))
"""


@pytest.mark.parametrize("cpp", ["1", "0"], ids=["cpp_entries", "python_nodes"])
def test_a_view_of_a_freed_storage_is_refused_by_name(cpp):
    """A view at an offset of a storage FSDP freed has a data pointer that is not null: the fast paths took it for
    a tensor and the kernels read unmapped memory (a segfault, on the C++ entries and the Python nodes alike). Now
    refused with the general path's error, at offset 0 too -- each case in a process of its own."""
    import os
    import subprocess
    import sys
    if not addnorm.cpu_kernel_availability().available:
        pytest.skip("the compiled CPU kernels are not built")
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _FREED_VIEWS], capture_output=True, text=True,
                       timeout=180, env=dict(os.environ, ADDNORM_CPP_NODES=cpp))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 36 and all(line.endswith("refused") for line in lines), r.stdout


@pytest.mark.parametrize("call", [
    lambda x, s: addnorm.layer_norm(s, (8,)),
    lambda x, s: addnorm.rms_norm(s, (8,)),
    lambda x, s: addnorm.add_rms_norm(x, s, 8),
    lambda x, s: addnorm.layer_norm_add(s, x, 8),
    lambda x, s: addnorm.add_dyt(s, None, torch.tensor(0.5)),
], ids=["layer_norm", "rms_norm", "add_rms_norm residual", "layer_norm_add", "add_dyt"])
def test_a_sparse_tensor_is_refused_by_name_as_torch_refuses_it(call):
    """It reached untyped_storage(): 'Cannot access storage of SparseTensorImpl', naming nothing. torch raises
    a RuntimeError or NotImplementedError for the same call; the error is both, and a TypeError."""
    x = torch.randn(4, 8)
    with pytest.raises(NotImplementedError, match=r"(x|residual) must be a dense tensor, got layout torch.sparse_coo"):
        call(x, x.to_sparse())
