"""addnorm against PyTorch's own test tables: the OpInfo samples and error inputs of
nn.functional.layer_norm / rms_norm and the ModuleInfo entries of nn.LayerNorm / nn.RMSNorm.

Every sample, every dtype, both backends: outputs, gradients and forward-mode tangents must be at least
as close to a float64 reference as torch's own result in that dtype (plus one ulp of the result's
scale: the two round their last steps differently); NaN where torch gives NaN; error inputs must raise.
"""

import pytest
import torch
import torch.nn.functional as F
import torch.autograd.forward_ad as fwAD

import addnorm
import addnorm.nn as ann

common = pytest.importorskip("torch.testing._internal.common_methods_invocations",
                             reason="torch's test tables need expecttest (pip install -e '.[test]')")
from torch.testing._internal.common_modules import module_db  # noqa: E402

OPS = {"nn.functional.layer_norm": (addnorm.layer_norm, F.layer_norm),
       "nn.functional.rms_norm": (addnorm.rms_norm, F.rms_norm)}
OPINFOS = {o.name: o for o in common.op_db if o.name in OPS}
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
BACKENDS = ["auto", "torch"]


def _samples(name, dtype, requires_grad=False):
    return list(OPINFOS[name].sample_inputs("cpu", dtype, requires_grad=requires_grad))


def _f64(t):
    return t.detach().double().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t


def _err(a, ref):
    """max |a - ref| over positions where ref is finite; NaN/inf positions must agree."""
    a = a.double()
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(a)), "non-finite positions differ from the float64 reference"
    return (a - ref)[finite].abs().max().item() if finite.any() else 0.0


def _slack(dtype, ref):
    finite = ref[torch.isfinite(ref)]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    return torch.finfo(dtype).eps * max(scale, 1.0)


def _no_closer(ours, theirs, ref, dtype, what):
    e_ours, e_torch = _err(ours, ref), _err(theirs, ref)
    assert e_ours <= e_torch + _slack(dtype, ref), f"{what}: addnorm {e_ours:.3g} vs torch {e_torch:.3g}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(OPS))
def test_samples_forward_and_backward_at_least_as_close_as_torch(name, dtype, backend):
    ours_fn, torch_fn = OPS[name]
    for k, s in enumerate(_samples(name, dtype, requires_grad=True)):
        args = (s.input,) + tuple(s.args)
        ours = ours_fn(*args, **s.kwargs, backend=backend)
        theirs = torch_fn(*args, **s.kwargs)
        ref = torch_fn(*map(_f64, args), **s.kwargs)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        _no_closer(ours, theirs, ref, dtype, f"sample {k} output")
        leaves = [t for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
        if not leaves or ours.numel() == 0 or not torch.isfinite(ref).all():
            continue
        g = torch.randn(ours.shape, generator=torch.Generator().manual_seed(k)).to(dtype)
        g_ours = torch.autograd.grad(ours, leaves, g)
        g_torch = torch.autograd.grad(theirs, leaves, g)
        ref_args = list(map(_f64, args))
        ref = torch_fn(*ref_args, **s.kwargs)
        ref_leaves = [a for a in ref_args if isinstance(a, torch.Tensor) and a.requires_grad]
        g_ref = torch.autograd.grad(ref, ref_leaves, g.double())
        for i, (a, b, r) in enumerate(zip(g_ours, g_torch, g_ref)):
            assert a.dtype == b.dtype
            _no_closer(a, b, r, dtype, f"sample {k} gradient {i}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", list(OPS))
def test_samples_forward_ad_tangents(name, dtype, backend):
    ours_fn, torch_fn = OPS[name]
    for k, s in enumerate(_samples(name, dtype)):
        args = (s.input,) + tuple(s.args)
        gen = torch.Generator().manual_seed(k)
        tangents = [torch.randn(a.shape, generator=gen).to(dtype) if isinstance(a, torch.Tensor) else None
                    for a in args]
        with fwAD.dual_level():
            duals = [a if t is None else fwAD.make_dual(a, t) for a, t in zip(args, tangents)]
            t_ours = fwAD.unpack_dual(ours_fn(*duals, **s.kwargs, backend=backend)).tangent
            t_torch = fwAD.unpack_dual(torch_fn(*duals, **s.kwargs)).tangent
            ref_duals = [_f64(a) if t is None else fwAD.make_dual(_f64(a), t.double()) for a, t in zip(args, tangents)]
            t_ref = fwAD.unpack_dual(torch_fn(*ref_duals, **s.kwargs)).tangent
        if s.input.numel() == 0:
            continue
        assert t_ours is not None, f"sample {k}: the tangent was dropped"
        if torch.isfinite(t_ref).all():
            _no_closer(t_ours, t_torch, t_ref, dtype, f"sample {k} tangent")


@pytest.mark.parametrize("name", list(OPS))
def test_samples_gradcheck_gradgradcheck_forward_ad_float64(name):
    """float64 through addnorm's operator itself (its autograd: backward formula, double backward, jvp)
    and through the public function."""
    kind = "layer" if "layer" in name else "rms"
    for k, s in enumerate(_samples(name, torch.float64, requires_grad=True)):
        if s.input.numel() == 0 or s.kwargs.get("eps", 1e-5) < 0:
            continue
        shape = tuple(s.args[0])
        w = s.args[1] if len(s.args) > 1 else None
        b = s.args[2] if kind == "layer" and len(s.args) > 2 else None
        eps = s.kwargs.get("eps", 1e-5 if kind == "layer" else torch.finfo(torch.float64).eps)
        tensors = [t for t in (s.input, w, b) if t is not None]

        def op(*ts, w_given=w is not None, b_given=b is not None):
            it = iter(ts)
            x = next(it)
            ww = next(it) if w_given else None
            bb = next(it) if b_given else None
            return torch.ops.addnorm.add_norm(x, None, ww, bb, kind, len(shape), eps, 0.0, False, None, False)[0]

        assert torch.autograd.gradcheck(op, tensors, check_forward_ad=True), f"sample {k}"
        assert torch.autograd.gradgradcheck(op, tensors), f"sample {k}"


@pytest.mark.parametrize("name", list(OPS))
def test_error_inputs_raise(name):
    op = OPINFOS[name]
    if op.error_inputs_func is None:
        pytest.skip(f"torch has no error_inputs for {name}")
    ours_fn, _ = OPS[name]
    for e in op.error_inputs("cpu"):
        s = e.sample_input
        # torch's own error type and message: code written for torch's norms catches ours (ShapeError is both a
        # ValueError naming the argument and torch's RuntimeError, its message included)
        with pytest.raises(e.error_type, match=e.error_regex):
            ours_fn(s.input, *s.args, **s.kwargs)


MODULES = [m for m in module_db if m.module_cls in (torch.nn.LayerNorm, torch.nn.RMSNorm)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("minfo", MODULES, ids=lambda m: m.module_cls.__name__)
def test_module_info_entries(minfo, dtype):
    ours_cls = {torch.nn.LayerNorm: ann.LayerNorm, torch.nn.RMSNorm: ann.RMSNorm}[minfo.module_cls]
    for mi in minfo.module_inputs_func(minfo, device="cpu", dtype=dtype, requires_grad=True, training=True):
        c = mi.constructor_input
        theirs = minfo.module_cls(*c.args, **c.kwargs, dtype=dtype)
        ours = ours_cls(*c.args, **c.kwargs, dtype=dtype)
        assert list(ours.state_dict()) == list(theirs.state_dict()), mi.desc
        with torch.no_grad():
            for p in theirs.parameters():
                p.uniform_(-1.5, 1.5)
        ours.load_state_dict(theirs.state_dict())
        ref_mod = minfo.module_cls(*c.args, **c.kwargs, dtype=torch.float64)
        ref_mod.load_state_dict(theirs.state_dict())
        x = mi.forward_input.args[0]
        y_ours, y_torch, y_ref = ours(x), theirs(x), ref_mod(_f64(x))
        _no_closer(y_ours, y_torch, y_ref, dtype, f"{mi.desc} output")
        if x.numel() == 0:
            continue
        g = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(0))
        for mod, y in ((ours, y_ours), (theirs, y_torch), (ref_mod, y_ref)):
            y.backward(g.to(y.dtype))
        for (n, p_o), p_t, p_r in zip(ours.named_parameters(), theirs.parameters(), ref_mod.parameters()):
            _no_closer(p_o.grad, p_t.grad, p_r.grad, dtype, f"{mi.desc} grad of {n}")
