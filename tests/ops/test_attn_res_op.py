"""Attention Residuals' depth mix (``addnorm.functional.attn_res``): every backend against the float64
transcription of the paper (``addnorm.reference.attn_res``), PyTorch's operator checks, gradcheck, transforms and
bad input."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD

from addnorm.functional import attn_res, last_backend
from addnorm.reference import attn_res as ref
from tests.backends import KERNELS
from tests.compile_spy import addnorm_ops_backend
from tests.isa_paths import assert_every_isa_agrees, run_under_every_isa

BACKENDS = [b for b in KERNELS if b == "cpu"] + ["torch"]  # no Triton kernel: CUDA runs the formulas
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
# (lead, S, C): one source (weight 1), odd widths, an empty batch, one channel, the paper's ~9 blocks, wide rows
CASES = [((2, 3), 4, 33), ((5,), 1, 8), ((2,), 9, 7), ((0, 3), 4, 16), ((), 2, 1), ((4,), 3, 769), ((3,), 25, 64)]


def _make(lead, S, C, dtype, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    # sources of different magnitudes (the paper's point: RMSNorm keeps a large one from taking the softmax)
    vs = [(r(*lead, C) * (1 + s)).to(dtype).requires_grad_() for s in range(S)]
    return vs, (scale * r(C)).float().requires_grad_(), (1 + 0.3 * r(C)).float().requires_grad_()


def _oracle(vs, q, w, eps):
    return ref.attn_res([v.double() for v in vs], q.double(), None if w is None else w.double(), eps)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead, S, C", CASES)
def test_forward_and_backward_match_the_float64_transcription(lead, S, C, dtype, backend):
    vs, q, w = _make(lead, S, C, dtype)
    h = attn_res(vs, q, w, 1e-5, backend=backend)
    assert h.shape == vs[0].shape and h.dtype == dtype
    h64 = _oracle(vs, q, w, 1e-5)
    tol = TOL[dtype]
    scale = 1 + S  # the sources grow with s
    torch.testing.assert_close(h.double(), h64, atol=tol * 4 * scale, rtol=tol)
    u = torch.randn(h.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ins = [*vs, q, w]
    got = torch.autograd.grad((h.double() * u).sum(), ins)
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    exp = torch.autograd.grad((_oracle(ins64[:S], ins64[S], ins64[S + 1], 1e-5) * u).sum(), ins64)
    for k, (a, e) in enumerate(zip(got, exp, strict=True)):
        mag = 1 + (e.abs().max().item() if e.numel() else 0.0)
        rtol = tol * (4 if k < S else 16)  # q and w: sums over every token
        torch.testing.assert_close(a.double(), e, atol=tol * 8 * mag, rtol=rtol, msg=f"input {k}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sharp_softmax_matches_the_transcription(backend):
    vs, q, w = _make((6, 5), 7, 96, torch.float32, scale=2.0)  # logits ~ 2 sqrt(C): weights near one-hot
    h64 = _oracle(vs, q, w, 1e-6)
    torch.testing.assert_close(attn_res(vs, q, w, 1e-6, backend=backend).double(), h64,
                               atol=2e-6 * h64.abs().max().item(), rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_weight_is_the_unweighted_rms_norm_and_zero_query_the_mean(backend):
    vs, q, _ = _make((3,), 5, 12, torch.float32)
    torch.testing.assert_close(attn_res(vs, q, backend=backend).double(),
                               _oracle(vs, q, None, torch.finfo(torch.float32).eps), atol=1e-5, rtol=1e-5)
    zero = torch.zeros(12)
    torch.testing.assert_close(attn_res(vs, zero, backend=backend), sum(vs) / 5, atol=1e-6, rtol=1e-6)
    assert torch.equal(attn_res(vs[:1], q, backend=backend), vs[0])  # one source: weight 1, h = v exactly


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_dtypes_give_the_promoted_dtype(backend):
    """A float32 embedding beside bf16 layer outputs (what bf16 autocast gives the model) mixes in float32."""
    vs, q, w = _make((4,), 3, 16, torch.float32)
    mixed = [vs[0], vs[1].bfloat16(), vs[2].bfloat16()]
    h = attn_res(mixed, q, w, 1e-5, backend=backend)
    assert h.dtype == torch.float32
    torch.testing.assert_close(h.double(), _oracle(mixed, q, w, 1e-5), atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(h.sum(), mixed)
    assert [g.dtype for g in grads] == [torch.float32, torch.bfloat16, torch.bfloat16]


@pytest.mark.parametrize("backend", ["op", "torch"])
def test_gradcheck_and_gradgradcheck_float64(backend):
    vs, q, w = _make((2, 3), 4, 5, torch.float64)
    ins = tuple(t.detach().double().requires_grad_() for t in (*vs, q, w))

    def f(*a):
        if backend == "op":
            return torch.ops.addnorm.attn_res(list(a[:4]), a[4], a[5], 1e-5)[0]
        return attn_res(a[:4], a[4], a[5], 1e-5, backend="torch")

    assert torch.autograd.gradcheck(f, ins)
    assert torch.autograd.gradgradcheck(f, ins)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_ad_matches_the_transcription(backend):
    vs, q, w = _make((3,), 4, 16, torch.float32)
    prim = [t.detach() for t in (*vs, q, w)]
    tans = [torch.randn_like(p) for p in prim]
    with fwAD.dual_level():
        d = [fwAD.make_dual(p, t) for p, t in zip(prim, tans, strict=True)]
        got = fwAD.unpack_dual(attn_res(d[:4], d[4], d[5], 1e-5, backend=backend)).tangent
    _, want = torch.func.jvp(lambda *a: _oracle(a[:4], a[4], a[5], 1e-5).float(), tuple(prim), tuple(tans))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_opcheck():
    vs, q, w = _make((2, 3), 4, 24, torch.float32)
    torch.library.opcheck(torch.ops.addnorm.attn_res.default, (vs, q, w, 1e-5))
    h, alpha, rstd = torch.ops.addnorm.attn_res([v.detach() for v in vs], q.detach(), w.detach(), 1e-5)
    torch.library.opcheck(torch.ops.addnorm.attn_res_backward.default,
                          (torch.randn_like(h), [v.detach() for v in vs], q.detach(), w.detach(), alpha, rstd, 1e-5))


def test_compile_fullgraph_keeps_the_operator():
    seen = set()
    vs, q, w = _make((2, 3), 5, 32, torch.float32)

    def f(vs, q, w):
        return (attn_res(vs, q, w, 1e-5) * torch.linspace(-1, 1, 32)).sum()

    torch._dynamo.reset()
    eager = torch.autograd.grad(f(vs, q, w), [*vs, q, w])
    comp = torch.autograd.grad(torch.compile(f, backend=addnorm_ops_backend(seen), fullgraph=True)(vs, q, w),
                               [*vs, q, w])
    assert {"addnorm.attn_res.default", "addnorm.attn_res_backward.default"} <= seen
    for a, e in zip(comp, eager, strict=True):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


def test_vmap_uses_the_composite():
    vs, q, w = _make((3, 2), 4, 8, torch.float32)
    vs = [v.detach() for v in vs]
    got = torch.vmap(lambda *a: attn_res(a, q.detach(), w.detach(), 1e-5))(*vs)
    torch.testing.assert_close(got.double(), _oracle(vs, q, w, 1e-5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_propagates_per_token_and_large_logits_stay_finite(backend):
    vs, q, w = (t.detach() if not isinstance(t, list) else [v.detach() for v in t]
                for t in _make((4,), 3, 8, torch.float32))
    vs[1][2, 5] = float("nan")
    h = attn_res(vs, q * 60, w, 1e-5, backend=backend)  # logits ~ 100s: exp overflows float32 without a max shift
    assert torch.isnan(h[2]).all() and torch.isfinite(h[[0, 1, 3]]).all()
    torch.testing.assert_close(h[[0, 1, 3]].double(), _oracle([v[[0, 1, 3]] for v in vs], q * 60, w, 1e-5),
                               atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_backend_that_ran_is_reported(backend):
    vs, q, w = _make((2,), 3, 8, torch.float32)
    attn_res(vs, q, w, backend=backend)
    assert last_backend() == backend


@pytest.mark.parametrize("call, err, match", [
    (lambda vs, q, w: attn_res(torch.stack(vs), q, w), TypeError, "sources must be a list or tuple"),
    (lambda vs, q, w: attn_res([], q, w), ValueError, "sources must hold at least one"),
    (lambda vs, q, w: attn_res([vs[0], vs[1][..., :4]], q, w), ValueError,
     r"sources\[1\] must have sources\[0\]'s shape"),
    (lambda vs, q, w: attn_res([vs[0], vs[1].long()], q, w), TypeError, r"sources\[1\] must be a floating-point"),
    (lambda vs, q, w: attn_res([vs[0], "v"], q, w), TypeError, r"sources\[1\] must be a torch.Tensor"),
    (lambda vs, q, w: attn_res(vs, q[:3], w), ValueError, r"query must have shape \(8,\)"),
    (lambda vs, q, w: attn_res(vs, q, w[None]), ValueError, r"weight must have shape \(8,\)"),
    (lambda vs, q, w: attn_res(vs, None, w), TypeError, "query must be a torch.Tensor"),
    (lambda vs, q, w: attn_res([v[..., :0] for v in vs], q[:0], None), ValueError, "C >= 1"),
    (lambda vs, q, w: attn_res(vs, q, w, float("nan")), ValueError, "eps"),
    (lambda vs, q, w: attn_res(vs, q, w, backend="gpu"), ValueError, "backend"),
])
def test_bad_input_is_refused_naming_the_argument(call, err, match):
    vs, q, w = [torch.randn(2, 3, 8) for _ in range(3)], torch.randn(8), torch.randn(8)
    with pytest.raises(err, match=match):
        call(vs, q, w)


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
@pytest.mark.parametrize("threads", [1, 4])
def test_many_tokens_over_threads_and_chunks_match_and_repeat_bit_for_bit(threads):
    """1.2M elements: cut into chunks whose float64 du partial sums are reduced in chunk order."""
    vs, q, w = _make((128, 9), 9, 128, torch.float32, seed=3)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        runs = []
        for _ in range(2):
            h = attn_res(vs, q, w, 1e-5, backend="cpu")
            runs.append((h, *torch.autograd.grad((h * h).sum(), [*vs, q, w])))
    finally:
        torch.set_num_threads(old)
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    want = attn_res(vs, q, w, 1e-5, backend="torch")
    exp = torch.autograd.grad((want * want).sum(), [*vs, q, w])
    torch.testing.assert_close(runs[0][0], want, atol=2e-6 * want.abs().max().item(), rtol=1e-5)
    for a, e in zip(runs[0][1:], exp, strict=True):
        torch.testing.assert_close(a, e, atol=1e-4 * (1 + e.abs().max().item()), rtol=1e-4)


ISA_SCRIPT = """
import sys, torch, addnorm
from addnorm.functional import attn_res
g = torch.Generator().manual_seed(0)
dt = getattr(torch, sys.argv[1])
vs = [(torch.randn(37, 1029, generator=g) * (1 + s)).to(dt).requires_grad_() for s in range(7)]
q, w = torch.randn(1029, generator=g).requires_grad_(), torch.rand(1029, generator=g).requires_grad_()
h = attn_res(vs, q, w, 1e-5, backend="cpu")
grads = torch.autograd.grad((h.float() * torch.linspace(-1, 1, 1029)).sum(), [*vs, q, w])
torch.save({"isa": addnorm.cpu_kernel_availability().isa, "h": h, "grads": grads}, sys.argv[2])
"""


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_instruction_set_variant_agrees(tmp_path, dtype):
    tol = {"float32": 1e-5, "bfloat16": 1.6e-2}[dtype]
    assert_every_isa_agrees(run_under_every_isa(ISA_SCRIPT, tmp_path, dtype), {"h": tol * 4, "grads": tol * 40}, tol)
