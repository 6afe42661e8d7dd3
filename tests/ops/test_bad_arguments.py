"""Every public fused, pointwise and stream function refuses a bad argument by its name, on every backend
choice including the default one (whose fast path skips the full validation): None, a list or an int in
place of each tensor, and a wrong-shaped parameter. A fast path that lets a bad argument through to the
kernel gives a misleading error (``parallel_add_layer_norm(x, x2, None, ...)`` once said a storage had been
freed) or a Python AttributeError; a check that derives a shape from a parameter blames x for it (a wrong
DyT weight once read "x of shape (4, 8) does not end in normalized_shape (7,)")."""

import re

import pytest
import torch

from addnorm.functional import layer_norm_add, parallel_add_layer_norm, parallel_add_rms_norm, rms_norm_add
from addnorm.functional import add_derf, add_dyt, stream_read, stream_write

D = 8
X, R, X2 = torch.randn(4, D), torch.randn(4, D), torch.randn(4, D)
W, B = torch.randn(D), torch.randn(D)
A, SH = torch.tensor([0.5]), torch.tensor([0.1])
XS, Y, HP, HR = torch.randn(2, 4, D), torch.randn(2, D), torch.rand(2, 4), torch.rand(2, 4, 4)

# name: (function, valid keyword arguments, the tensor arguments None may not replace, the other tensor arguments)
CASES = {
    "layer_norm_add": (layer_norm_add, dict(x=X, residual=R, normalized_shape=D, weight=W, bias=B),
                       ["x", "residual"], ["weight", "bias"]),
    "rms_norm_add": (rms_norm_add, dict(x=X, residual=R, normalized_shape=D, weight=W), ["x", "residual"],
                     ["weight"]),
    "parallel_add_layer_norm": (parallel_add_layer_norm,
                                dict(x=X, x2=X2, residual=R, normalized_shape=D, weight=W, bias=B, weight2=W,
                                     bias2=B),
                                ["x", "residual"], ["x2", "weight", "bias", "weight2", "bias2"]),
    "parallel_add_rms_norm": (parallel_add_rms_norm,
                              dict(x=X, x2=X2, residual=R, normalized_shape=D, weight=W, weight2=W),
                              ["x", "residual"], ["x2", "weight", "weight2"]),
    "add_dyt": (add_dyt, dict(x=X, residual=R, alpha=A, weight=W, bias=B), ["x", "alpha"],
                ["residual", "weight", "bias"]),
    "add_derf": (add_derf, dict(x=X, residual=R, alpha=A, shift=SH, weight=W, bias=B), ["x", "alpha"],
                 ["residual", "shift", "weight", "bias"]),
    "stream_read": (stream_read, dict(x=XS, h_pre=HP), ["x", "h_pre"], []),
    "stream_write": (stream_write, dict(x=XS, y=Y, h_post=HP, h_res=HR), ["x", "y", "h_post", "h_res"], []),
}
# the parameters whose shape is checked, and a wrong shape for each
SHAPED = {
    "layer_norm_add": ["weight", "bias"], "rms_norm_add": ["weight"],
    "parallel_add_layer_norm": ["x2", "weight", "bias", "weight2", "bias2"],
    "parallel_add_rms_norm": ["x2", "weight", "weight2"],
    "add_dyt": ["residual", "weight", "bias", "alpha"], "add_derf": ["residual", "weight", "bias", "alpha", "shift"],
    "stream_read": ["h_pre"], "stream_write": ["y", "h_post", "h_res"],
}
# None, the library's own backend choice (the fast path), and each backend by name: arguments are validated
# before a backend is picked, so "triton" refuses them here without a GPU or Triton's interpreter
BACKENDS = [None, "cpu", "triton", "torch"]


def _refusal(fn, kwargs, backend):
    with pytest.raises((TypeError, ValueError)) as info:
        fn(**kwargs, backend=backend)
    return str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [None, [1.0] * D, 3], ids=["None", "list", "int"])
@pytest.mark.parametrize("name, arg", [(n, a) for n, c in CASES.items() for a in c[2] + c[3]])
def test_a_non_tensor_is_refused_by_name(name, arg, bad, backend):
    fn, kwargs, required, optional = CASES[name]
    if bad is None and arg in optional:
        return  # None is the documented "absent" for these (one branch, no residual, no weight, no shift)
    if isinstance(bad, int) and arg in ("alpha", "shift"):
        return  # DyT's and Derf's scalars are documented to take a number (test_dyt_derf_formula holds it)
    msg = _refusal(fn, {**kwargs, arg: bad}, backend)
    assert re.match(rf"{arg} ", msg), msg
    assert "storage" not in msg, msg


def _wrong(t: torch.Tensor) -> torch.Tensor:
    return torch.randn(2) if t.numel() == 1 else torch.randn(*t.shape[:-1], t.shape[-1] + 1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, arg", [(n, a) for n, args in SHAPED.items() for a in args])
def test_a_wrong_shape_is_refused_naming_that_argument(name, arg, backend):
    fn, kwargs, _, _ = CASES[name]
    msg = _refusal(fn, {**kwargs, arg: _wrong(kwargs[arg])}, backend)
    assert re.match(rf"{arg} ", msg), msg


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pointwise_weight_that_is_not_x_trailing_dims_is_named(backend):
    x = torch.randn(2, 3, D)
    msg = _refusal(add_dyt, dict(x=x, residual=None, alpha=A, weight=torch.randn(D - 1)), backend)
    assert msg.startswith(f"weight of shape ({D - 1},) must equal the trailing dims of x's shape (2, 3, {D})"), msg
    msg = _refusal(add_dyt, dict(x=x, residual=None, alpha=A, weight=torch.randn(D), bias=torch.randn(3, D)),
                   backend)
    assert msg.startswith("bias must have weight's shape"), msg
    msg = _refusal(add_derf, dict(x=x, residual=None, alpha=A, shift=SH, weight=None, bias=torch.randn(1, 2, 3, D)),
                   backend)
    assert msg.startswith("bias of shape (1, 2, 3, 8)"), msg


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_pointwise_parameters_may_cover_several_trailing_dims_or_none(backend):
    """What the shape check must keep accepting: a weight over x's last two dims, and a 0-dim one."""
    from tests.backends import KERNELS
    if backend not in KERNELS + ["torch"]:
        pytest.skip("the compiled kernels are not built")
    x = torch.randn(2, 3, D)
    w2, b2 = torch.randn(3, D), torch.randn(3, D)
    y, _ = add_dyt(x, None, A, w2, b2, backend=backend)
    torch.testing.assert_close(y, w2 * torch.tanh(0.5 * x) + b2)
    y, _ = add_dyt(x, None, A, torch.tensor(2.0), backend=backend)
    torch.testing.assert_close(y, 2.0 * torch.tanh(0.5 * x))
    y, _ = add_derf(x, None, A, None, backend=backend)  # shift=None: no shift
    torch.testing.assert_close(y, torch.erf(0.5 * x))


@pytest.mark.parametrize("bad", ["", "CPU", "cuda", 0, False], ids=["empty", "CPU", "cuda", "zero", "False"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_backend_is_refused_on_the_fast_path_too(name, bad):
    """A falsy backend ("" or 0) once fell back to the default on the fast paths (``backend or default``) and ran,
    while the same call with float64 or strided inputs refused it: a bad option must not depend on the tensors."""
    import addnorm

    fn, kwargs, _, _ = CASES[name]
    with pytest.raises((TypeError, ValueError), match="backend"):
        fn(**kwargs, backend=bad)
    with pytest.raises((TypeError, ValueError), match="backend"):
        addnorm.add_layer_norm(X, R, D, W, B, backend=bad)


def test_shape_and_dtype_errors_are_torchs_types_too():
    """torch raises RuntimeError for a wrong shape and NotImplementedError (input) or RuntimeError (weight) for an
    integer dtype; addnorm's ShapeError and DtypeError are those and ValueError / TypeError besides, so code
    written for torch's norms (``except RuntimeError``) catches them."""
    import addnorm
    import addnorm.nn as ann

    with pytest.raises(RuntimeError, match="Given normalized_shape="):
        ann.LayerNorm(4)(torch.randn(2, 5))
    with pytest.raises(ValueError, match="does not end in normalized_shape"):
        addnorm.rms_norm(torch.randn(2, 5), 4)
    with pytest.raises(RuntimeError, match="Expected weight to be of same shape"):
        addnorm.layer_norm(torch.randn(2, 4), 4, torch.ones(3))
    with pytest.raises(NotImplementedError):
        addnorm.layer_norm(torch.ones(2, 4, dtype=torch.long), 4)
    with pytest.raises(RuntimeError):
        addnorm.rms_norm(torch.randn(2, 4), 4, torch.ones(4, dtype=torch.long))
    y = ann.LayerNorm(4)(input=torch.randn(2, 4))  # torch.nn.LayerNorm's forward(input), and F.layer_norm's
    torch.testing.assert_close(addnorm.layer_norm(input=torch.ones(1, 4), normalized_shape=4), torch.zeros(1, 4))
    assert y.shape == (2, 4)
