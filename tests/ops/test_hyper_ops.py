"""Hyper-connections without a mixing matrix (``addnorm.functional.hyper``) against the float64 transcription of
HY-V4's and Qwen4-exp's equations (``addnorm.reference.gated_streams``): values and gradients in every dtype and on
every backend (the read and the write+read on mHC's C kernels: ``ops.mhc``), gradcheck, the conventions' effect,
torch.compile, the instruction-set paths, and bad input named."""

import pytest
import torch

from addnorm.functional import (ProjectedGates, StreamNorm, gated_collapse, hyper_read, hyper_write, hyper_write_norm,
                                hyper_write_read, last_backend, stream_rms_norm)
from addnorm.functional import hyper as AF_hyper
from addnorm.ops.hyper import formulas as hyper_formulas
from addnorm.ops.mhc import formulas as mhc_formulas
from addnorm.reference import gated_streams as ref
from tests.backends import BACKENDS, KERNELS
from tests.isa_paths import run_under_every_isa

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 2e-6, torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float64: 1e-12}
# odd C (not a multiple of 16), n = 1, 2, 3, 4, 8, no tokens, one token without a batch
CASES = [((2, 3), 4, 16), ((5,), 1, 8), ((2,), 3, 7), ((0, 3), 4, 16), ((), 2, 1), ((3,), 8, 5), ((4,), 2, 33)]
HY = ProjectedGates(eps=1e-5, pre_eps=1e-3, post_scale=1.5, post_eps=1e-3)


def _rand(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _ran(backend, dtype):
    """What last_backend() says after a read: the C kernels take HY-V4's convention; the Triton ones compute the
    paper's only and decline it (the formulas run); float64 runs on the formulas."""
    return "cpu" if backend == "cpu" and dtype != torch.float64 else "torch"


def _read_inputs(lead, n, C, dtype, groups=2, permuted=False):
    x = (_rand(*lead, C, n, seed=1).transpose(-1, -2) if permuted else _rand(*lead, n, C, seed=1)) * 3
    x = x.to(dtype).requires_grad_()
    w = (_rand(groups * n, n * C, seed=2) * 0.3).float().requires_grad_()
    s = (_rand(groups, seed=3) + 1).float().requires_grad_()
    b = _rand(groups * n, seed=4).float().requires_grad_()
    return x, w, s, b


def _close(got, want, dtype, scale=1.0):
    tol = TOL[dtype]
    torch.testing.assert_close(got.double(), want, atol=tol * 4 * scale, rtol=tol)


def _grads_close(got, want, dtype, slack=8):
    for a, e in zip(got, want, strict=True):
        scale = 1 + (e.abs().max().item() if e.numel() else 0.0)
        tol = max(TOL[dtype], TOL[a.dtype])  # a float32 parameter's gradient beside a float64 stream
        torch.testing.assert_close(a.double(), e, atol=tol * slack * scale, rtol=tol * 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, *DTYPES], ids=str)
@pytest.mark.parametrize("lead, n, C", CASES)
def test_read_matches_the_float64_equations(lead, n, C, dtype, backend):
    if dtype == torch.float64 and backend != "torch":
        pytest.skip("the kernels take float32, bfloat16 and float16")
    x, w, s, b = _read_inputs(lead, n, C, dtype, permuted=n == 4)  # (n = 4: a non-contiguous stream)
    h, pre, post = hyper_read(x, w, s, b, convention=HY, backend=backend)
    assert last_backend() == _ran(backend, dtype)
    assert h.dtype == dtype and h.shape == x.shape[:-2] + (C,)
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    assert pre.dtype == post.dtype == ct and pre.shape == post.shape == x.shape[:-1]
    h64, pre64, post64 = ref.ihc_read(x.detach(), w.detach(), s.detach(), b.detach(), HY.eps, HY.pre_eps,
                                      HY.post_scale)
    _close(pre, pre64, torch.float32 if dtype != torch.float64 else dtype)
    _close(post, post64, torch.float32 if dtype != torch.float64 else dtype)
    _close(h, h64, dtype, scale=3)
    # gradients, through the float64 equations' own autograd
    g = _rand(*h.shape, seed=5)
    gp, gq = _rand(*pre.shape, seed=6), _rand(*post.shape, seed=7)
    ins = [x, w, s, b]
    got = torch.autograd.grad((h.double() * g).sum() + (pre.double() * gp).sum() + (post.double() * gq).sum(), ins)
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    h64, pre64, post64 = ref.ihc_read(*ins64, HY.eps, HY.pre_eps, HY.post_scale)
    want = torch.autograd.grad((h64 * g).sum() + (pre64 * gp).sum() + (post64 * gq).sum(), ins64)
    _grads_close(got, want, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_a_head_reads_with_one_gate_group(dtype, backend):
    """HYV4HyperHead: weight (n, nC), one scale; H_post is empty (mhc_pre with groups 1)."""
    if dtype == torch.float64 and backend != "torch":
        pytest.skip("the kernels take float32, bfloat16 and float16")
    x, w, s, b = _read_inputs((2, 3), 4, 9, dtype, groups=1)
    h, pre, post = hyper_read(x, w, s, b, convention=HY, backend=backend)
    assert last_backend() == _ran(backend, dtype)
    assert post.shape == (2, 3, 0)
    _close(h, ref.ihc_head(x.detach(), w.detach(), s.detach(), b.detach(), HY.eps, HY.pre_eps), dtype, scale=3)
    g = _rand(*h.shape, seed=5)
    got = torch.autograd.grad((h.double() * g).sum() + pre.double().sum(), [x, w, s, b])
    ins64 = [t.detach().double().requires_grad_() for t in (x, w, s, b)]
    h64 = ref.ihc_head(*ins64, HY.eps, HY.pre_eps)
    pre64 = ref.ihc_pre(ref.ihc_mixes(ins64[0], ins64[1], HY.eps), 4, ins64[2][0], ins64[3], HY.pre_eps)
    _grads_close(got, torch.autograd.grad((h64 * g).sum() + pre64.sum(), ins64), dtype)


@pytest.mark.parametrize("rounding", ["once", "products"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, *DTYPES], ids=str)
@pytest.mark.parametrize("lead, n, C", CASES)
def test_the_write_and_read_together_match_the_float64_equations(lead, n, C, dtype, backend, rounding):
    """hyper_write_read: X' = X + H_post^T y and the read of X' (one pass on the C kernels), values and gradients
    against the float64 equations; X' is hyper_write's to the bit, in either rounding."""
    if dtype == torch.float64 and backend != "torch":
        pytest.skip("the kernels take float32, bfloat16 and float16")
    x, w, s, b = _read_inputs(lead, n, C, dtype, permuted=n == 4)
    y = _rand(*lead, C, seed=8).to(dtype).requires_grad_()
    hp = (torch.rand(*lead, n, generator=torch.Generator().manual_seed(9)) * 2).requires_grad_()
    if rounding == "products":  # eager's bf16 x + a y: a in the stream's dtype, each product rounded to it
        hp = hp.detach().to(dtype).requires_grad_()
    rnd = AF_hyper.Rounding(rounding)
    x2, h, pre, post = hyper_write_read(x, y, hp, w, s, b, convention=HY, rounding=rnd, backend=backend)
    assert last_backend() == _ran(backend, dtype)
    assert torch.equal(x2, hyper_write(x, y, hp, rounding=rnd))
    ins = [x, y, hp, w, s, b]
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    x2_64 = ref.expand(*ins64[:3])
    h64, pre64, post64 = ref.ihc_read(x2_64, *ins64[3:], HY.eps, HY.pre_eps, HY.post_scale)
    _close(x2, x2_64, dtype, scale=3)
    _close(h, h64, dtype, scale=6)
    for a, e in ((pre, pre64), (post, post64)):  # read from X' as stored: rounded to the stream's dtype
        _close(a, e, dtype)
    outs, outs64 = (x2, h, pre, post), (x2_64, h64, pre64, post64)
    cots = [_rand(*o.shape, seed=10 + i) for i, o in enumerate(outs)]
    got = torch.autograd.grad(sum((o.double() * c).sum() for o, c in zip(outs, cots)), ins)
    want = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs64, cots)), ins64)
    _grads_close(got, want, dtype, slack=16)


def test_the_convention_is_what_changes_the_gates():
    """post_scale and the eps are read from the convention: DeepSeek's fixed 2 and no eps give other gates than
    HY-V4's magnitude and hc_eps, each the equations' own."""
    x, w, s, b = (t.detach() for t in _read_inputs((3,), 4, 8, torch.float64))
    for conv in (ProjectedGates(eps=1e-6), HY, ProjectedGates(eps=1e-2, pre_eps=0.5, post_scale=3.0, post_eps=-0.25)):
        _, pre, post = hyper_read(x, w, s, b, convention=conv)
        _, pre64, post64 = ref.ihc_read(x, w, s, b, conv.eps, 0.0, conv.post_scale)
        torch.testing.assert_close(pre, pre64 + conv.pre_eps, atol=1e-12, rtol=0)
        torch.testing.assert_close(post, post64 - 0.0 + conv.post_eps, atol=1e-12, rtol=0)
    _, _, p2 = hyper_read(x, w, s, b, convention=ProjectedGates(eps=1e-6))
    _, _, p15 = hyper_read(x, w, s, b, convention=ProjectedGates(eps=1e-6, post_scale=1.5))
    torch.testing.assert_close(p15, p2 * 0.75, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, *DTYPES], ids=str)
@pytest.mark.parametrize("lead, n, C", CASES)
def test_write_matches_the_float64_equations(lead, n, C, dtype):
    x = _rand(*lead, n, C, seed=1).to(dtype).requires_grad_()
    y = _rand(*lead, C, seed=2).to(dtype).requires_grad_()
    hp = (torch.rand(*lead, n, generator=torch.Generator().manual_seed(3)) * 2).requires_grad_()
    x2 = hyper_write(x, y, hp)
    assert x2.dtype == dtype and x2.shape == x.shape
    _close(x2, ref.expand(x.detach(), y.detach(), hp.detach()), dtype, scale=3)
    g = _rand(*x2.shape, seed=4)
    got = torch.autograd.grad((x2.double() * g).sum(), [x, y, hp])
    ins64 = [t.detach().double().requires_grad_() for t in (x, y, hp)]
    want = torch.autograd.grad((ref.expand(*ins64) * g).sum(), ins64)
    for a, e in zip(got, want, strict=True):
        scale = 1 + (e.abs().max().item() if e.numel() else 0.0)
        tol = max(TOL[dtype], TOL[a.dtype])  # a float32 parameter's gradient beside a float64 stream
        torch.testing.assert_close(a.double(), e, atol=tol * 8 * scale, rtol=tol * 4)


def test_the_write_keeps_each_stream_its_own():
    """No mixing matrix: an inf in one stream stays in that stream (a write through a full H_res = I would make
    0 * inf = NaN of every other stream)."""
    x = torch.zeros(1, 3, 4)
    x[0, 1, 2] = float("inf")
    x2 = hyper_write(x, torch.ones(1, 4), torch.ones(1, 3))
    assert torch.isinf(x2[0, 1, 2]) and torch.isfinite(x2[0, [0, 2]]).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, *DTYPES], ids=str)
@pytest.mark.parametrize("lead, n, C", CASES)
def test_stream_norm_and_gated_collapse_match_the_float64_equations(lead, n, C, dtype, backend):
    """The stream norm on each backend (the norm family's RMSNorm per stream on the kernels: ``_ran``); the gated
    collapse on its formulas (no kernel takes per-element gates)."""
    if dtype == torch.float64 and backend != "torch":
        pytest.skip("the kernels take float32, bfloat16 and float16")
    x = (_rand(*lead, C, n, seed=1).transpose(-1, -2) if n == 4 else _rand(*lead, n, C, seed=1)) * 3
    x = x.to(dtype).requires_grad_()
    w = (_rand(n, C, seed=2) * 0.2).to(dtype).requires_grad_()
    conv = StreamNorm(eps=1e-6)
    N = stream_rms_norm(x, w, convention=conv, backend=backend)
    kernel = backend in KERNELS and dtype != torch.float64
    assert last_backend() == (backend if kernel else "torch")
    assert N.dtype == dtype and N.shape == x.shape
    _close(N, ref.stream_rms_norm(x.detach(), w.detach(), conv.eps), dtype, scale=3)
    # HF's flat (nC,) weight is taken as (n, C)
    torch.testing.assert_close(stream_rms_norm(x, w.reshape(-1), convention=conv, backend=backend), N, atol=0, rtol=0)
    G = torch.sigmoid(_rand(*lead, n, C, seed=3)).to(dtype).requires_grad_()
    h = gated_collapse(N, G)
    assert last_backend() == "torch"
    assert h.dtype == dtype and h.shape == x.shape[:-2] + (C,)
    _close(h, ref.gated_collapse(G.detach(), ref.stream_rms_norm(x.detach(), w.detach(), conv.eps)), dtype, scale=3)
    g = _rand(*h.shape, seed=4)
    got = torch.autograd.grad((h.double() * g).sum(), [x, w, G])
    ins64 = [t.detach().double().requires_grad_() for t in (x, w, G)]
    want = torch.autograd.grad((ref.gated_collapse(ins64[2], ref.stream_rms_norm(ins64[0], ins64[1], conv.eps))
                                * g).sum(), ins64)
    for a, e in zip(got, want, strict=True):
        scale = 1 + (e.abs().max().item() if e.numel() else 0.0)
        tol = max(TOL[dtype], TOL[a.dtype])
        torch.testing.assert_close(a.double(), e, atol=tol * 16 * scale, rtol=tol * 4)


def test_a_weight_offset_of_zero_is_a_plain_weight():
    x, w = _rand(2, 3, 8, seed=1), _rand(3, 8, seed=2)
    torch.testing.assert_close(stream_rms_norm(x, w, convention=StreamNorm(1e-6, weight_offset=0.0)),
                               ref.stream_rms_norm(x, w, 1e-6, weight_offset=0.0), atol=1e-12, rtol=0)


def test_the_pairs_are_the_write_then_the_read():
    x, w, s, b = (t.detach() for t in _read_inputs((2, 5), 3, 8, torch.float32))
    y, hp = _rand(2, 5, 8, seed=9).float(), torch.rand(2, 5, 3)
    x2, h, pre, post = hyper_write_read(x, y, hp, w, s, b, convention=HY)
    assert torch.equal(x2, hyper_write(x, y, hp))
    for a, e in zip((h, pre, post), hyper_read(x2, w, s, b, convention=HY), strict=True):
        assert torch.equal(a, e)
    nw = _rand(3, 8, seed=10).float()
    x2n, N = hyper_write_norm(x, y, hp, nw, convention=StreamNorm(1e-6))
    assert torch.equal(x2n, x2) and torch.equal(N, stream_rms_norm(x2, nw, convention=StreamNorm(1e-6)))


def test_gradcheck_in_float64():
    x, w, s, b = (t.detach().double().requires_grad_() for t in _read_inputs((2,), 3, 4, torch.float64))
    y, hp = _rand(2, 4, seed=5).requires_grad_(), torch.rand(2, 3, dtype=torch.float64).requires_grad_()
    torch.autograd.gradcheck(lambda *a: hyper_read(*a, convention=HY), (x, w, s, b))
    torch.autograd.gradgradcheck(lambda *a: hyper_read(*a, convention=HY)[0], (x, w, s, b))
    # through the operators (their autograd: mhc_pre's, and mhc_write_pre's two-pass backward)
    ops = torch.ops.addnorm
    read = lambda *a: ops.hyper_read(*a, HY.eps, HY.pre_eps, HY.post_scale, HY.post_eps)  # noqa: E731
    torch.autograd.gradcheck(read, (x, w, s, b))
    torch.autograd.gradgradcheck(read, (x, w, s, b))
    for rounding in (AF_hyper.ONCE, AF_hyper.PRODUCTS):
        pair = lambda *a, r=rounding: hyper_write_read(*a, convention=HY, rounding=r)  # noqa: E731
        torch.autograd.gradcheck(pair, (x, y, hp, w, s, b))
        torch.autograd.gradgradcheck(pair, (x, y, hp, w, s, b))
    torch.autograd.gradcheck(hyper_write, (x, y, hp))
    nw = _rand(3, 4, seed=6).requires_grad_()
    torch.autograd.gradcheck(lambda a, c: stream_rms_norm(a, c, convention=StreamNorm(1e-6)), (x, nw))
    torch.autograd.gradcheck(gated_collapse, (x, torch.rand(2, 3, 4, dtype=torch.float64).requires_grad_()))


def test_compiled_calls_trace_the_operators():
    x, w, s, b = (t.detach() for t in _read_inputs((2, 3), 4, 8, torch.float32))
    f = torch.compile(lambda *a: hyper_read(*a, convention=HY), fullgraph=True, backend="eager")
    for a, e in zip(f(x, w, s, b), hyper_read(x, w, s, b, convention=HY), strict=True):
        torch.testing.assert_close(a, e, atol=0, rtol=0)


def test_autocast_does_not_lower_the_gates():
    """HF's iHC turns autocast off around its gates: the read under CPU autocast gives the float32 gates."""
    x, w, s, b = (t.detach() for t in _read_inputs((2, 3), 4, 8, torch.float32))
    want = hyper_read(x, w, s, b, convention=HY)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = hyper_read(x, w, s, b, convention=HY)
    for a, e in zip(got, want, strict=True):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a, e, atol=0, rtol=0)


@pytest.mark.parametrize("call, match", [
    (lambda x, w, s, b: hyper_read(x[..., :2, :], w, s, b, convention=HY), r"weight must have shape \(4, 16\)"),
    (lambda x, w, s, b: hyper_read(x, w[:, :-1], s, b, convention=HY), r"weight must have shape \(8, 32\)"),
    (lambda x, w, s, b: hyper_read(x, w, s[:1], b, convention=HY), "scale must have 2 elements"),
    (lambda x, w, s, b: hyper_read(x, w, s, b[:-1], convention=HY), "base must have 8 elements"),
    (lambda x, w, s, b: hyper_read(x, w, s, b, convention=StreamNorm(1e-6)), "convention must be an addnorm"),
    (lambda x, w, s, b: hyper_read(x.long(), w, s, b, convention=HY), "x must be a floating-point tensor"),
    (lambda x, w, s, b: hyper_write(x, x[..., 0, :1], x[..., 0]), r"y must have shape \(2, 3, 8\)"),
    (lambda x, w, s, b: hyper_write(x, x[..., 0, :], s), r"h_post must have shape \(2, 3, 4\)"),
    (lambda x, w, s, b: stream_rms_norm(x, w[0, :8], convention=StreamNorm(1e-6)), "weight must have 32 elements"),
    (lambda x, w, s, b: stream_rms_norm(x, w[0, :32].reshape(2, 16), convention=StreamNorm(1e-6)),
     r"weight must have shape \(4, 8\) or \(32,\)"),
    (lambda x, w, s, b: gated_collapse(x, x[..., :1, :]), r"gates must have shape \(2, 3, 4, 8\)"),
    (lambda x, w, s, b: hyper_write(torch.zeros(3), x, s), r"x must be a widened stream \(\.\.\., n >= 1, C >= 1\)"),
])
def test_bad_input_is_named(call, match):
    x, w, s, b = (t.detach() for t in _read_inputs((2, 3), 4, 8, torch.float32))
    with pytest.raises((ValueError, TypeError), match=match):
        call(x, w, s, b)


@pytest.mark.parametrize("kwargs, match", [(dict(eps=float("nan")), "eps must be a finite number"),
                                           (dict(eps=-1.0), "eps must be >= 0"),
                                           (dict(eps=1e-6, post_scale="2"), "post_scale must be a finite number")])
def test_a_bad_convention_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProjectedGates(**kwargs)
    with pytest.raises(ValueError, match="weight_offset must be a finite number"):
        StreamNorm(1e-6, weight_offset=float("inf"))


def test_opcheck():
    """PyTorch's own checks of each operator: schema, fake tensors, autograd registration, AOT dispatch."""
    x, w, s, b = _read_inputs((2, 3), 4, 8, torch.float32)
    y, hp = _rand(2, 3, 8, seed=5).float().requires_grad_(), torch.rand(2, 3, 4).requires_grad_()
    nw = _rand(4, 8, seed=6).float().requires_grad_()
    ops = torch.ops.addnorm
    torch.library.opcheck(ops.hyper_read.default, (x, w, s, b, 1e-5, 1e-3, 1.5, 1e-3))
    for products in (False, True):  # the write and the read in one operator (mhc_pre's convention, no H_res)
        read = (w.t(), s[0], s[1], torch.zeros(()), b[:4], b[4:], torch.zeros(0), None)
        conv = (1e-3, 0.0, False, 1.5, 1e-3, 2)
        torch.library.opcheck(ops.mhc_write_pre.default, (x, y, hp, None, products, *read, 1e-5, 0, *conv))
        det = [t.detach() for t in (x, y, hp)]
        x2, _, _, _, _, p, rstd = ops.mhc_write_pre(*det, None, products, *(t.detach() if t is not None else t
                                                                             for t in read), 1e-5, 0, *conv)
        g = torch.Generator().manual_seed(3)
        grads = (torch.randn(x2.shape, generator=g), torch.randn(2, 3, 8, generator=g), None,
                 torch.randn(2, 3, 4, generator=g), None)
        torch.library.opcheck(ops.mhc_write_pre_backward.default,
                              (*grads, *det, None, products, x2, *(t.detach() if t is not None else t for t in read),
                               p, rstd, 1e-5, 0, *conv))
    torch.library.opcheck(ops.hyper_write.default, (x, y, hp, "once"))
    torch.library.opcheck(ops.hyper_write.default, (x, y, hp, "products"))
    torch.library.opcheck(ops.hyper_stream_norm.default, (x, nw, 1e-6, 1.0))
    torch.library.opcheck(ops.hyper_gated_collapse.default, (x, torch.rand(2, 3, 4, 8), "products"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rounding_where_eager_rounds(dtype):
    """PRODUCTS: each product rounded to the inputs' dtype first, as eager 16-bit ``x + a y`` and ``mean(G * N)``
    compute them -- the same bits; ONCE: the float32 result rounded once, as HY-V4's casts do."""
    from addnorm.functional.hyper import ONCE, PRODUCTS

    x, y = _rand(4, 3, 64, seed=1).to(dtype), _rand(4, 64, seed=2).to(dtype)
    a, G = torch.rand(4, 3, generator=torch.Generator().manual_seed(3)).to(dtype), torch.rand(4, 3, 64).to(dtype)
    assert torch.equal(hyper_write(x, y, a, rounding=PRODUCTS), x + (y.unsqueeze(-2) * a.unsqueeze(-1)))
    assert torch.equal(gated_collapse(x, G, rounding=PRODUCTS), (G * x).mean(-2))
    once = (a.float().unsqueeze(-1) * y.float().unsqueeze(-2) + x.float()).to(dtype)
    assert torch.equal(hyper_write(x, y, a, rounding=ONCE), once)
    assert not torch.equal(once, x + (y.unsqueeze(-2) * a.unsqueeze(-1)))  # the two do differ in 16 bits
    with pytest.raises(ValueError, match=r"rounding must be one of \('once', 'products'\), got 'twice'"):
        AF_hyper.Rounding("twice")
    with pytest.raises(TypeError, match="rounding must be an addnorm.functional.Rounding"):
        hyper_write(x, y, a, rounding="products")


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_c_kernels_run_the_read_and_the_pair_both_ways(dtype, monkeypatch):
    """With every formula the read and the write could fall back to made to raise, hyper_read, the head and
    hyper_write_read still run forward and backward on the CPU kernels -- and the same calls on the torch backend
    do reach the formulas (so the patch would have caught a fallback)."""
    x, w, s, b = _read_inputs((3, 5), 4, 19, dtype)
    y = _rand(3, 5, 19, seed=8).to(dtype).requires_grad_()
    hp = torch.rand(3, 5, 4).requires_grad_()
    hx, hw, hs, hb = _read_inputs((3, 5), 4, 19, dtype, groups=1)

    def calls(backend):
        outs = [*hyper_read(x, w, s, b, convention=HY, backend=backend),
                *hyper_write_read(x, y, hp, w, s, b, convention=HY, backend=backend),
                hyper_read(hx, hw, hs, hb, convention=HY, backend=backend)[0]]
        assert last_backend() == backend
        torch.autograd.grad(sum(o.float().sum() for o in outs), [x, y, hp, w, s, b, hx, hw, hs, hb])

    def boom(*a, **k):
        raise AssertionError("the formulas ran")

    for mod, name in ((mhc_formulas, "pre"), (mhc_formulas, "pre_backward"), (mhc_formulas, "pre_jvp"),
                      (hyper_formulas, "write")):
        monkeypatch.setattr(mod, name, boom)
    calls("cpu")
    with pytest.raises(AssertionError, match="the formulas ran"):
        calls("torch")


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_the_pair_is_one_kernel_call_each_way(monkeypatch):
    """hyper_write_read forward is one call of the C write+read kernel, backward one of its backward: neither the
    read's kernels nor the write's formulas run apart."""
    from addnorm.kernels.cpu import mhc as cpu_mhc

    counts = {}
    for name in ("mhc_pre", "mhc_pre_backward", "mhc_write_pre", "mhc_write_pre_backward"):
        real = getattr(cpu_mhc, name)

        def spy(*a, _real=real, _name=name):
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*a)

        monkeypatch.setattr(cpu_mhc, name, spy)
    x, w, s, b = _read_inputs((3, 5), 4, 19, torch.bfloat16)
    y = _rand(3, 5, 19, seed=8).to(torch.bfloat16).requires_grad_()
    hp = torch.rand(3, 5, 4).requires_grad_()
    outs = hyper_write_read(x, y, hp, w, s, b, convention=HY, backend="cpu")
    torch.autograd.grad(sum(o.float().sum() for o in outs), [x, y, hp, w, s, b])
    assert counts == {"mhc_write_pre": 1, "mhc_write_pre_backward": 1}


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_c_kernels_run_the_stream_norm_both_ways(dtype, monkeypatch):
    x = (_rand(3, 5, 4, 19, seed=1) * 3).to(dtype).requires_grad_()
    w = (_rand(4 * 19, seed=2) * 0.2).to(dtype).requires_grad_()  # HF's flat weight

    def boom(*a, **k):
        raise AssertionError("the formulas ran")

    monkeypatch.setattr(hyper_formulas, "stream_norm", boom)
    monkeypatch.setattr(torch.ops.addnorm, "hyper_stream_norm", boom)  # the operator of the formulas, as registered
    N = stream_rms_norm(x, w, convention=StreamNorm(1e-6), backend="cpu")
    assert last_backend() == "cpu"
    gx, gw = torch.autograd.grad(N.float().square().sum(), [x, w])
    assert gx.shape == x.shape and gw.shape == w.shape
    with pytest.raises(AssertionError, match="the formulas ran"):
        stream_rms_norm(x, w, convention=StreamNorm(1e-6), backend="torch")


ISA_SCRIPT = r"""
import sys, torch, addnorm
from addnorm.functional import ProjectedGates, StreamNorm, hyper_read, hyper_write_read, stream_rms_norm
ins, numbers = torch.load(sys.argv[1])
conv = ProjectedGates(*numbers)
res = {}
for dt in ("float32", "bfloat16"):
    x, y = (t.to(getattr(torch, dt)).requires_grad_() for t in ins[:2])
    hp, w, s, b = (t.clone().requires_grad_() for t in ins[2:])
    outs = [*hyper_read(x, w, s, b, convention=conv, backend="cpu"),
            *hyper_write_read(x, y, hp, w, s, b, convention=conv, backend="cpu"),
            stream_rms_norm(x, w[0].reshape(x.shape[-2:]), convention=StreamNorm(conv.eps, 1.0), backend="cpu")]
    assert addnorm.last_backend() == "cpu"
    grads = torch.autograd.grad(sum(o.double().sum() * (i + 1) for i, o in enumerate(outs)), [x, y, hp, w, s, b])
    res[dt] = [t.detach() for t in (*outs, *grads)]
torch.save({"isa": addnorm.cpu_kernel_availability().isa, "res": res}, sys.argv[2])
"""


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_every_instruction_set_path_meets_the_float64_tolerance(tmp_path):
    """ADDNORM_CPU_ISA=baseline|avx2 caps the kernels' instruction set (read once per process): the read, the
    write+read and the stream norm of each path, in its own process, against the float64 equations (odd C: every
    loop's tail)."""
    n, C = 4, 259
    x = _rand(37, n, C, seed=1) * 3
    y = _rand(37, C, seed=2)
    hp = (torch.rand(37, n, generator=torch.Generator().manual_seed(3)) * 2).float()
    w, s, b = (_rand(2 * n, n * C, seed=4) * 0.1).float(), (_rand(2, seed=5) + 1).float(), _rand(2 * n, seed=6).float()
    torch.save(((x, y, hp, w, s, b), (HY.eps, HY.pre_eps, HY.post_scale, HY.post_eps)), tmp_path / "in.pt")
    for isa, got in run_under_every_isa(ISA_SCRIPT, tmp_path, tmp_path / "in.pt").items():
        for dt, res in got["res"].items():
            dtype = getattr(torch, dt)
            ins64 = [t.to(dtype).double().requires_grad_() if i < 2 else t.double().requires_grad_()
                     for i, t in enumerate((x, y, hp, w, s, b))]
            x2 = ref.expand(*ins64[:3])
            outs = (*ref.ihc_read(ins64[0], *ins64[3:], HY.eps, HY.pre_eps, HY.post_scale), x2,
                    *ref.ihc_read(x2, *ins64[3:], HY.eps, HY.pre_eps, HY.post_scale),
                    ref.stream_rms_norm(ins64[0], ins64[3][0].reshape(n, C), HY.eps))
            grads = torch.autograd.grad(sum(o.sum() * (i + 1) for i, o in enumerate(outs)), ins64)
            tol = TOL[dtype]
            for k, (a, e) in enumerate(zip(res, (*outs, *grads), strict=True)):
                e = e.detach()
                if k in (1, 2) or (k in (5, 6) and dtype == torch.float32):  # gates (of X' as stored: k = 5, 6)
                    atol = 2e-5
                else:
                    atol = tol * 8 * (1 + e.abs().max().item())
                torch.testing.assert_close(a.double(), e, atol=atol, rtol=tol * 4, msg=f"{isa} {dt} output {k}")


@pytest.mark.parametrize("call, error, match", [
    (lambda x, y, hp, w, s, b: hyper_write_read(x, y[..., :3], hp, w, s, b, convention=HY), ValueError,
     r"y must have shape \(2, 3, 8\)"),
    (lambda x, y, hp, w, s, b: hyper_write_read(x, y, hp[..., :2], w, s, b, convention=HY), ValueError,
     r"h_post must have shape \(2, 3, 4\)"),
    (lambda x, y, hp, w, s, b: hyper_write_read(x, y, hp, w[:, :-1], s, b, convention=HY), ValueError,
     r"weight must have shape \(8, 32\)"),
    (lambda x, y, hp, w, s, b: hyper_write_read(x, y, hp, w, s, b, convention=HY, rounding="once"), TypeError,
     "rounding must be an addnorm.functional.Rounding"),
    (lambda x, y, hp, w, s, b: hyper_read(x, w, s, b, convention=HY, backend="gpu"), ValueError, "backend must be"),
    (lambda x, y, hp, w, s, b: hyper_read(x.double(), w, s, b, convention=HY, backend="cpu"), RuntimeError,
     "backend='cpu' cannot run this call: x has dtype torch.float64"),
])
def test_bad_input_to_the_kernel_paths_is_named(call, error, match):
    x, w, s, b = (t.detach() for t in _read_inputs((2, 3), 4, 8, torch.float32))
    with pytest.raises(error, match=match):
        call(x, _rand(2, 3, 8, seed=3).float(), torch.rand(2, 3, 4), w, s, b)
