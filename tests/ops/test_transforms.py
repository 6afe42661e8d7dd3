"""Every PyTorch transform gives torch's answer on addnorm's ops, or raises a clear error; torch.compile
keeps the fused kernels (the operators appear in the compiled graph)."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import addnorm
from addnorm.model import GPT, GPTConfig

D = 16
KERNELS = addnorm.cpu_kernel_availability().available


def _ref(x, r, w, b):
    s = x + r
    return F.layer_norm(s, (D,), w, b), s


def _inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(dtype) for shape in ((4, D), (4, D), (D,), (D,))]


def test_forward_ad_matches_torch_on_every_function():
    x, r, w, b = _inputs()
    tx, tr, tw, tb = _inputs(1)
    with fwAD.dual_level():
        dx, dr, dw, db = (fwAD.make_dual(p, t) for p, t in ((x, tx), (r, tr), (w, tw), (b, tb)))
        y, s = addnorm.add_layer_norm(dx, dr, D, dw, db)
        y_ref, s_ref = _ref(dx, dr, dw, db)
        for a, e in ((y, y_ref), (s, s_ref)):
            torch.testing.assert_close(fwAD.unpack_dual(a).tangent, fwAD.unpack_dual(e).tangent, atol=1e-5, rtol=1e-5)
        yr = addnorm.rms_norm(dx, D, dw)
        yr_ref = F.rms_norm(dx, (D,), dw, eps=torch.finfo(torch.float32).eps)
        torch.testing.assert_close(fwAD.unpack_dual(yr).tangent, fwAD.unpack_dual(yr_ref).tangent, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", ["hessian", "hvp", "jvp", "vjp"])
def test_autograd_functional_matches_torch(fn):
    x, r, w, b = _inputs()
    x = x[:1]
    r = r[:1]

    def f_ours(x):
        return addnorm.add_rms_norm(x, r, D, w)[0].pow(3).sum()

    def f_ref(x):
        return F.rms_norm(x + r, (D,), w, eps=torch.finfo(torch.float32).eps).pow(3).sum()

    v = torch.randn(1, D)
    call = {"hessian": lambda f: torch.autograd.functional.hessian(f, x),
            "hvp": lambda f: torch.autograd.functional.hvp(f, x, v)[1],
            "jvp": lambda f: torch.autograd.functional.jvp(f, x, v)[1],
            "vjp": lambda f: torch.autograd.functional.vjp(f, x)[1]}[fn]
    got, want = call(f_ours), call(f_ref)
    assert got.abs().max() > 0
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_gradient_penalty_keeps_its_graph():
    x, r, w, b = (t.requires_grad_() for t in _inputs())
    y, _ = addnorm.add_layer_norm(x, r, D, w, b)
    (gx,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
    assert gx.requires_grad
    (gw,) = torch.autograd.grad(gx.pow(2).sum(), w)
    x2, r2, w2, b2 = (t.detach().clone().requires_grad_() for t in (x, r, w, b))
    (gx2,) = torch.autograd.grad(_ref(x2, r2, w2, b2)[0].pow(2).sum(), x2, create_graph=True)
    (gw2,) = torch.autograd.grad(gx2.pow(2).sum(), w2)
    torch.testing.assert_close(gw, gw2, atol=1e-4, rtol=1e-4)


def test_functorch_vmap_grad_jvp():
    x, r, w, b = _inputs()
    xs = torch.randn(3, 4, D)
    torch.testing.assert_close(torch.func.vmap(lambda t: addnorm.layer_norm(t, D, w, b))(xs),
                               F.layer_norm(xs, (D,), w, b), atol=1e-6, rtol=1e-6)
    g = torch.func.grad(lambda t: addnorm.rms_norm(t, D, w).pow(2).sum())(x)
    g_ref = torch.func.grad(lambda t: F.rms_norm(t, (D,), w, eps=torch.finfo(torch.float32).eps).pow(2).sum())(x)
    torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-5)
    _, t = torch.func.jvp(lambda t: addnorm.add_layer_norm(t, r, D, w, b)[0], (x,), (r,))
    _, t_ref = torch.func.jvp(lambda t: _ref(t, r, w, b)[0], (x,), (r,))
    torch.testing.assert_close(t, t_ref, atol=1e-5, rtol=1e-5)


def _call_targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.skipif(not KERNELS, reason="the compiled kernels are not built")
def test_make_fx_jit_trace_and_export_record_the_operator():
    x, r, w, b = _inputs()

    def f(x):
        return addnorm.add_layer_norm(x, r, D, w, b)[0]

    gm = make_fx(f)(x)
    assert "addnorm.add_norm.default" in _call_targets(gm)
    torch.testing.assert_close(gm(x + 1), f(x + 1))
    with pytest.warns(torch.jit.TracerWarning):  # torch warns on the shape checks it sees
        traced = torch.jit.trace(f, x)
    assert "addnorm::add_norm" in str(traced.graph)
    torch.testing.assert_close(traced(x + 1), f(x + 1))
    ep = torch.export.export(addnorm.nn.RMSNorm(D), (x,))
    assert "addnorm.add_norm.default" in _call_targets(ep.graph_module)
    torch.testing.assert_close(ep.module()(x), addnorm.rms_norm(x, D, torch.ones(D)))


def test_fake_and_meta_tensors_report_real_shapes_and_strides():
    with FakeTensorMode():
        x, r = torch.randn(2, 3, D), torch.randn(2, 3, D)
        y, s = addnorm.add_rms_norm(x.transpose(0, 1), r.transpose(0, 1), D, torch.randn(D))
        assert y.shape == (3, 2, D) and y.is_contiguous() and s.is_contiguous()
        yb, sb = addnorm.add_layer_norm(x.bfloat16(), r, D)
        assert yb.dtype == torch.bfloat16 and sb.dtype == torch.float32
    xm = torch.empty(5, D, device="meta")
    ym, sm, st = torch.ops.addnorm.add_norm(xm, xm, None, None, "layer", 1, 1e-5, 0.0, False, None, False)
    assert ym.shape == (5, D) and sm.shape == (5, D) and st.shape == (2, 5)
    assert addnorm.layer_norm(xm, D).device.type == "meta"


def test_nested_jagged_tensors_like_f_layer_norm():
    w, b = torch.randn(D), torch.randn(D)
    nt = torch.nested.nested_tensor([torch.randn(3, D), torch.randn(5, D)], layout=torch.jagged)
    y = addnorm.layer_norm(nt, D, w, b)
    torch.testing.assert_close(y.values(), F.layer_norm(nt, (D,), w, b).values(), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="ragged dim"):
        addnorm.layer_norm(nt, (5, D))
    strided = torch.nested.nested_tensor([torch.randn(3, D), torch.randn(5, D)])
    with pytest.raises(ValueError, match="layout torch.jagged only"):
        addnorm.layer_norm(strided, D)


@pytest.mark.parametrize("what", ["x", "residual", "weight"])
def test_freed_storage_is_refused(what):
    x, r, w, b = _inputs()
    t = {"x": x, "residual": r, "weight": w}[what]
    t.untyped_storage().resize_(0)
    with pytest.raises((RuntimeError, ValueError), match="storage"):
        addnorm.add_layer_norm(x, r, D, w, b)


@pytest.mark.parametrize("what", ["out", "residual_out"])
def test_freed_output_buffer_is_refused(what):
    x, r, w, b = _inputs()
    buf = torch.empty(4, D)
    buf.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError, match=f"{what} has {4 * D} elements but its storage has been freed"):
        addnorm.add_layer_norm(x, r, D, w, b, **{what: buf})


def test_negative_views_are_read_with_their_sign():
    x, r, w, b = _inputs()
    args = [torch._neg_view(t) for t in (x, r, w, b)]
    torch.testing.assert_close(addnorm.add_layer_norm(*args[:2], D, *args[2:])[0],
                               _ref(-x, -r, -w, -b)[0], atol=1e-6, rtol=1e-6)


def test_argument_checks_are_as_strict_as_torch():
    x = torch.randn(2, 64)
    for bad in ((64.7,), (True,), 64.0, "64"):
        with pytest.raises(TypeError, match="normalized_shape"):
            addnorm.layer_norm(x, bad)
    assert torch.equal(addnorm.layer_norm(x, (torch.tensor(64),)), addnorm.layer_norm(x, 64))
    with pytest.raises(TypeError, match="weight_offset"):
        addnorm.rms_norm(x, 64, torch.ones(64), weight_offset=True)
    with pytest.raises(ValueError, match="weight_offset must be a finite number"):
        addnorm.rms_norm(x, 64, torch.ones(64), weight_offset=float("nan"))


@pytest.mark.skipif(not KERNELS, reason="the compiled kernels are not built")
def test_compiled_gpt_fullgraph_calls_the_kernels_and_matches_eager():
    from torch._functorch.aot_autograd import aot_module_simplified

    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))
    idx = torch.randint(0, 64, (4, 16))
    seen = set()

    def backend(gm, example_inputs):
        def keep(g, _):
            seen.update(t for t in _call_targets(g) if t.startswith("addnorm."))
            return g
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    logits, loss = m(idx, idx)
    grads = torch.autograd.grad(loss, list(m.parameters()))
    c_logits, c_loss = torch.compile(m, backend=backend, fullgraph=True)(idx, idx)
    c_grads = torch.autograd.grad(c_loss, list(m.parameters()))
    assert seen == {"addnorm.add_norm.default", "addnorm.add_norm_backward.default"}
    torch.testing.assert_close(c_logits, logits, atol=1e-5, rtol=1e-5)
    for a, e in zip(c_grads, grads):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4)


def test_use_backend_and_backend_argument_inside_compiled_code():
    x, w = torch.randn(2, 8), torch.randn(8)

    def f(x):
        with addnorm.use_backend("torch"):
            a = addnorm.rms_norm(x, 8, w)
        return a + addnorm.rms_norm(x, 8, w, backend="torch") + addnorm.rms_norm(x, 8, w)

    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x), f(x), atol=1e-6, rtol=1e-6)
