"""The fused forms' Triton kernels compiled for a GPU: every new operator on CUDA tensors against the float64
formulas on the CPU, forward and backward, float32 and bfloat16. Needs CUDA (and Triton): skipped without
it -- CI has no GPU; the same kernels run under Triton's interpreter in every other test."""

import os

import pytest
import torch

import addnorm
from addnorm.ops.fused import formulas as fused_formulas
from addnorm.ops.pointwise import formulas as pointwise_formulas
from addnorm.ops.stream import formulas as stream_formulas

# ADDNORM_CUDA_TESTS_ON=cpu runs this file's checks on CPU tensors under Triton's interpreter: a check of the
# checks themselves where there is no GPU (backend="auto" then picks the CPU kernels, so that assertion is skipped)
DEV = os.environ.get("ADDNORM_CUDA_TESTS_ON", "cuda")
pytestmark = [pytest.mark.skipif(DEV == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(DEV == "cpu" and torch.cuda.is_available(),
                                 reason="ADDNORM_CUDA_TESTS_ON=cpu needs Triton's interpreter, which is off where CUDA is")]
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def _both(*shapes, dtype):
    g = torch.Generator().manual_seed(0)
    cpu = [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]
    return cpu, [t.to(DEV, dtype).requires_grad_() for t in cpu]


def _check(got, ref, dtype):
    for a, e in zip(got, ref, strict=True):
        if a is None:
            continue
        scale = 1 + e.abs().max().item() if e.numel() else 1
        torch.testing.assert_close(a.detach().double().cpu(), e.detach(), atol=TOL[dtype] * scale, rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("D", [7, 768, 5000])
def test_norm_add_and_parallel(D, dtype):
    cpu, dev = _both((33, D), (33, D), (33, D), (D,), (D,), (D,), (D,), dtype=dtype)
    y, y2, s = addnorm.parallel_add_layer_norm(dev[0], dev[1], dev[2], D, *dev[3:], backend="triton")
    assert addnorm.last_backend() == "triton"  # the kernel ran (a declined call reports "torch")
    o = addnorm.layer_norm_add(dev[0], dev[2], D, dev[3], dev[4], backend="triton")
    assert addnorm.last_backend() == "triton"
    loss = (y.float() ** 2).sum() + (y2.float() * 0.5).sum() + s.float().sum() + (o.float() ** 2).sum()
    got = [y, y2, s, o, *torch.autograd.grad(loss, dev)]
    c = [t.clone().requires_grad_() for t in cpu]
    ry, ry2, rs, _ = fused_formulas.parallel_add_norm(c[0], c[1], c[2], *c[3:], "layer", 1, 1e-5, 0.0, False, True,
                                                      True)
    ro, _ = fused_formulas.norm_add(c[0], c[2], c[3], c[4], "layer", 1, 1e-5, 0.0, False)
    rloss = (ry ** 2).sum() + (ry2 * 0.5).sum() + rs.sum() + (ro ** 2).sum()
    _check(got, [ry, ry2, rs, ro, *torch.autograd.grad(rloss, c)], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_dyt_and_derf(kind, dtype):
    cpu, dev = _both((33, 768), (33, 768), (768,), (768,), dtype=dtype)
    a, sh = torch.tensor(0.7, device=DEV, requires_grad=True), torch.tensor(0.1, device=DEV, requires_grad=True)
    fn = addnorm.add_dyt if kind == "dyt" else addnorm.add_derf
    extra = (sh,) if kind == "derf" else ()
    y, s = fn(dev[0], dev[1], a, *extra, dev[2], dev[3], backend="triton")
    assert addnorm.last_backend() == "triton"
    ins = [*dev, a, *extra]
    got = [y, s, *torch.autograd.grad((y.float() ** 2).sum() + s.float().sum(), ins)]
    c = [t.clone().requires_grad_() for t in cpu]
    ca, csh = torch.tensor(0.7, dtype=torch.float64, requires_grad=True), torch.tensor(0.1, dtype=torch.float64,
                                                                                    requires_grad=True)
    ry, rs = pointwise_formulas.forward(c[0], c[1], ca, csh if kind == "derf" else None, c[2], c[3], kind)
    rins = [*c, ca] + ([csh] if kind == "derf" else [])
    _check(got, [ry, rs, *torch.autograd.grad((ry ** 2).sum() + rs.sum(), rins)], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_stream_read_and_write(dtype):
    cpu, dev = _both((65, 4, 768), (65, 768), dtype=dtype)
    g = torch.Generator().manual_seed(1)
    coeffs = [torch.rand(65, 4, generator=g), torch.rand(65, 4, generator=g), torch.rand(65, 4, 4, generator=g)]
    cdev = [t.to(DEV).requires_grad_() for t in coeffs]
    h = addnorm.stream_read(dev[0], cdev[0], backend="triton")
    assert addnorm.last_backend() == "triton"
    x2, q = addnorm.stream_write(dev[0], dev[1], cdev[1], cdev[2], backend="triton")
    assert addnorm.last_backend() == "triton"
    loss = (h.float() ** 2).sum() + (x2.float() * 0.5).sum() + q.sum() * 1e-3
    got = [h, x2, q, *torch.autograd.grad(loss, dev + cdev)]
    c = [t.clone().requires_grad_() for t in cpu]
    cc = [t.double().requires_grad_() for t in coeffs]
    rh = stream_formulas.read(c[0], cc[0])
    rx2, rq = stream_formulas.write(c[0], c[1], cc[1], cc[2])
    rloss = (rh ** 2).sum() + (rx2 * 0.5).sum() + rq.sum() * 1e-3
    _check(got, [rh, rx2, rq, *torch.autograd.grad(rloss, c + cc)], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("D", [7, 768, 5000, 20000])
def test_rms_norm_add_and_parallel_rms(D, dtype):
    """The RMSNorm side of norm-then-add and the parallel residual (one and two outputs), rows strided in memory
    (a slice of wider rows); rows longer than one block (20000 > 16384) are declined by the fused kernels and
    run on the formulas, which ``last_backend`` then reports."""
    cpu, _ = _both((33, D), (33, D), (33, D), (D,), (D,), dtype=dtype)

    def strided(t):  # (33, D) as the first D columns of (33, D + 3) rows: unit stride on D, row stride D + 3
        wide = torch.zeros(33, D + 3, dtype=dtype, device=DEV)
        wide[:, :D] = t.to(DEV, dtype)
        return wide[:, :D].requires_grad_()

    x, x2, r = (strided(t) for t in cpu[:3])
    w1, w2 = (t.to(DEV, dtype).requires_grad_() for t in cpu[3:])
    assert not x.is_contiguous()
    ran = "triton" if D <= 16384 else "torch"
    y, y2, s = addnorm.parallel_add_rms_norm(x, x2, r, D, w1, w2, eps=1e-6, backend="triton")
    assert addnorm.last_backend() == ran
    y1, _, s1 = addnorm.parallel_add_rms_norm(x, x2, r, D, w1, None, eps=1e-6, backend="triton")
    assert addnorm.last_backend() == ran
    o = addnorm.rms_norm_add(x, r, D, w1, eps=1e-6, backend="triton")
    assert addnorm.last_backend() == ran
    loss = (y.float() ** 2).sum() + (y2.float() * 0.5).sum() + s.float().sum() + (o.float() ** 2).sum()
    got = [y, y2, s, y1, s1, o, *torch.autograd.grad(loss, [x, x2, r, w1, w2])]
    c = [t.clone().requires_grad_() for t in cpu]
    ry, ry2, rs, _ = fused_formulas.parallel_add_norm(c[0], c[1], c[2], c[3], None, c[4], None, "rms", 1, 1e-6, 0.0,
                                                      False, True, True)
    ro, _ = fused_formulas.norm_add(c[0], c[2], c[3], None, "rms", 1, 1e-6, 0.0, False)
    rloss = (ry ** 2).sum() + (ry2 * 0.5).sum() + rs.sum() + (ro ** 2).sum()
    _check(got, [ry, ry2, rs, ry, rs, ro, *torch.autograd.grad(rloss, c)], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("lite", [False, True], ids=["sinkhorn", "lite"])
@pytest.mark.parametrize("C", [100, 768])
def test_mhc_pre(C, lite, dtype):
    """mHC's pre step (the RMS of vec(X), the projection, sigma / 2 sigma / Sinkhorn or the permutation mix, h) on
    CUDA against the float64 spec on the CPU: outputs and every input's gradient."""
    from addnorm.model.streams import permutation_matrices
    from addnorm.ops.mhc import formulas as mhc_formulas

    n, T = 4, 37
    g = torch.Generator().manual_seed(2)
    perms = permutation_matrices(n) if lite else None  # mHC-lite: the n! permutation matrices (r, n, n)
    m = 2 * n + (len(perms) if lite else n * n)
    x = torch.randn(T, n, C, generator=g, dtype=torch.float64) * 1.5 + 0.2
    phi = torch.randn(n * C, m, generator=g, dtype=torch.float64) / (n * C) ** 0.5
    a = [torch.tensor(v, dtype=torch.float64) for v in (0.8, 1.3, 1.7)]
    b = [0.5 * torch.randn(*s, generator=g, dtype=torch.float64) for s in ((n,), (n,), (len(perms),) if lite
                                                                         else (n, n))]
    cpu = [x, phi, *a, *b]
    dev = [x.to(DEV, dtype).requires_grad_(), *(t.to(DEV, torch.float32).requires_grad_() for t in cpu[1:])]
    out = addnorm.mhc_pre(*dev, perms=None if perms is None else perms.to(DEV, torch.float32),
                         backend="triton")
    assert addnorm.last_backend() == "triton"
    wts = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in out]
    loss = sum((o.double() * w.to(DEV)).sum() for o, w in zip(out, wts))
    got = [*out, *torch.autograd.grad(loss, dev)]
    c = [t.clone().requires_grad_() for t in cpu]
    ref = mhc_formulas.pre(*c, perms, 1e-6, 20)[:4]
    rloss = sum((o * w).sum() for o, w in zip(ref, wts))
    _check(got, [*ref, *torch.autograd.grad(rloss, c)], dtype)


def _op_calls():
    """Each new operator's public call on small CUDA inputs: name -> (fn of the inputs, inputs)."""
    g = torch.Generator().manual_seed(3)
    t = lambda *s: torch.randn(*s, generator=g).to(DEV).requires_grad_()  # noqa: E731
    D = 256
    x, a, r, w, b, w2 = t(8, D), t(8, D), t(8, D), t(D), t(D), t(D)
    alpha, shift = t(()), t(())
    X, y = t(8, 4, D), t(8, D)
    hp, hpo, hr = t(8, 4), t(8, 4), t(8, 4, 4)
    phi, sc = t(4 * D, 24), [t(()) for _ in range(3)]
    bb = [t(4), t(4), t(4, 4)]
    return {
        "layer_norm_add": (lambda *v: addnorm.layer_norm_add(v[0], v[1], D, v[2], v[3]), (x, r, w, b)),
        "rms_norm_add": (lambda *v: addnorm.rms_norm_add(v[0], v[1], D, v[2]), (x, r, w)),
        "parallel_add_layer_norm": (lambda *v: addnorm.parallel_add_layer_norm(v[0], v[1], v[2], D, v[3], v[4], v[5]),
                                    (x, a, r, w, b, w2)),
        "parallel_add_rms_norm": (lambda *v: addnorm.parallel_add_rms_norm(v[0], v[1], v[2], D, v[3], v[4]),
                                  (x, a, r, w, w2)),
        "add_dyt": (lambda *v: addnorm.add_dyt(*v), (x, r, alpha, w, b)),
        "add_derf": (lambda *v: addnorm.add_derf(*v), (x, r, alpha, shift, w, b)),
        "stream_read": (lambda *v: addnorm.stream_read(*v), (X, hp)),
        "stream_write": (lambda *v: addnorm.stream_write(*v), (X, y, hpo, hr)),
        "mhc_pre": (lambda *v: addnorm.mhc_pre(*v), (X, phi, *sc, *bb)),
    }


@pytest.mark.parametrize("name", [
    "layer_norm_add", "rms_norm_add", "parallel_add_layer_norm", "parallel_add_rms_norm", "add_dyt", "add_derf",
    "stream_read", "stream_write", "mhc_pre"])
def test_auto_picks_triton_and_compile_keeps_the_operator(name):
    """backend="auto" runs the Triton kernel on CUDA tensors, and torch.compile(fullgraph=True) keeps the addnorm
    operator in the forward and backward graphs, with the eager values and gradients."""
    from compile_spy import addnorm_ops_backend

    fn, ins = _op_calls()[name]
    out = fn(*ins)
    assert addnorm.last_backend() == ("triton" if DEV == "cuda" else "cpu")
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]
    grads = torch.autograd.grad(sum(o.float().square().sum() for o in outs), ins)
    torch._dynamo.reset()
    seen: set = set()
    cfn = torch.compile(fn, fullgraph=True, backend=addnorm_ops_backend(seen))
    cout = cfn(*ins)
    couts = [o for o in (cout if isinstance(cout, tuple) else (cout,)) if o is not None]
    cgrads = torch.autograd.grad(sum(o.float().square().sum() for o in couts), ins)
    assert any(s.startswith("addnorm.") for s in seen), seen
    for e, c in zip([*outs, *grads], [*couts, *cgrads], strict=True):
        torch.testing.assert_close(c, e, atol=1e-5, rtol=1e-5)
    inductor = torch.compile(fn, fullgraph=True)(*ins)  # the default backend (Inductor) too
    iouts = [o for o in (inductor if isinstance(inductor, tuple) else (inductor,)) if o is not None]
    for e, c in zip(outs, iouts, strict=True):
        torch.testing.assert_close(c, e, atol=1e-5, rtol=1e-5)
