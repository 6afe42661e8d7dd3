"""mHC's pre step as one fused operator (``addnorm.functional.mhc.mhc_pre``): every backend against a float64
oracle transcribed from the papers' equations (``addnorm.reference.streams``: mHC eqs. 7-9, mHC-lite's
permutation mix), PyTorch's operator checks, gradcheck, transforms and bad input."""

import itertools
import math

import pytest
import torch
import torch.autograd.forward_ad as fwAD

from addnorm.reference import streams as ref
from addnorm.functional import mhc as M
from addnorm.functional import mhc_pre, mhc_write_pre
from tests.backends import BACKENDS, KERNELS
from tests.compile_spy import addnorm_ops_backend
from tests.isa_paths import run_under_every_isa

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
CASES = [((2, 3), 4, 33), ((5,), 1, 8), ((2,), 2, 7), ((0, 3), 4, 16), ((), 3, 1), ((4,), 4, 769), ((3,), 8, 5)]
EPS, ITERS = 1e-6, 20


def _perms(n):
    return torch.stack([torch.eye(n)[list(p)] for p in itertools.permutations(range(n))])


def _make(lead, n, C, lite, dtype, seed=0, layout="contiguous"):
    """(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms): coefficients at a scale where every map is
    far from saturation, so that the gradients are informative."""
    g = torch.Generator().manual_seed(seed)
    r = math.factorial(n) if lite else n * n
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x = rnd(*lead, n, C)
    if layout == "permuted" and C > 1:
        x = rnd(*lead, C, n).transpose(-1, -2)
    phi = rnd(n * C, 2 * n + r) / math.sqrt(n * C)
    a = [torch.tensor(v, dtype=torch.float64) for v in (0.8, 0.6, 1.1)]
    b = [0.5 * rnd(n), 0.5 * rnd(n), 0.5 * (rnd(r) if lite else rnd(n, n))]
    ts = [x.to(dtype), phi.float(), *(t.float() for t in a + b)]
    return [t.requires_grad_() for t in ts] + [_perms(n) if lite else None]


def _oracle(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms):
    """The papers' equations in float64, written independently of the kernels' formulas."""
    x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res = (t.double() for t in (x, phi, a_pre, a_post, a_res, b_pre,
                                                                               b_post, b_res))
    n = x.shape[-2]
    xp = ref.mhc_eq7_rmsnorm(x, EPS)
    h_pre = ref.mhc_eq8_pre(xp, phi[:, :n], a_pre, b_pre)
    h_post = ref.mhc_eq8_post(xp, phi[:, n:2 * n], a_post, b_post)
    if perms is None:
        h_res = ref.mhc_eq9_sinkhorn(ref.mhc_eq8_res_logits(xp, phi[:, 2 * n:], a_res, b_res, n), ITERS)
    else:
        h_res = ref.mhc_lite_res(xp, phi[:, 2 * n:], a_res, b_res, n)
    return ref.mhc_layer_input(h_pre, x), h_pre, h_post, h_res


NAMES = ("x", "phi", "a_pre", "a_post", "a_res", "b_pre", "b_post", "b_res")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "mhc_lite"])
@pytest.mark.parametrize("lead, n, C", CASES)
def test_forward_and_backward_match_the_float64_oracle(lead, n, C, lite, dtype, backend):
    if lite and n > 4:
        pytest.skip("mHC-lite at n > 4 has more than 5! permutations (the paper's n is 4)")
    *ins, perms = _make(lead, n, C, lite, dtype, layout="permuted" if n == 4 else "contiguous")
    out = mhc_pre(*ins, perms=perms, eps=EPS, iters=ITERS, backend=backend)
    exp = _oracle(*ins, perms)
    assert out[0].dtype == dtype and out[0].shape == ins[0].shape[:-2] + (C,)
    assert all(o.dtype == torch.float32 for o in out[1:])
    tol = TOL[dtype]
    for name, a, e in zip(("h", "H_pre", "H_post", "H_res"), out, exp, strict=True):
        torch.testing.assert_close(a.double(), e, atol=tol * 4 if name == "h" else 2e-5, rtol=tol, msg=name)
    g = torch.Generator().manual_seed(1)
    cots = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in out]
    got = torch.autograd.grad(sum((o.double() * c).sum() for o, c in zip(out, cots, strict=True)), ins)
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    e_out = _oracle(*ins64, perms)
    exp_g = torch.autograd.grad(sum((o * c).sum() for o, c in zip(e_out, cots, strict=True)), ins64,
                                allow_unused=True)
    for name, a, e in zip(NAMES, got, exp_g, strict=True):
        e = torch.zeros_like(ins64[NAMES.index(name)]) if e is None else e
        scale = 1 + (e.abs().max().item() if e.numel() else 0.0)
        torch.testing.assert_close(a.double(), e, atol=tol * 8 * scale, rtol=tol * 4, msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "mhc_lite"])
@pytest.mark.parametrize("lead, n, C", CASES)
def test_a_write_then_the_pre_step_match_the_float64_oracle(lead, n, C, lite, dtype, backend):
    """mhc_write_pre: mHC's write (eq. 3, X' = H_res X + H_post^T y) and the pre step on X' in one call (one pass
    over the stream on the C kernels), against eq. 3 and the oracle above, both ways."""
    if lite and n > 4:
        pytest.skip("mHC-lite at n > 4 has more than 5! permutations (the paper's n is 4)")
    *ins, perms = _make(lead, n, C, lite, dtype, layout="permuted" if n == 4 else "contiguous")
    g = torch.Generator().manual_seed(3)
    y = torch.randn(*lead, C, generator=g).to(dtype).requires_grad_()
    h_post = (2 * torch.rand(*lead, n, generator=g)).requires_grad_()
    h_res = torch.softmax(torch.randn(*lead, n, n, generator=g), -1).requires_grad_()
    out = mhc_write_pre(ins[0], y, h_post, h_res, *ins[1:], perms=perms, eps=EPS, iters=ITERS, backend=backend)
    write = [ins[0], y, h_post, h_res]
    w64 = [t.detach().double().requires_grad_() for t in write]
    ins64 = [t.detach().double().requires_grad_() for t in ins[1:]]
    x2 = ref.mhc_eq3(w64[0], w64[1], w64[2], w64[3])
    exp = (x2, *_oracle(x2, *ins64, perms))
    assert out[0].dtype == out[1].dtype == dtype and out[0].shape == ins[0].shape
    tol = TOL[dtype]
    for name, a, e in zip(("x2", "h", "H_pre", "H_post", "H_res"), out, exp, strict=True):
        atol = tol * 8 if name in ("x2", "h") else (2e-5 if dtype == torch.float32 else tol)
        torch.testing.assert_close(a.double(), e.detach(), atol=atol, rtol=tol, msg=name)
    cots = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in out]
    got = torch.autograd.grad(sum((o.double() * c).sum() for o, c in zip(out, cots, strict=True)), write + ins[1:])
    want = torch.autograd.grad(sum((o * c).sum() for o, c in zip(exp, cots, strict=True)), w64 + ins64)
    for name, a, e in zip(("x", "y", "h_post", "h_res", *NAMES[1:]), got, want, strict=True):
        scale = 1 + (e.abs().max().item() if e.numel() else 0.0)
        torch.testing.assert_close(a.double(), e, atol=tol * 16 * scale, rtol=tol * 4, msg=name)


@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "mhc_lite"])
@pytest.mark.parametrize("backend", ["op", "torch"])
def test_gradcheck_and_gradgradcheck_float64(backend, lite):
    *ins, perms = _make((2,), 3, 2, lite, torch.float64)
    ins = [t.detach().double().requires_grad_() for t in ins]

    def f(*a):
        if backend == "op":
            return torch.ops.addnorm.mhc_pre(*a, None if perms is None else perms.double(), EPS, 5)[:4]
        return mhc_pre(*a, perms=perms, eps=EPS, iters=5, backend="torch")

    assert torch.autograd.gradcheck(f, ins)
    assert torch.autograd.gradgradcheck(f, ins)


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "mhc_lite"])
def test_opcheck(lite):
    *ins, perms = _make((2, 3), 4, 24, lite, torch.float32)
    args = (*ins, perms, EPS, ITERS)
    torch.library.opcheck(torch.ops.addnorm.mhc_pre.default, args)
    det = [t.detach() for t in ins]
    _, _, _, _, p, rstd, state = torch.ops.addnorm.mhc_pre(*det, perms, EPS, ITERS)
    g = torch.Generator().manual_seed(2)
    grads = [torch.randn(2, 3, 24, generator=g), torch.randn(2, 3, 4, generator=g), None,
             torch.randn(2, 3, 4, 4, generator=g)]
    torch.library.opcheck(torch.ops.addnorm.mhc_pre_backward.default,
                          (*grads, *det, perms, p, rstd, state, EPS, ITERS))


@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "mhc_lite"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_ad_matches_the_oracle(backend, lite):
    *prim, perms = _make((3,), 4, 16, lite, torch.float32)
    prim = [t.detach() for t in prim]
    g = torch.Generator().manual_seed(3)
    tans = [torch.randn(p.shape, generator=g) for p in prim]
    with fwAD.dual_level():
        d = [fwAD.make_dual(p, t) for p, t in zip(prim, tans, strict=True)]
        out = mhc_pre(*d, perms=perms, eps=EPS, iters=ITERS, backend=backend)
        got = [fwAD.unpack_dual(t).tangent for t in out]
    _, jv = torch.func.jvp(lambda *a: tuple(t.float() for t in _oracle(*a, perms)), tuple(prim), tuple(tans))
    for a, e in zip(got, jv, strict=True):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_compile_fullgraph_keeps_the_operator_both_ways():
    seen = set()
    backend = addnorm_ops_backend(seen)

    *ins, perms = _make((2, 3), 4, 32, False, torch.float32)

    def f(*a):
        h, hp, hpo, hr = mhc_pre(*a, iters=ITERS)
        return (h * h).sum() + hpo.sum() + (hr * hr).sum()

    torch._dynamo.reset()
    eager = torch.autograd.grad(f(*ins), ins)
    comp = torch.autograd.grad(torch.compile(f, backend=backend, fullgraph=True)(*ins), ins)
    assert {"addnorm.mhc_pre.default", "addnorm.mhc_pre_backward.default"} <= seen
    for a, e in zip(comp, eager, strict=True):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


def test_vmap_uses_the_composite():
    *ins, perms = _make((3, 2), 4, 8, False, torch.float32)
    ins = [t.detach() for t in ins]
    got = torch.vmap(lambda x: mhc_pre(x, *ins[1:], iters=ITERS)[0])(ins[0])
    torch.testing.assert_close(got.double(), _oracle(*ins, None)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_inf_stay_in_their_token(backend):
    *ins, perms = _make((4,), 2, 8, False, torch.float32)
    ins = [t.detach() for t in ins]
    ins[0][1, 0, 3] = float("nan")
    ins[0][2, 1, 5] = float("inf")
    h, hp, hpo, hr = mhc_pre(*ins, iters=ITERS, backend=backend)
    for t in (h, hp, hpo, hr):
        assert torch.isfinite(t[[0, 3]]).all()
        assert not torch.isfinite(t[1]).all() and not torch.isfinite(t[2]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_shapes_the_kernels_do_not_take_give_the_formulas_answer(backend):
    """More Sinkhorn rounds than the kernels keep (64), and 'perms' that are not permutation matrices."""
    *ins, _ = _make((3,), 2, 8, False, torch.float32)
    ins = [t.detach() for t in ins]
    torch.testing.assert_close(mhc_pre(*ins, iters=70, backend=backend)[3],
                               mhc_pre(*ins, iters=70, backend="torch")[3], atol=1e-6, rtol=1e-5)
    *ins, perms = _make((3,), 2, 8, True, torch.float32)
    soft = torch.full_like(perms, 0.5)  # doubly stochastic, not permutations: the formulas must take it
    ins = [t.detach() for t in ins]
    torch.testing.assert_close(mhc_pre(*ins, perms=soft, backend=backend)[3],
                               mhc_pre(*ins, perms=soft, backend="torch")[3], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_tokens_gives_zero_parameter_gradients(backend):
    *ins, perms = _make((0, 2), 4, 8, False, torch.float32)
    h, hp, hpo, hr = mhc_pre(*ins, backend=backend)
    assert h.shape == (0, 2, 8) and hr.shape == (0, 2, 4, 4)
    grads = torch.autograd.grad(h.sum() + hp.sum() + hpo.sum() + hr.sum(), ins)
    assert all(g.shape == t.shape and not g.any() for g, t in zip(grads, ins, strict=True))


def _args():
    *ins, perms = _make((2,), 4, 8, False, torch.float32)
    return [t.detach() for t in ins]


@pytest.mark.parametrize("edit, match", [
    (lambda a, kw: a.__setitem__(0, a[0][0, 0]), "x must be a widened stream"),
    (lambda a, kw: a.__setitem__(1, a[1][:, :5]), "phi must have shape"),
    (lambda a, kw: a.__setitem__(2, torch.ones(2)), "a_pre must have 1 element"),
    (lambda a, kw: a.__setitem__(5, torch.ones(3)), "b_pre must have 4 elements"),
    (lambda a, kw: a.__setitem__(7, torch.ones(5)), "b_res must have 16 elements"),
    (lambda a, kw: a.__setitem__(0, a[0].long()), "x must be a floating-point tensor"),
    (lambda a, kw: a.__setitem__(1, "phi"), "phi must be a torch.Tensor"),
    (lambda a, kw: kw.update(perms=torch.eye(3)[None]), "perms must be"),
    (lambda a, kw: kw.update(iters=-1), "iters must be"),
    (lambda a, kw: kw.update(iters=2.5), "iters must be"),
    (lambda a, kw: kw.update(eps=float("nan")), "eps must be"),
    (lambda a, kw: kw.update(backend="gpu"), "backend"),
])
def test_bad_input_is_refused_naming_the_argument(edit, match):
    a, kw = _args(), {}
    edit(a, kw)
    with pytest.raises((TypeError, ValueError, RuntimeError), match=match):
        mhc_pre(*a, **kw)


ISA_SCRIPT = r"""
import sys, torch, addnorm
from addnorm.functional import mhc as M
from addnorm.functional import mhc_pre, mhc_write_pre
ins, perms, cots = torch.load(sys.argv[1])
res = {}
for dt in ("float32", "bfloat16"):
    xs = [ins[0].to(getattr(torch, dt)).requires_grad_()] + [t.clone().requires_grad_() for t in ins[1:]]
    out = mhc_pre(*xs, perms=perms, eps=1e-6, iters=20, backend="cpu")
    grads = torch.autograd.grad(out, xs, [c.to(o.dtype) for o, c in zip(out, cots)])
    res[dt] = [t.detach() for t in (*out, *grads)]
torch.save({"isa": addnorm.cpu_kernel_availability().isa, "res": res}, sys.argv[2])
"""


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "mhc_lite"])
def test_every_instruction_set_path_meets_the_float64_tolerance(tmp_path, lite):
    """ADDNORM_CPU_ISA=baseline|avx2 caps the kernels' instruction set (read once per process): each path, in its
    own process, against the float64 oracle at the tolerances of the table above (odd C: every loop's tail)."""
    *ins, perms = _make((37,), 4, 259, lite, torch.float32, seed=5)
    ins = [t.detach() for t in ins]
    g = torch.Generator().manual_seed(6)
    shapes = [(37, 259), (37, 4), (37, 4), (37, 4, 4)]
    cots = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    torch.save((ins, perms, cots), tmp_path / "in.pt")
    for isa, got in run_under_every_isa(ISA_SCRIPT, tmp_path, tmp_path / "in.pt").items():
        for dt, res in got["res"].items():
            dtype = getattr(torch, dt)
            ins64 = [ins[0].to(dtype).double().requires_grad_()] + [t.double().requires_grad_() for t in ins[1:]]
            e_out = _oracle(*ins64, perms)
            e_grads = torch.autograd.grad(e_out, ins64, [c.to(o.dtype) if i else c.to(dtype).double()
                                                         for i, (o, c) in enumerate(zip(e_out, cots))])
            tol = TOL[dtype]
            for k, (a, e) in enumerate(zip(res, (*e_out, *e_grads), strict=True)):
                scale = 1 + e.abs().max().item()
                atol = (tol * 4 if k == 0 else 2e-5) if k < 4 else tol * 8 * scale
                torch.testing.assert_close(a.double(), e.detach(), atol=atol, rtol=tol * 4,
                                           msg=f"{isa} {dt} output {k}")


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_the_cpu_forward_keeps_the_sinkhorn_rounds_and_the_backward_reads_them_instead_of_running_them():
    """mHC on the CPU kernels: the forward's ``state`` holds Sinkhorn-Knopp's rounds (M0 = exp(L - column max),
    then each round's A, r, c; the last A / r is H_res), checked against the oracle's logits; the autograd node
    saves it; and the backward reads it. b_res enters the backward only through the rounds, so a backward handed
    another b_res than the forward's gives the forward's gradients when it reads the kept rounds, and other ones
    when it has to run them again from p (an empty state)."""
    n, iters = 4, ITERS
    *ins, _ = _make((2, 3), n, 24, False, torch.float32)
    det = [t.detach() for t in ins]
    *_, p, rstd, state = torch.ops.addnorm.mhc_pre(*det, None, EPS, iters)
    S = (1 + iters) * n * n + 2 * iters * n
    assert state.shape == (2, 3, S) and state.dtype == torch.float32
    x64, phi64, *c64 = (t.double() for t in det)
    L = ref.mhc_eq8_res_logits(ref.mhc_eq7_rmsnorm(x64, EPS), phi64[:, 2 * n:], c64[2], c64[5], n)
    m0 = torch.exp(L - L.amax(-2, keepdim=True))
    torch.testing.assert_close(state[..., :n * n].double(), m0.flatten(-2), atol=1e-6, rtol=1e-5)
    last = n * n + (iters - 1) * (n * n + 2 * n)
    a_last, r_last = state[..., last:last + n * n].double(), state[..., last + n * n:last + n * n + n].double()
    torch.testing.assert_close((a_last.unflatten(-1, (n, n)) / r_last[..., None]),
                               ref.mhc_eq9_sinkhorn(L, iters), atol=1e-6, rtol=1e-5)

    saved, M.NODES = M.NODES, None  # the Python node, whose saved tensors Python can see (the C++ node's test:
    try:  # test_stream_nodes.py, its gradients the same bits)
        h = mhc_pre(*ins, iters=iters, backend="cpu")[0]
    finally:
        M.NODES = saved
    assert any(t.shape == (2, 3, S) for t in h.grad_fn.saved_tensors)

    g = torch.Generator().manual_seed(7)
    grads = [torch.randn(2, 3, 24, generator=g), torch.randn(2, 3, n, generator=g),
             torch.randn(2, 3, n, generator=g), torch.randn(2, 3, n, n, generator=g)]
    bwd = torch.ops.addnorm.mhc_pre_backward
    want = bwd(*grads, *det, None, p, rstd, state, EPS, iters)
    other_b_res = det[:7] + [det[7] + torch.randn(n, n, generator=g)]  # not a constant: Sinkhorn divides that out
    kept = bwd(*grads, *other_b_res, None, p, rstd, state, EPS, iters)
    rerun = bwd(*grads, *other_b_res, None, p, rstd, state[..., :0], EPS, iters)
    for name, w, k in zip(NAMES, want, kept, strict=True):
        assert torch.equal(w, k), name
    assert not torch.allclose(rerun[0], want[0], atol=1e-6, rtol=1e-4)
    # the empty state with the forward's b_res: the rounds run again, the same gradients
    for name, w, r in zip(NAMES, want, bwd(*grads, *det, None, p, rstd, state[..., :0], EPS, iters), strict=True):
        torch.testing.assert_close(r, w, atol=1e-6, rtol=1e-5, msg=name)


def test_state_is_kept_for_mhc_on_the_cpu_only():
    """mHC-lite keeps nothing (its softmax is one exp per permutation), nor do other devices (their kernels recompute
    the rounds on chip): the fake implementation agrees with every real one."""
    *ins, perms = _make((2,), 3, 8, True, torch.float32)
    det = [t.detach() for t in ins]
    assert torch.ops.addnorm.mhc_pre(*det, perms, EPS, 5)[6].shape == (2, 0)
    *ins, _ = _make((2,), 3, 8, False, torch.float32)
    det = [t.detach() for t in ins]
    assert torch.ops.addnorm.mhc_pre(*det, None, EPS, 5)[6].shape == (2, 6 * 9 + 2 * 5 * 3)
    assert torch.ops.addnorm.mhc_pre(*[t.to("meta") for t in det], None, EPS, 5)[6].shape == (2, 0)
    # the formulas (float64 is theirs) keep the same rounds as the kernels on the CPU
    out64 = torch.ops.addnorm.mhc_pre(*[t.double() for t in det], None, EPS, 5)
    torch.testing.assert_close(out64[6].float(), torch.ops.addnorm.mhc_pre(*det, None, EPS, 5)[6], atol=1e-6,
                               rtol=1e-5)


PARTIALS_SCRIPT = r"""
import resource, sys, torch
torch.set_num_threads(2)
from addnorm.ops.mhc.schema import CPU
n, C, N = 4, 16384, 64
g = torch.Generator().manual_seed(0)
x = torch.randn(N, n, C, generator=g)
phi = torch.randn(n * C, 2 * n + n * n, generator=g) / (n * C) ** 0.5
coeffs = [torch.tensor(0.5), torch.tensor(0.5), torch.tensor(0.5), torch.zeros(n), torch.zeros(n), torch.zeros(n, n)]
*_, p, rstd, state = CPU[0](x, phi, *coeffs, None, 1e-6, 3)
dh = torch.randn(N, C, generator=g)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
CPU[1](dh, None, None, None, x, phi, *coeffs, None, p, rstd, state, 1e-6, 3)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


@pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled kernels are not built")
def test_the_backward_sums_phis_gradient_in_one_partial_per_thread():
    """phi's gradient is summed per chunk of tokens into a partial as large as phi, zeroed first and reduced serially
    after. The backward cuts one chunk per thread: the load-balancing default (eight chunks per thread) made 16
    partials on two threads -- at nC = 65536 and m = 24, 16 x 6.3 MB that the peak memory shows (dx, phi^T and dphi
    take 29 MB besides)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", PARTIALS_SCRIPT], capture_output=True, text=True, check=True,
                         timeout=300)
    grown_mb = float(out.stdout.split()[-1])
    assert grown_mb < 60, f"the backward's peak memory grew by {grown_mb:.0f} MB"


@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "lite"])
def test_coefficient_grads_are_the_tokens_sums_rounded_once(lite):
    """The coefficients' gradients (da = sum over the tokens and a group's columns of dlogits * p, db = the sums of
    dlogits) are each one rounding of the exact sum of the kernel's own per-token terms: the C backward sums them in
    float64 as it walks the tokens. Summed in float32 over 4096 tokens (what the operator did before) they were
    several ulps off."""
    from addnorm.kernels.cpu import mhc as cpu
    from addnorm.ops.mhc.schema import kernel_index, scal_bias

    if not cpu.availability().available:
        pytest.skip("the CPU kernels are not built")
    x, phi, *coeffs, perms = [t.detach() if isinstance(t, torch.Tensor) else t
                              for t in _make((4096,), 4, 24, lite, torch.float32, seed=5)]
    n, iters = 4, 0 if lite else ITERS
    outs = torch.ops.addnorm.mhc_pre(x, phi, *coeffs, perms, EPS, iters)
    p, rstd, state = outs[4:]
    g = torch.Generator().manual_seed(6)
    grads = [torch.randn(t.shape, generator=g) for t in outs[:4]]
    got = torch.ops.addnorm.mhc_pre_backward(*grads, x, phi, *coeffs, perms, p, rstd, state, EPS, iters)[2:]
    idx = kernel_index(cpu, x, phi, coeffs, perms, iters)
    dlogits = cpu.mhc_pre_backward(*grads, x, phi, *scal_bias(*coeffs), idx, p, rstd, state, iters)[1].double()
    terms = dlogits * p.double()  # each product exact in float64
    want = [terms[:, :n].sum(), terms[:, n:2 * n].sum(), terms[:, 2 * n:].sum(),
            dlogits[:, :n].sum(0), dlogits[:, n:2 * n].sum(0), dlogits[:, 2 * n:].sum(0)]
    for name, a, w in zip(NAMES[2:], got, want, strict=True):
        w = w.reshape(a.shape)
        ulp = torch.finfo(torch.float32).eps * w.abs().float().double()  # one ulp of a float32 near w (up to 2x)
        assert (a.double() - w).abs().le(ulp).all(), (name, float((a.double() - w).abs().div(ulp).max()))
