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
