"""Norm-then-add and the parallel residual (``addnorm.functional.fused``): every backend against a float64
oracle written independently here, eager composites bit for bit where eager's rounding is defined,
PyTorch's operator checks, gradcheck, transforms and bad input."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

import addnorm
from addnorm.functional import layer_norm_add, parallel_add_layer_norm, parallel_add_rms_norm, rms_norm_add
from tests.backends import BACKENDS, KERNELS
from tests.compile_spy import addnorm_ops_backend
from tests.isa_paths import assert_every_isa_agrees, run_under_every_isa
from tests.samples import SAMPLES, make, params, upstream

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: (2e-5, 1e-5), torch.bfloat16: (3e-2, 1.6e-2), torch.float16: (4e-3, 2e-3)}


# ---------------------------------------------------------------- the oracle: float64, straight from the formulas


def _norm64(s, shape, kind, w, b, eps):
    dims = tuple(range(-len(shape), 0))
    if kind == "layer":
        xc = s - s.mean(dims, keepdim=True)
        xhat = xc / torch.sqrt((xc * xc).mean(dims, keepdim=True) + eps)
    else:
        xhat = s / torch.sqrt((s * s).mean(dims, keepdim=True) + eps)
    y = xhat if w is None else xhat * w
    return y if b is None else y + b


def _d(t):
    return None if t is None else t.detach().double().requires_grad_(t.requires_grad)


def _call_norm_add(kind, x, r, shape, w, b, eps, backend):
    if kind == "layer":
        return layer_norm_add(x, r, shape, w, b, eps, backend=backend)
    return rms_norm_add(x, r, shape, w, eps, backend=backend)


def _call_parallel(kind, x, x2, r, shape, w, b, w2, b2, eps, backend, branches_first=True):
    if kind == "layer":
        return parallel_add_layer_norm(x, x2, r, shape, w, b, w2, b2, eps, branches_first=branches_first,
                                       backend=backend)
    return parallel_add_rms_norm(x, x2, r, shape, w, w2, eps, branches_first=branches_first, backend=backend)


def _grads(outs, ins, ups):
    loss = sum((o.double() * u.double()).sum() for o, u in zip(outs, ups, strict=True) if o is not None)
    want = [t for t in ins if t is not None and t.requires_grad]
    return torch.autograd.grad(loss, want, allow_unused=True)


# ---------------------------------------------------------------- norm-then-add


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("sample", SAMPLES, ids=str)
def test_norm_add_matches_the_float64_oracle(sample, kind, dtype, backend):
    x = make(sample, dtype, scale=2.0, shift=0.5, requires_grad=True)
    r = make(sample, dtype, seed=5, requires_grad=True)
    w, b = (p.requires_grad_() for p in params(sample, dtype))
    b = b if kind == "layer" else None
    eps = 1e-5
    out = _call_norm_add(kind, x, r, sample.normalized_shape, w, b, eps, backend)
    assert out.shape == x.shape and out.dtype == dtype
    x64, r64, w64, b64 = map(_d, (x, r, w, b))
    ref = r64 + _norm64(x64, sample.normalized_shape, kind, w64, b64, eps)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.double(), ref, atol=atol * 8, rtol=rtol)
    up = upstream(sample, dtype)
    got = _grads([out], [x, r, w, b], [up])
    exp = _grads([ref], [x64, r64, w64, b64], [up])
    scale = 1 + sample.lead[0] if sample.lead else 1  # parameter gradients sum over rows
    for g, e in zip(got, exp, strict=True):
        torch.testing.assert_close(g.double(), e, atol=atol * 16 * scale, rtol=rtol * 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_norm_add_rounds_as_eager_code(dtype, backend):
    """OLMo 2's `residual + self.post_attention_layernorm(h)`: the norm's output stored in h's dtype first."""
    g = torch.Generator().manual_seed(3)
    x, r = (torch.randn(6, 40, 64, generator=g).to(dtype) for _ in range(2))
    w = (1 + torch.randn(64, generator=g) * 0.3).to(dtype)
    eager = r + F.rms_norm(x.float(), (64,), eps=1e-6).to(dtype) * w if dtype != torch.float32 else None
    norm = addnorm.rms_norm(x, 64, w, 1e-6, backend=backend)  # this backend's own norm
    got = rms_norm_add(x, r, 64, w, 1e-6, backend=backend)
    assert torch.equal(got, r + norm), "the add must be one rounding of residual + the stored norm"
    if eager is not None:  # cast_before_weight: Llama's order
        got = rms_norm_add(x, r, 64, w, 1e-6, cast_before_weight=True, backend=backend)
        assert torch.equal(got, eager)


@pytest.mark.parametrize("backend", BACKENDS)
def test_norm_add_float32_stream_beside_bf16_branch(backend):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 48, generator=g).to(torch.bfloat16).requires_grad_()
    r = torch.randn(5, 48, generator=g).requires_grad_()
    w = torch.randn(48, generator=g).to(torch.bfloat16)
    out = layer_norm_add(x, r, 48, w, backend=backend)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, r + addnorm.layer_norm(x, 48, w, backend="torch").float(), atol=0, rtol=0)
    gx, gr = torch.autograd.grad(out.sum(), [x, r])
    assert gx.dtype == torch.bfloat16 and gr.dtype == torch.float32 and torch.equal(gr, torch.ones_like(r))


# ---------------------------------------------------------------- the parallel residual


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("outputs", ["one", "two", "one-branch"])
@pytest.mark.parametrize("sample", SAMPLES, ids=str)
def test_parallel_matches_the_float64_oracle(sample, outputs, kind, dtype, backend):
    x = make(sample, dtype, scale=1.5, requires_grad=True)
    x2 = None if outputs == "one-branch" else make(sample, dtype, seed=7, shift=-0.3, requires_grad=True)
    r = make(sample, dtype, seed=9, scale=3.0, requires_grad=True)
    w, b = (p.requires_grad_() for p in params(sample, dtype))
    w2, b2 = (p.requires_grad_() for p in params(sample, dtype, seed=11))
    if kind == "rms":
        b = b2 = None
    if outputs != "two":
        w2 = b2 = None
    eps = 1e-5
    y, y2, s = _call_parallel(kind, x, x2, r, sample.normalized_shape, w, b, w2, b2, eps, backend)
    assert (y2 is None) == (outputs != "two") and y.dtype == s.dtype == dtype
    x64, x264, r64, w64, b64, w264, b264 = map(_d, (x, x2, r, w, b, w2, b2))
    s64 = r64 + x64 + (0 if x264 is None else x264)
    y64 = _norm64(s64, sample.normalized_shape, kind, w64, b64, eps)
    y264 = None if w264 is None else _norm64(s64, sample.normalized_shape, kind, w264, b264, eps)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(s.double(), s64, atol=atol * 8, rtol=rtol * 2)
    torch.testing.assert_close(y.double(), y64, atol=atol * 8, rtol=rtol * 2)
    if y2 is not None:
        torch.testing.assert_close(y2.double(), y264, atol=atol * 8, rtol=rtol * 2)
    ups = [upstream(sample, dtype, seed=k) for k in (1, 2, 3)]
    ins = [x, x2, r, w, b, w2, b2]
    got = _grads([y, y2, s], ins, ups)
    exp = _grads([y64, y264, s64], [x64, x264, r64, w64, b64, w264, b264], ups)
    scale = 1 + sample.lead[0] if sample.lead else 1
    for g, e in zip(got, exp, strict=True):
        torch.testing.assert_close(g.double(), e, atol=atol * 24 * scale, rtol=rtol * 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_parallel_stream_is_eager_to_the_bit_in_either_order(dtype, backend):
    g = torch.Generator().manual_seed(5)
    a, m, r = (torch.randn(9, 200, generator=g).mul(s).to(dtype) for s in (1.0, 3.0, 40.0))
    _, _, s = parallel_add_layer_norm(a, m, r, 200, backend=backend)
    assert torch.equal(s, m + a + r)  # GPT-NeoX: mlp + attn + residual
    _, _, s = parallel_add_layer_norm(a, m, r, 200, branches_first=False, backend=backend)
    assert torch.equal(s, r + a + m)  # Cohere: residual + attn + mlp
    y, y2, s = parallel_add_layer_norm(a, None, r, 200, backend=backend)
    assert torch.equal(s, r + a) and y2 is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_parallel_float32_stream_beside_bf16_branches(backend):
    g = torch.Generator().manual_seed(6)
    a, m = (torch.randn(4, 64, generator=g).to(torch.bfloat16).requires_grad_() for _ in range(2))
    r = torch.randn(4, 64, generator=g).requires_grad_()
    w = torch.randn(64, generator=g)
    y, _, s = parallel_add_rms_norm(a, m, r, 64, w, backend=backend)
    assert s.dtype == torch.float32 and y.dtype == torch.bfloat16
    assert torch.equal(s, r + (a + m).float())
    torch.testing.assert_close(y, addnorm.rms_norm(s, 64, w, backend="torch").to(torch.bfloat16), atol=0, rtol=0)
    ga, gm, gr = torch.autograd.grad((y.float() * 2).sum() + s.sum(), [a, m, r])
    assert ga.dtype == gm.dtype == torch.bfloat16 and gr.dtype == torch.float32 and torch.equal(ga, gm)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unused_outputs_give_the_gradients_of_what_was_used(backend):
    g = torch.Generator().manual_seed(7)
    a, m, r = (torch.randn(3, 32, generator=g).requires_grad_() for _ in range(3))
    w, b, w2, b2 = (torch.randn(32, generator=g).requires_grad_() for _ in range(4))
    y, y2, s = parallel_add_layer_norm(a, m, r, 32, w, b, w2, b2, backend=backend)
    grads = torch.autograd.grad(y2.sum(), [a, w, b, w2, b2], materialize_grads=True)  # only the second norm used
    ref = torch.autograd.grad(F.layer_norm(m + a + r, (32,), w2, b2).sum(), [a, w2, b2])
    assert torch.count_nonzero(grads[1]) == 0 and torch.count_nonzero(grads[2]) == 0
    for got, exp in zip((grads[0], grads[3], grads[4]), ref, strict=True):
        torch.testing.assert_close(got, exp, atol=1e-5, rtol=1e-5)
    y, y2, s = parallel_add_layer_norm(a, m, r, 32, w, b, w2, b2, backend=backend)
    ga, gw = torch.autograd.grad(s.sum(), [a, w], materialize_grads=True)  # only the stream used
    assert torch.equal(ga, torch.ones_like(a)) and torch.count_nonzero(gw) == 0


# ---------------------------------------------------------------- PyTorch's checks and transforms


def _opcheck_cases():
    g = torch.Generator().manual_seed(0)

    def t(*shape, dtype=torch.float32, grad=True):
        return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)

    yield "norm_add layer", torch.ops.addnorm.norm_add.default, (t(3, 5, 24), t(3, 5, 24), t(24), t(24), "layer", 1,
                                                                 1e-5, 0.0, False)
    yield "norm_add rms bf16 cast", torch.ops.addnorm.norm_add.default, (
        t(4, 24, dtype=torch.bfloat16), t(4, 24, dtype=torch.bfloat16), t(24, dtype=torch.bfloat16), None, "rms", 1,
        1e-6, 1.0, True)
    yield "parallel two", torch.ops.addnorm.parallel_add_norm.default, (
        t(3, 24), t(3, 24), t(3, 24), t(24), t(24), t(24), t(24), "layer", 1, 1e-5, 0.0, False, True, True)
    yield "parallel one, cohere order", torch.ops.addnorm.parallel_add_norm.default, (
        t(2, 3, 24), t(2, 3, 24), t(2, 3, 24), t(24), None, None, None, "rms", 1, 1e-6, 0.0, False, False, False)
    yield "parallel one branch, float64, 2 dims", torch.ops.addnorm.parallel_add_norm.default, (
        t(2, 3, 4, dtype=torch.float64), None, t(2, 3, 4, dtype=torch.float64), t(3, 4, dtype=torch.float64), None,
        None, None, "layer", 2, 1e-5, 0.0, False, False, True)


@pytest.mark.parametrize("name, op, args", list(_opcheck_cases()), ids=[c[0] for c in _opcheck_cases()])
def test_opcheck(name, op, args):
    torch.library.opcheck(op, args)


def test_opcheck_parallel_backward():
    g = torch.Generator().manual_seed(1)
    x, x2, r, w, b, w2, b2 = (torch.randn(*s, generator=g) for s in [(6, 24)] * 3 + [(24,)] * 4)
    _, _, s, stats = torch.ops.addnorm.parallel_add_norm(x, x2, r, w, b, w2, b2, "layer", 1, 1e-5, 0.0, False, True,
                                                         True)
    dy, dy2, dres = (torch.randn(6, 24, generator=g) for _ in range(3))
    torch.library.opcheck(torch.ops.addnorm.parallel_add_norm_backward.default,
                          (dy, dy2, dres, s, stats, w, b, w2, b2, "layer", 1, 1e-5, 0.0, [True, True, True, True]))
    torch.library.opcheck(torch.ops.addnorm.parallel_add_norm_backward.default,
                          (None, dy2, None, s, stats, w, b, w2, b2, "layer", 1, 1e-5, 0.0, [True, False, True, True]))


@pytest.mark.parametrize("backend", ["op", "torch"])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_gradcheck_and_gradgradcheck_float64(kind, backend):
    """"op": the operators themselves (their autograd nodes: backward, and the formulas under create_graph)."""
    g = torch.Generator().manual_seed(2)
    t = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    x, x2, r, w, b, w2, b2 = t(3, 7), t(3, 7), t(3, 7), t(7), t(7), t(7), t(7)

    b, b2 = (b, b2) if kind == "layer" else (None, None)

    def par(x, x2, r, w, b, w2, b2):
        if backend == "op":
            y, y2, s, _ = torch.ops.addnorm.parallel_add_norm(x, x2, r, w, b, w2, b2, kind, 1, 1e-5, 0.5, False, True,
                                                              False)
            return y, y2, s
        return _call_parallel(kind, x, x2, r, 7, w, b, w2, b2, 1e-5, backend)

    def na(x, r, w, b):
        if backend == "op":
            return torch.ops.addnorm.norm_add(x, r, w, b, kind, 1, 1e-5, 0.5, False)[0]
        return _call_norm_add(kind, x, r, 7, w, b, 1e-5, backend)

    for f, args in ((par, (x, x2, r, w, b, w2, b2)), (na, (x, r, w, b))):
        assert torch.autograd.gradcheck(f, args)
        assert torch.autograd.gradgradcheck(f, args)


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_ops_gradcheck_through_the_kernels_float32_against_float64():
    """The kernels' backward (float32) against float64 autograd of the same op (formulas)."""
    g = torch.Generator().manual_seed(3)
    t64 = [torch.randn(*s, generator=g, dtype=torch.float64) for s in [(5, 33)] * 3 + [(33,)] * 4]
    outs = {}
    for dt in (torch.float32, torch.float64):
        ins = [v.to(dt, copy=True).requires_grad_() for v in t64]  # float64: copies, not the upstreams
        y, y2, s, _ = torch.ops.addnorm.parallel_add_norm(*ins, "layer", 1, 1e-5, 0.0, False, True, True)
        loss = (y.double() * t64[0]).sum() + (y2.double() ** 2).sum() + (s.double() * t64[1]).sum()
        outs[dt] = torch.autograd.grad(loss, ins)
    for a, e in zip(outs[torch.float32], outs[torch.float64], strict=True):
        torch.testing.assert_close(a.double(), e, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_ad_matches_the_composite(backend):
    g = torch.Generator().manual_seed(4)
    prim = [torch.randn(*s, generator=g) for s in [(4, 16)] * 3 + [(16,)] * 4]
    tans = [torch.randn_like(p) for p in prim]
    with fwAD.dual_level():
        d = [fwAD.make_dual(p, t) for p, t in zip(prim, tans, strict=True)]
        x, x2, r, w, b, w2, b2 = d
        y, y2, s = parallel_add_layer_norm(x, x2, r, 16, w, b, w2, b2, backend=backend)
        sr = x2 + x + r
        refs = (F.layer_norm(sr, (16,), w, b), F.layer_norm(sr, (16,), w2, b2), sr)
        for a, e in zip((y, y2, s), refs, strict=True):
            torch.testing.assert_close(fwAD.unpack_dual(a).tangent, fwAD.unpack_dual(e).tangent, atol=1e-5, rtol=1e-5)
        o = layer_norm_add(x, r, 16, w, b, backend=backend)
        e = r + F.layer_norm(x, (16,), w, b)
        torch.testing.assert_close(fwAD.unpack_dual(o).tangent, fwAD.unpack_dual(e).tangent, atol=1e-5, rtol=1e-5)


def test_vmap_and_torch_func_grad_use_the_composite():
    g = torch.Generator().manual_seed(5)
    x, x2, r = (torch.randn(3, 4, 16, generator=g) for _ in range(3))
    w = torch.randn(16, generator=g)
    got = torch.vmap(lambda a, b, c: parallel_add_rms_norm(a, b, c, 16, w)[0])(x, x2, r)
    torch.testing.assert_close(got, F.rms_norm(x2 + x + r, (16,), w, eps=torch.finfo(torch.float32).eps))
    gw = torch.func.grad(lambda w: layer_norm_add(x, r, 16, w).sum())(w)
    torch.testing.assert_close(gw, torch.func.grad(lambda w: (r + F.layer_norm(x, (16,), w)).sum())(w))


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_compile_fullgraph_keeps_the_fused_operators():
    seen = set()
    backend = addnorm_ops_backend(seen)

    g = torch.Generator().manual_seed(6)
    x, x2, r = (torch.randn(4, 8, 32, generator=g).requires_grad_() for _ in range(3))
    w, b, w2, b2 = (torch.randn(32, generator=g).requires_grad_() for _ in range(4))

    def f(x, x2, r, w, b, w2, b2):
        y, y2, s = parallel_add_layer_norm(x, x2, r, 32, w, b, w2, b2)
        return layer_norm_add(y * y2, s, 32, w, b)

    eager = f(x, x2, r, w, b, w2, b2)
    ge = torch.autograd.grad(eager.sum(), [x, w, w2])
    torch._dynamo.reset()
    comp = torch.compile(f, backend=backend, fullgraph=True)(x, x2, r, w, b, w2, b2)
    gc = torch.autograd.grad(comp.sum(), [x, w, w2])
    assert {"addnorm.parallel_add_norm.default", "addnorm.norm_add.default",
            "addnorm.parallel_add_norm_backward.default", "addnorm.add_norm_backward.default"} <= seen
    torch.testing.assert_close(comp, eager, atol=1e-5, rtol=1e-5)
    for a, e in zip(gc, ge, strict=True):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- special values and bad input


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_inf_propagate_as_in_the_composite(backend):
    x, x2, r = (torch.randn(4, 16) for _ in range(3))
    x[1, 3], x2[2, 0], r[3, 5] = float("nan"), float("inf"), float("-inf")
    y, _, s = parallel_add_layer_norm(x, x2, r, 16, backend=backend)
    ref_s = x2 + x + r
    torch.testing.assert_close(s, ref_s, equal_nan=True)
    assert torch.equal(torch.isnan(y), torch.isnan(F.layer_norm(ref_s, (16,))))
    assert torch.isfinite(y[0]).all()
    o = rms_norm_add(x, r, 16, backend=backend)
    assert torch.equal(torch.isnan(o), torch.isnan(r + F.rms_norm(x, (16,))))


@pytest.mark.parametrize("call, match", [
    (lambda x: layer_norm_add(x, None, 8), "residual must be a torch.Tensor"),
    (lambda x: layer_norm_add(x, torch.randn(3, 7), 8), "residual must have x's shape"),
    (lambda x: layer_norm_add(x, torch.randn(3, 8, dtype=torch.float64), 8), "residual dtype"),
    (lambda x: layer_norm_add(x, x, 9), "does not end in normalized_shape"),
    (lambda x: layer_norm_add(x, x, 8, torch.randn(7)), "weight must have shape"),
    (lambda x: layer_norm_add(x, x, 8, eps=float("nan")), "eps must be a finite number"),
    (lambda x: layer_norm_add(x, x, 8, backend="gpu"), "backend"),
    (lambda x: rms_norm_add(x.long(), x.long(), 8), "x must be a floating-point tensor"),
    (lambda x: parallel_add_layer_norm(x, torch.randn(3, 9), x, 8), "x2 must have x's shape"),
    (lambda x: parallel_add_layer_norm(x, x.half(), x, 8), "x2 dtype"),
    (lambda x: parallel_add_layer_norm(x, x, x, 8, branches_first=1), "branches_first must be a bool"),
    (lambda x: parallel_add_layer_norm(x, x, x, 8, weight2=torch.randn(4)), "weight2 must have shape"),
    (lambda x: parallel_add_rms_norm(x, x, x, 8, weight_offset=float("inf")), "weight_offset"),
    (lambda x: parallel_add_rms_norm(x, "a", x, 8), "x2 must be a torch.Tensor"),
])
def test_bad_input_is_refused_naming_the_argument(call, match):
    with pytest.raises((TypeError, ValueError, RuntimeError), match=match):
        call(torch.randn(3, 8))


@pytest.mark.parametrize("backend", BACKENDS)
def test_freed_storage_is_refused(backend):
    x, r = torch.randn(3, 8), torch.randn(3, 8)
    r.untyped_storage().resize_(0)
    with pytest.raises((RuntimeError, ValueError), match="storage"):
        layer_norm_add(x, r, 8, backend=backend)
    with pytest.raises((RuntimeError, ValueError), match="storage"):
        parallel_add_layer_norm(x, x, r, 8, backend=backend)


ISA_SCRIPT = """
import sys, torch, addnorm
from addnorm.functional import parallel_add_layer_norm, rms_norm_add
g = torch.Generator().manual_seed(0)
dt = getattr(torch, sys.argv[1])
x, x2, r = (torch.randn(37, 1029, generator=g).to(dt).requires_grad_() for _ in range(3))
w, b, w2 = (torch.randn(1029, generator=g).requires_grad_() for _ in range(3))
y, y2, s = parallel_add_layer_norm(x, x2, r, 1029, w, b, w2, backend="cpu")
o = rms_norm_add(x, r, 1029, w, backend="cpu")
loss = (y.float() * torch.linspace(-1, 1, 1029)).sum() + (y2.float() ** 2).sum() + (o.float() * 0.5).sum()
gx, gw, gw2 = torch.autograd.grad(loss, [x, w, w2])
torch.save({"isa": addnorm.cpu_kernel_availability().isa, "y": y, "y2": y2, "s": s, "o": o, "gx": gx, "gw": gw,
            "gw2": gw2}, sys.argv[2])
"""


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_instruction_set_variant_agrees(tmp_path, dtype):
    tol = {"float32": 1e-5, "bfloat16": 1.6e-2}[dtype]
    assert_every_isa_agrees(run_under_every_isa(ISA_SCRIPT, tmp_path, dtype),
                            {k: tol * 4 for k in ("y", "y2", "s", "o", "gx", "gw", "gw2")}, tol)
