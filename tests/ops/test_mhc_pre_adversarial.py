"""Adversarial probes of mHC's fused pre step (``addnorm.functional.mhc.mhc_pre`` and the operator
``torch.ops.addnorm.mhc_pre``): odd layouts, mixed and 16-bit dtypes, partial gradients, edge shapes, NaN / Inf /
under- and overflow semantics, transforms, compile, threads, instruction sets and the GPT placements that use it.

Every case is compared with the spec ``addnorm.ops.mhc.formulas.pre`` evaluated in float64 (or, where float32
rounding itself decides the answer -- Sinkhorn underflow, a sum of squares that overflows -- with the float32
formulas, ``backend="torch"``). Probes that found a defect, since fixed, say "Was a defect" and what it was.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import addnorm
import addnorm.functional as SF  # mhc_pre as the model calls it
from addnorm.ops.mhc import formulas as mf
from addnorm.functional import mhc_pre
from tests.backends import KERNELS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EPS, ITERS = 1e-6, 20
NEEDS_CPU = pytest.mark.skipif("cpu" not in KERNELS, reason="the compiled CPU kernels are not built")
NEEDS_TRITON = pytest.mark.skipif("triton" not in KERNELS, reason="Triton (interpreter) not available")
# backends cheap enough to sweep (Triton's interpreter costs seconds a call: it gets the targeted probes only)
FAST = [b for b in ("cpu",) if b in KERNELS] + ["torch"]
TOL = {torch.float64: 2e-5, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def _perms(n):
    return torch.stack([torch.eye(n)[list(p)] for p in itertools.permutations(range(n))])


def _make(lead, n, C, lite=False, seed=0, dt=torch.float32, pdt=torch.float32, cdt=torch.float32, scale=1.0):
    """[x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res], perms (None for mHC)."""
    g = torch.Generator().manual_seed(seed)
    r = math.factorial(n) if lite else n * n
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x = rnd(*lead, n, C).to(dt)
    phi = (rnd(n * C, 2 * n + r) / math.sqrt(n * C) * scale).to(pdt)
    a = [torch.tensor(v, dtype=cdt) for v in (0.8, 0.6, 1.1)]
    b = [(0.5 * rnd(n)).to(cdt), (0.5 * rnd(n)).to(cdt), (0.5 * (rnd(r) if lite else rnd(n, n))).to(cdt)]
    return [x, phi, *a, *b], (_perms(n) if lite else None)


def _spec64(ins, perms, eps=EPS, iters=ITERS, grad=False):
    ins = [t.detach().double().requires_grad_(grad) for t in ins]
    return ins, mf.pre(*ins, None if perms is None else perms.double(), eps, iters)[:4]


def _max_rel(a, e):
    e = torch.zeros_like(a, dtype=torch.float64) if e is None else e.detach()
    if not e.numel():
        return 0.0
    return ((a.double() - e).abs().max() / (1 + e.abs().max())).item()


def _check(backend, ins, perms, *, eps=EPS, iters=ITERS, req=range(8), outs=range(4), tol=None):
    """Forward and the gradients of the inputs in ``req`` (of sum_k <out_k, cot_k> over ``outs``) against
    the float64 spec; output and gradient dtypes."""
    tol = tol or max(TOL[t.dtype] for t in ins)
    ins = [t.detach().clone().requires_grad_(i in req) for i, t in enumerate(ins)]
    out = mhc_pre(*ins, perms=perms, eps=eps, iters=iters, backend=backend)
    ins64, exp = _spec64(ins, perms, eps, iters, grad=True)
    ct = mf.compute_dtype(*ins)
    assert [o.dtype for o in out] == [ins[0].dtype, ct, ct, ct]
    assert [o.shape for o in out] == [e.shape for e in exp]
    for k, (a, e) in enumerate(zip(out, exp, strict=True)):
        assert _max_rel(a, e) <= (tol * 2 if k == 0 else 2e-5), f"output {k}"
    if not req:
        return
    g = torch.Generator().manual_seed(7)
    cots = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in out]
    got = torch.autograd.grad(sum((out[k].double() * cots[k]).sum() for k in outs), [ins[i] for i in req],
                              allow_unused=True)
    want = torch.autograd.grad(sum((exp[k] * cots[k]).sum() for k in outs), [ins64[i] for i in req],
                               allow_unused=True)
    for i, a, e in zip(req, got, want, strict=True):
        if a is None:  # an unused input: None or zeros are both fine, a wrong value is not
            assert e is None or not e.any(), f"grad {i} missing"
            continue
        assert a.dtype == ins[i].dtype and a.shape == ins[i].shape, f"grad {i} dtype/shape"
        assert _max_rel(a, e) <= tol, f"grad {i}: {_max_rel(a, e)}"


# ---------------------------------------------------------------------------------------------- layouts

LAYOUTS = {
    "phi_transposed_storage": lambda a: a.__setitem__(1, a[1].t().contiguous().t()),
    "x_expanded_stride0": lambda a: a.__setitem__(0, a[0][:1].expand(a[0].shape)),
    "x_storage_offset": lambda a: a.__setitem__(0, torch.cat([torch.randn(2, *a[0].shape[1:]), a[0]])[2:]),
    "x_transposed": lambda a: a.__setitem__(0, a[0].transpose(-1, -2).contiguous().transpose(-1, -2)),
    "x_lead_permuted": lambda a: a.__setitem__(0, a[0].transpose(0, 1).contiguous().transpose(0, 1)),
    "b_res_transposed": lambda a: a.__setitem__(7, a[7].t() if a[7].dim() == 2 else a[7].flip(0)),
    "a_one_element_1d": lambda a: [a.__setitem__(i, a[i].reshape(1)) for i in (2, 3, 4)],
    "b_pre_expanded": lambda a: a.__setitem__(5, torch.tensor(0.3).expand(a[5].shape)),
    "phi_column_slice": lambda a: a.__setitem__(1, torch.cat([a[1], a[1][:, :3]], 1)[:, :a[1].shape[1]]),
}


@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "lite"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend", FAST)
def test_odd_layouts_forward_and_backward(backend, layout, lite):
    ins, perms = _make((3, 2), 3, 9, lite=lite)
    LAYOUTS[layout](ins)
    _check(backend, ins, perms)


@NEEDS_TRITON
def test_odd_layouts_all_at_once_triton():
    ins, perms = _make((2, 3), 3, 9)
    for f in LAYOUTS.values():
        f(ins)
    _check("triton", ins, perms)


# ---------------------------------------------------------------------------------------------- dtypes

bf, f16, f32, f64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
DTYPE_MIXES = [(f32, bf, bf), (bf, bf, bf), (bf, bf, f32), (f32, f32, bf), (f32, f64, f32), (f32, f32, f64),
               (bf, f64, bf), (f16, bf, f16), (f16, f16, f16), (f64, f32, f32)]


@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "lite"])
@pytest.mark.parametrize("dts", DTYPE_MIXES, ids=lambda d: "x{}_phi{}_c{}".format(*(str(t)[6:] for t in d)))
@pytest.mark.parametrize("backend", FAST)
def test_mixed_and_16_bit_dtypes(backend, dts, lite):
    dt, pdt, cdt = dts
    if backend == "cpu" and dt == f64:
        backend = "auto"  # backend='cpu' refuses a float64 x (documented); 'auto' takes it (the formulas)
    ins, perms = _make((2, 3), 3, 8, lite=lite, dt=dt, pdt=pdt, cdt=cdt)
    _check(backend, ins, perms)


# ---------------------------------------------------------------------------------------------- partial grads

PARTIAL = [([1], [3]), ([0], [0]), ([4, 7], [3]), ([2, 5], [0, 1]), ([3, 6], [2]), (list(range(8)), [2]),
           ([0, 1], [1, 2]), (list(range(8)), [3])]


@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "lite"])
@pytest.mark.parametrize("req, outs", PARTIAL, ids=lambda v: "-".join(map(str, v)))
@pytest.mark.parametrize("backend", FAST)
def test_requires_grad_on_some_inputs_and_grads_of_some_outputs(backend, req, outs, lite):
    ins, perms = _make((5,), 3, 8, lite=lite)
    _check(backend, ins, perms, req=req, outs=outs)


@NEEDS_TRITON
@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "lite"])
def test_partial_grads_triton(lite):
    ins, perms = _make((5,), 3, 8, lite=lite)
    _check("triton", ins, perms, req=[0, 1, 4, 7], outs=[3])


@pytest.mark.parametrize("backend", FAST)
def test_outputs_used_twice_and_retain_graph(backend):
    ins, perms = _make((4,), 4, 8, lite=True)
    ins = [t.requires_grad_() for t in ins]
    h, hp, hpo, hr = mhc_pre(*ins, perms=perms, backend=backend)
    loss = (h * h).sum() + (h * hp.sum(-1, keepdim=True)).sum() + (hr @ hr).sum() + (hr * hpo[..., None]).sum()
    g1 = torch.autograd.grad(loss, ins, retain_graph=True)
    g2 = torch.autograd.grad(loss, ins)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))
    ins64, (h, hp, hpo, hr) = _spec64(ins, perms, grad=True)
    loss = (h * h).sum() + (h * hp.sum(-1, keepdim=True)).sum() + (hr @ hr).sum() + (hr * hpo[..., None]).sum()
    for a, e in zip(g1, torch.autograd.grad(loss, ins64), strict=True):
        assert _max_rel(a, e) < 2e-5


# ---------------------------------------------------------------------------------------------- shapes

SHAPES = [((3,), 1, 8, False, 20), ((3,), 1, 8, True, 0), ((17,), 8, 5, False, 20), ((33,), 2, 1, False, 20),
          ((37,), 4, 70, True, 0), ((5,), 3, 8, False, 0), ((5,), 3, 8, False, 1), ((5,), 3, 8, False, 64),
          ((5,), 3, 8, False, 65), ((2,), 5, 4, True, 0), ((0, 2), 4, 8, True, 0), ((), 4, 16, False, 20)]


@pytest.mark.parametrize("lead, n, C, lite, iters", SHAPES, ids=str)
@pytest.mark.parametrize("backend", FAST)
def test_edge_shapes_and_iteration_counts(backend, lead, n, C, lite, iters):
    ins, perms = _make(lead, n, C, lite=lite)
    _check(backend, ins, perms, iters=iters)


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("r", [1, 2])
def test_lite_with_a_subset_of_the_permutations(backend, r):
    ins, perms = _make((5,), 3, 8, lite=True)
    perms = perms[[0, 3][:r]]
    ins[1], ins[7] = ins[1][:, :6 + r].contiguous(), ins[7][:r].contiguous()
    _check(backend, ins, perms)


@pytest.mark.parametrize("backend", FAST)
def test_empty_perm_stack_is_refused(backend):
    # Was a defect: perms of shape (0, n, n) passed _check_mhc and the C kernel read an empty index table as "no
    # perms" (Sinkhorn on logits past m; its backward wrote past dlogits). The public function refuses r = 0.
    ins, perms = _make((5,), 3, 8, lite=True)
    ins[1], ins[7] = ins[1][:, :6].contiguous(), ins[7][:0]
    with pytest.raises(ValueError, match="perms must be"):
        mhc_pre(*ins, perms=perms[:0], backend=backend)


EMPTY_PERMS_BACKWARD = r"""
import json, sys, torch
from addnorm.functional import mhc_pre
from addnorm.ops.mhc import formulas as mf
g = torch.Generator().manual_seed(0)
n, C = 3, 8
ins = [torch.randn(64, n, C, generator=g), torch.randn(n * C, 2 * n, generator=g) / 5, *(torch.tensor(v) for v in
       (0.8, 0.6, 1.1)), torch.randn(n, generator=g), torch.randn(n, generator=g), torch.zeros(0)]
perms = torch.zeros(0, n, n)
ins = [t.requires_grad_() for t in ins]
for _ in range(20):  # the raw operator: no public check in front of it (the formulas take an empty stack)
    out = torch.ops.addnorm.mhc_pre(*ins, perms, 1e-6, 20)[:4]
    grads = torch.autograd.grad(sum((o.double() ** 2).sum() for o in out), ins[:2])
i64 = [t.detach().double().requires_grad_() for t in ins]
e = mf.pre(*i64, perms.double(), 1e-6, 20)[:4]
eg = torch.autograd.grad(sum((o ** 2).sum() for o in e), i64[:2])
print(json.dumps([((a.double() - b).abs().max() / (1 + b.abs().max())).item() for a, b in zip(grads, eg)]))
"""


@NEEDS_CPU
def test_empty_perm_stack_backward_does_not_corrupt_memory():
    # Was a DEFECT: same input as above through backward: the CPU kernel's Sinkhorn backward writes n*n = 9 dlogits per
    # token into a dlogits buffer of m = 2n = 6 columns (mhc_rows.h, mhc_sinkhorn_backward(..., d + 2 * n)): a
    # heap overflow; the process dies with "corrupted double-linked list" / "free(): invalid next size".
    # Fix: refuse r = 0 in _check_mhc (or let perm_index return False for an empty stack, so the formulas take it),
    # and have addnorm_mhc return -3 when perm == NULL and r != n * n.
    # env: os.environ as Python sees it (a library may have changed the C-level environment, e.g. PYTHONHOME)
    res = subprocess.run([sys.executable, "-c", EMPTY_PERMS_BACKWARD, "cpu"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env=dict(os.environ))
    assert res.returncode == 0, f"crashed (rc {res.returncode}): {res.stderr[-300:]}"
    assert max(json.loads(res.stdout.strip().splitlines()[-1])) < 1e-5


# ---------------------------------------------------------------------------------------------- the raw operator

RAW_OP_SHAPES = r"""
import json, math, torch
import addnorm.functional.stream  # registers the operator
g = torch.Generator().manual_seed(0)
n, C = 3, 8
def ins():
    return [torch.randn(4, n, C, generator=g), torch.randn(n * C, 2 * n + n * n, generator=g) / 5,
            *(torch.tensor(v) for v in (0.8, 0.6, 1.1)), torch.randn(n, generator=g), torch.randn(n, generator=g),
            torch.randn(n, n, generator=g)]
edits = {"phi_too_few_rows": lambda a: a.__setitem__(1, a[1][:5].contiguous()),
         "phi_too_few_cols": lambda a: a.__setitem__(1, a[1][:, :10].contiguous()),
         "b_res_too_short": lambda a: a.__setitem__(7, a[7].reshape(-1)[:4].contiguous()),
         "b_pre_too_short": lambda a: a.__setitem__(5, a[5][:1].contiguous())}
res = {}
for name, edit in edits.items():
    a = ins()
    edit(a)
    try:
        torch.ops.addnorm.mhc_pre(*a, None, 1e-6, 20)
        res[name] = "accepted"
    except Exception as e:
        res[name] = type(e).__name__
print(json.dumps(res))
"""


@NEEDS_CPU
def test_raw_operator_refuses_inconsistent_shapes():
    # Was a defect (fixed): torch.ops.addnorm.mhc_pre (what torch.compile / export record, and callable directly) does no shape
    # checking of its own on CPU: the formulas would raise (matmul / unflatten / broadcast errors), but the CPU
    # kernel path (ops/mhc/schema.py _impls.pre -> kernels/cpu/mhc.py mhc_pre/_geometry) takes phi with fewer rows
    # than n*C (reads past phi's buffer: non-finite garbage), phi with m != 2n + n^2 and no perms (Sinkhorn on
    # logits past m; its backward writes past dlogits), and a b_res / b_pre shorter than m (reads past the bias).
    # Got "accepted" for all four. Fix: validate in kernels/cpu/mhc.py _geometry as the Triton host's _geometry
    # does (phi.shape == (n*C, m); perm_idx None => m == 2n + n^2; bias.numel() == m), or in _impls.pre/backward.
    res = subprocess.run([sys.executable, "-c", RAW_OP_SHAPES], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert res.returncode == 0, f"crashed (rc {res.returncode}): {res.stderr[-300:]}"
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert all(v != "accepted" for v in got.values()), got


@NEEDS_CPU
def test_raw_operator_opcheck_on_odd_inputs():
    cases = []
    ins, perms = _make((2, 3), 3, 8, dt=bf, pdt=bf, cdt=bf)
    cases.append((ins, perms, ITERS))
    ins, perms = _make((2, 3), 3, 8, pdt=f64)
    cases.append((ins, perms, ITERS))
    ins, perms = _make((2, 3), 3, 8, lite=True)
    ins[0] = ins[0].transpose(0, 1)
    cases.append((ins, perms, ITERS))
    for ins, perms, iters in cases:
        torch.library.opcheck(torch.ops.addnorm.mhc_pre.default,
                              (*[t.requires_grad_() for t in ins], perms, EPS, iters))


def test_zero_streams_is_refused_clearly_or_returns_empty():
    # Was a defect (minor, validation; fixed): n = 0 passes _check_mhc (phi (0, 0), empty coefficients) and then dies in the
    # spec's Sinkhorn with "IndexError: amax(): Expected reduction dim -2 to have non-zero size" -- neither a clear
    # refusal naming n (as the rest of _check_mhc does) nor empty outputs. Fix: refuse n < 1 in _check_mhc
    # (functional/stream.py), or guard the amax in mhc_formulas.sinkhorn_knopp.
    x = torch.randn(3, 0, 8)
    args = (x, torch.zeros(0, 0), torch.tensor(1.0), torch.tensor(1.0), torch.tensor(1.0), torch.zeros(0),
            torch.zeros(0), torch.zeros(0))
    try:
        out = mhc_pre(*args)
    except ValueError as e:
        assert "stream" in str(e) or "n" in str(e)
        return
    assert [tuple(o.shape) for o in out] == [(3, 8), (3, 0), (3, 0), (3, 0, 0)]


def test_mixed_devices_and_bad_coefficients_are_refused():
    ins, _ = _make((2,), 3, 8)
    for i, name in ((1, "phi"), (4, "a_res"), (7, "b_res")):
        a = list(ins)
        a[i] = a[i].to("meta")
        with pytest.raises(ValueError, match=name):
            mhc_pre(*a)
    a = list(ins)
    a[5] = a[5].reshape(3, 1)
    with pytest.raises(ValueError, match="b_pre"):
        mhc_pre(*a)


def test_meta_fake_subclass_and_parameter_inputs():
    from torch._subclasses import FakeTensorMode

    ins, _ = _make((2, 3), 3, 8, dt=bf, pdt=f64)
    real = torch.ops.addnorm.mhc_pre(*ins, None, EPS, ITERS)
    with FakeTensorMode() as fm:
        fake = torch.ops.addnorm.mhc_pre(*[fm.from_tensor(t) for t in ins], None, EPS, ITERS)
    for a, b in zip(real, fake, strict=True):
        assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())
    meta = mhc_pre(*[t.to("meta") for t in ins])
    assert [(o.shape, o.dtype) for o in meta] == [(o.shape, o.dtype) for o in real[:4]]
    ins, _ = _make((2, 3), 3, 8)
    _, exp = _spec64(ins, None)

    class Sub(torch.Tensor):
        pass

    px = torch.nn.Parameter(ins[0].clone())
    for x in (px, ins[0].as_subclass(Sub)):
        out = mhc_pre(x, *ins[1:])
        assert all(_max_rel(a, e) < 2e-5 for a, e in zip(out, exp, strict=True))
    (g,) = torch.autograd.grad(mhc_pre(px, *ins[1:])[3].pow(2).sum(), px)
    x64 = ins[0].double().requires_grad_()
    (e,) = torch.autograd.grad(mf.pre(x64, *[t.double() for t in ins[1:]], None, EPS, ITERS)[3].pow(2).sum(), x64)
    assert _max_rel(g, e) < 2e-5


# ---------------------------------------------------------------------------------------------- NaN / Inf / range

def _scale(s):
    return lambda a: a.__setitem__(1, a[1] * s)


def _set(i, v):
    return lambda a: a.__setitem__(i, v)


def _x_tok(f):
    def edit(a):
        a[0] = a[0].clone()
        a[0][1] = f(a[0][1])
    return edit


EXTREMES = {  # name -> (edit, eps); judged against the float32 formulas: float32 rounding decides these answers
    "zero_token_eps0": (_x_tok(lambda t: t * 0), 0.0),
    "tiny_token_eps0": (_x_tok(lambda t: t * 1e-25), 0.0),
    "tiny_token_1e-21_eps0": (_x_tok(lambda t: t * 1e-21), 0.0),
    "huge_token_sumsq_overflows": (_x_tok(lambda t: t.index_fill(-1, torch.tensor([0]), 1e30)), EPS),
    "x_nan": (_x_tok(lambda t: t.index_fill(-1, torch.tensor([3]), float("nan"))), EPS),
    "x_inf": (_x_tok(lambda t: t.index_fill(-1, torch.tensor([3]), float("inf"))), EPS),
    "logits_x30": (_scale(30.0), EPS),
    # (logits x100: see test_sinkhorn_with_a_row_sum_below_the_float32_normal_range)
    "logits_x1e4": (_scale(1e4), EPS),
    "logits_x1e30": (_scale(1e30), EPS),
    "b_res_pm200": (lambda a: a.__setitem__(7, (torch.tensor([200.0, -200.0, 0.0] * 3)[:a[7].numel()])
                                            .reshape(a[7].shape)), EPS),
    "nan_in_phi": (lambda a: a[1].__setitem__((3, 7), float("nan")), EPS),
    "inf_a_res": (_set(4, torch.tensor(float("inf"))), EPS),
    "saturated_sigmoids": (lambda a: [a.__setitem__(5, torch.full((3,), -200.0)),
                                      a.__setitem__(6, torch.full((3,), 200.0))], EPS),
    # eps = inf is refused now, as the norms refuse it (test_bad_eps_and_perms_are_refused_by_name)
    "eps_1e300": (lambda a: None, 1e300),
}


@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "lite"])
@pytest.mark.parametrize("case", list(EXTREMES))
@pytest.mark.parametrize("backend", [b for b in FAST if b != "torch"])
def test_nan_inf_and_range_semantics_match_the_float32_formulas(backend, case, lite):
    ins, perms = _make((4,), 3, 8, lite=lite)
    edit, eps = EXTREMES[case]
    edit(ins)
    got = mhc_pre(*ins, perms=perms, eps=eps, backend=backend)
    want = mhc_pre(*ins, perms=perms, eps=eps, backend="torch")
    for k, (a, e) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, e, equal_nan=True, atol=1e-5 if k else 1e-4, rtol=1e-5, msg=f"output {k}")


def _denormal_row(a):
    """n = 2, phi = 0: res logits [[0, 0], [-95, -95]]; exp(-95) = 5.5e-42 is subnormal in float32, each round's
    row sum of row 1 is 1.1e-41, and the spec's division gives H_res = 0.5 everywhere."""
    n, C = 2, 4
    a[:] = [torch.ones(3, n, C), torch.zeros(n * C, 2 * n + n * n), *(torch.tensor(1.0) for _ in range(3)),
            torch.zeros(n), torch.zeros(n), torch.tensor([[0.0, 0.0], [-95.0, -95.0]])]


@pytest.mark.parametrize("case", ["denormal_row_sum_2x2", "random_logits_x100"])
@pytest.mark.parametrize("backend", KERNELS)
def test_sinkhorn_with_a_row_sum_below_the_float32_normal_range(backend, case):
    # Was a defect (fixed): the CPU kernel's Sinkhorn-Knopp (mhc_rows.h mhc_sinkhorn: `ic[j] = 1.0f / c[j]; M *= ic`, and
    # `ir[i] = 1.0f / r[i]` for rows; mhc_sinkhorn_backward likewise) multiplies by a reciprocal. When a row (or
    # column) sum is below 1 / FLT_MAX = 2.9e-39 -- a row whose logits all sit ~88+ below the matrix's max: a
    # saturated H_res -- the reciprocal overflows to inf: H_res gets inf, and 0 * inf = NaN spreads to the whole
    # matrix. The spec divides (m / m.sum(...)): d / (2 d) = 0.5, finite (the Triton kernel divides too and
    # agrees). Got [[0.5, 0.5], [inf, inf]] for the 2x2 case, and an all-NaN H_res for a token of random logits
    # scaled x100 where the float32 formulas give a finite H_res close to float64. Fix: divide (`M[i*n+j] /= c[j]`),
    # or take the reciprocal in double / clamp it, in both mhc_sinkhorn and mhc_sinkhorn_backward.
    if case == "denormal_row_sum_2x2":
        ins, perms = [], None
        _denormal_row(ins)
        iters = 1
    else:
        ins, perms = _make((4,), 3, 8, scale=100.0)
        iters = ITERS
    got = mhc_pre(*ins, perms=perms, iters=iters, backend=backend)
    want = mhc_pre(*ins, perms=perms, iters=iters, backend="torch")
    for k, (a, e) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, e, equal_nan=True, atol=1e-5 if k else 1e-4, rtol=1e-5, msg=f"output {k}")


@pytest.mark.parametrize("backend", [b for b in KERNELS])
def test_a_nan_res_logit_with_zero_sinkhorn_rounds(backend):
    # Was a defect (minor; fixed): one NaN res logit, iters = 0. The spec's Sinkhorn subtracts logits.amax(), which propagates
    # NaN, so the whole H_res of that token is NaN. The CPU kernel's max (mhc_rows.h mhc_sinkhorn:
    # `mx = L[e] > mx ? L[e] : mx`) skips a NaN that is not the first entry, and Triton's tl.max (mhc_kernels.py
    # _sk_start) does too: only the NaN entry is NaN (got 1 NaN of 9 per token, expected 9). With iters >= 1 the
    # NaN spreads through the sums anyway, so only iters = 0 differs. Fix: propagate NaN in the max
    # (`mx = (L[e] > mx || L[e] != L[e]) ? L[e] : mx`; in Triton tl.max(..., propagate_nan=tl.PropagateNan.ALL)).
    # Since then iters = 0 takes no shift at all (M0 = exp(L), eq. 9; see test_zero_rounds_is_exp_of_the_logits):
    # the NaN stays in its entry on every backend, which is what is compared.
    ins, _ = _make((4,), 3, 8)
    ins[7] = ins[7].clone()
    ins[7][1, 2] = float("nan")
    got = mhc_pre(*ins, iters=0, backend=backend)[3]
    want = mhc_pre(*ins, iters=0, backend="torch")[3]
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (int(torch.isnan(got).sum()), int(torch.isnan(want).sum()))


@NEEDS_TRITON
@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "lite"])
def test_triton_res_logits_below_minus_3e38(lite):
    # Was a defect (fixed): Triton pads the res logits of a non-power-of-two n (n = 3: NB = 4; mHC-lite: r = 6, RB = 8) with
    # -3.0e38 (mhc_kernels.py _sk_start `tl.where(valid, L, -3.0e38)`, _lite_start likewise) before taking the
    # max. Finite float32 logits below -3.0e38 (e.g. b_res = -3.2e38) then have max = -3e38 from the padding, every
    # exp(L - max) underflows to 0 and H_res comes out NaN (0/0). The spec and the CPU kernel (max over the valid
    # entries only) give a finite doubly stochastic H_res. Fix: pad with float('-inf') (exp(-inf) = 0, and a
    # valid entry always sets the max).
    ins, perms = _make((4,), 3, 8, lite=lite)
    ins[7] = ins[7] - 3.2e38
    got = mhc_pre(*ins, perms=perms, backend="triton")
    want = mhc_pre(*ins, perms=perms, backend="torch")
    assert torch.isfinite(want[3]).all()
    for k, (a, e) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, e, equal_nan=True, atol=1e-5 if k else 1e-4, rtol=1e-5, msg=f"output {k}")


@pytest.mark.parametrize("backend", [b for b in FAST if b != "torch"])
@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "lite"])
def test_gradients_at_large_logits_match_the_float32_formulas(backend, lite):
    ins, perms = _make((6,), 3, 8, lite=lite, scale=30.0)
    outs = []
    for be in (backend, "torch"):
        xs = [t.detach().clone().requires_grad_() for t in ins]
        out = mhc_pre(*xs, perms=perms, backend=be)
        g = torch.Generator().manual_seed(3)
        outs.append(torch.autograd.grad(sum((o * torch.randn(o.shape, generator=g)).sum() for o in out), xs))
    for a, e in zip(*outs, strict=True):
        assert _max_rel(a, e) < 1e-4


# ---------------------------------------------------------------------------------------------- grad modes

@pytest.mark.parametrize("backend", FAST)
def test_no_grad_and_inference_mode(backend):
    ins, perms = _make((2, 5), 4, 16, lite=True)
    _, exp = _spec64(ins, perms)
    ins = [t.requires_grad_() for t in ins]
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            out = mhc_pre(*ins, perms=perms, backend=backend)
        assert all(o.grad_fn is None and not o.requires_grad for o in out)
        assert all(_max_rel(a, e) < 2e-5 for a, e in zip(out, exp, strict=True))


@pytest.mark.parametrize("backend, iters", [("torch", ITERS), ("cpu", 70), ("cpu", ITERS)],
                         ids=["torch", "cpu_formula_fallback", "cpu_kernel"])
def test_cpu_autocast_does_not_drop_the_coefficients_to_16_bits(backend, iters):
    # Was a defect (fixed): under torch.autocast("cpu", bfloat16) the public mhc_pre gives float32-typed coefficients at
    # bfloat16 precision on the formulas (backend="torch", and the CPU backend wherever the kernels decline:
    # iters > 64, n > 8, m > 128, non-permutation perms): mhc_formulas.pre's `v @ phi` is autocast to bf16. The
    # kernels compute in float32. Got errors ~1e-3 (torch, fallback: h 7e-4 rel., H_* 1e-3..3e-3 abs) vs ~3e-7
    # (kernel) against float64: the answer depends on which path takes the call. The model is immune only because
    # ManifoldHyperConnection.read turns autocast off ("never 16 bits"). Fix: run the formulas with autocast
    # disabled (in functional.mhc.mhc_pre's torch path and in ops/mhc/schema.py _pre_formulas/_pre_backward_formulas,
    # or inside mhc_formulas.pre/pre_backward), as streams.py does.
    if backend == "cpu" and "cpu" not in KERNELS:
        pytest.skip("the compiled CPU kernels are not built")
    ins, perms = _make((2, 5), 4, 16)
    _, exp = _spec64(ins, perms, iters=iters)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mhc_pre(*ins, perms=perms, iters=iters, backend=backend)
    assert [o.dtype for o in out] == [f32] * 4
    for k, (a, e) in enumerate(zip(out, exp, strict=True)):
        assert _max_rel(a, e) < 2e-5, f"output {k}: {_max_rel(a, e):.2e}"


@pytest.mark.parametrize("backend", KERNELS)
def test_forward_over_reverse_hvp(backend):
    # Was a defect (fixed): forward-over-reverse (a gradient taken inside a forward-AD dual level, the usual Hessian-vector
    # product) drops the tangent on the kernels: MhcPre.backward (ops/mhc/autograd.py) calls the fused backward
    # (ctx.direct / the operator) whenever create_graph is off, and the kernels read the dual tensors' primal data
    # only. fwAD.unpack_dual(grad).tangent is None (i.e. 0) instead of H v (backend="torch" gives H v). The same
    # pattern is in the add_norm and stream autograd Functions. Fix: in backward, when
    # torch.autograd.forward_ad._current_level >= 0, use the differentiable formulas (or have mhc_pre take the
    # torch path when a dual level is active, as it already does under functorch transforms).
    ins, _ = _make((2, 3), 3, 8)
    tx = torch.randn(ins[0].shape, generator=torch.Generator().manual_seed(9))
    x = ins[0].clone().requires_grad_()
    with fwAD.dual_level():
        xd = fwAD.make_dual(x, tx)
        out = mhc_pre(xd, *ins[1:], backend=backend)
        (g,) = torch.autograd.grad((out[0] ** 2).sum() + (out[3] ** 2).sum(), xd)
        got = fwAD.unpack_dual(g).tangent
    x64 = ins[0].double().requires_grad_()
    o = mf.pre(x64, *[t.double() for t in ins[1:]], None, EPS, ITERS)
    (g64,) = torch.autograd.grad((o[0] ** 2).sum() + (o[3] ** 2).sum(), x64, create_graph=True)
    (hv,) = torch.autograd.grad(g64, x64, tx.double())
    assert got is not None, "the gradient has no tangent (H v dropped)"
    assert _max_rel(got, hv) < 1e-4


@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "lite"])
@pytest.mark.parametrize("backend", FAST)
def test_forward_ad_with_tangents_on_some_inputs(backend, lite):
    ins, perms = _make((3,), 3, 8, lite=lite)
    for which, iters in (([1], 0), ([7], 7), ([0, 4], 20), ([2, 3, 5, 6], 0)):
        g = torch.Generator().manual_seed(4)
        tans = {i: torch.randn(ins[i].shape, generator=g) for i in which}
        with fwAD.dual_level():
            d = [fwAD.make_dual(t, tans[i]) if i in tans else t for i, t in enumerate(ins)]
            got = [fwAD.unpack_dual(o).tangent for o in mhc_pre(*d, perms=perms, iters=iters, backend=backend)]

        def f(*a):
            full = [t.double() for t in ins]
            for i, v in zip(which, a):
                full[i] = v
            return mf.pre(*full, None if perms is None else perms.double(), EPS, iters)[:4]

        _, jv = torch.func.jvp(f, tuple(ins[i].double() for i in which), tuple(tans[i].double() for i in which))
        for a, e in zip(got, jv, strict=True):
            assert _max_rel(torch.zeros_like(e) if a is None else a, e) < 1e-5


def test_torch_func_transforms_over_the_public_function():
    ins, _ = _make((2, 5), 4, 16)

    def loss(x, phi):
        o = mhc_pre(x, phi, *ins[2:])
        return (o[0] ** 2).sum() + (o[3] ** 2).sum() + o[2].sum()

    got = torch.func.grad(loss, argnums=(0, 1))(ins[0], ins[1])
    i64, o = _spec64(ins, None, grad=True)
    want = torch.autograd.grad((o[0] ** 2).sum() + (o[3] ** 2).sum() + o[2].sum(), i64[:2])
    assert all(_max_rel(a, e) < 2e-5 for a, e in zip(got, want, strict=True))
    phis = torch.stack([ins[1], ins[1] * 0.5])
    out = torch.vmap(lambda p: mhc_pre(ins[0], p, *ins[2:]))(phis)
    _, exp = _spec64([ins[0], ins[1] * 0.5, *ins[2:]], None)
    assert all(_max_rel(a[1], e) < 2e-5 for a, e in zip(out, exp, strict=True))
    tok = ins[0][0, 0:1]
    J = torch.func.jacrev(lambda a: mhc_pre(tok, ins[1], ins[2], ins[3], a, *ins[5:])[3])(ins[4])
    J64 = torch.func.jacrev(lambda a: mf.pre(tok.double(), ins[1].double(), ins[2].double(), ins[3].double(), a,
                                             *[t.double() for t in ins[5:]], None, EPS, ITERS)[3])(ins[4].double())
    assert _max_rel(J, J64) < 2e-5


def test_double_backward_through_the_kernels():
    ins, _ = _make((2, 5), 4, 16)
    x, phi = ins[0].clone().requires_grad_(), ins[1].clone().requires_grad_()
    o = mhc_pre(x, phi, *ins[2:])
    (g,) = torch.autograd.grad((o[0] ** 2).sum() + (o[3] ** 2).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad((g ** 2).sum(), phi)
    x6, p6 = ins[0].double().requires_grad_(), ins[1].double().requires_grad_()
    o6 = mf.pre(x6, p6, *[t.double() for t in ins[2:]], None, EPS, ITERS)
    (g6,) = torch.autograd.grad((o6[0] ** 2).sum() + (o6[3] ** 2).sum(), x6, create_graph=True)
    (gg6,) = torch.autograd.grad((g6 ** 2).sum(), p6)
    assert _max_rel(gg, gg6) < 1e-5


def test_compile_dynamic_matches_eager():
    def f(*a, perms=None):
        h, hp, hpo, hr = mhc_pre(*a, perms=perms)
        return (h * h).sum() + (hpo * hp).sum() + (hr * hr).sum()

    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", dynamic=True, fullgraph=True)
    for lead, lite in (((2, 3), False), ((5,), False), ((4,), True)):
        ins, perms = _make(lead, 3, 8, lite=lite)
        ins = [t.requires_grad_() for t in ins]
        lc = cf(*ins, perms=perms)
        gc = torch.autograd.grad(lc, ins)
        le = f(*ins, perms=perms)
        ge = torch.autograd.grad(le, ins)
        torch.testing.assert_close(lc, le, atol=1e-5, rtol=1e-6)
        for a, e in zip(gc, ge, strict=True):
            torch.testing.assert_close(a, e, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------------- determinism

@NEEDS_CPU
@pytest.mark.parametrize("dt", [f32, bf], ids=str)
@pytest.mark.parametrize("lite", [False, True], ids=["mhc", "lite"])
def test_threads_deterministic_and_close(lite, dt):
    ins, perms = _make((300,), 4, 32, lite=lite, dt=dt)  # N * nC = 38400: above the parallel threshold

    def run(nt):
        torch.set_num_threads(nt)
        xs = [t.detach().clone().requires_grad_() for t in ins]
        out = mhc_pre(*xs, perms=perms, backend="cpu")
        g = torch.Generator().manual_seed(1)
        grads = torch.autograd.grad(sum((o.float() * torch.randn(o.shape, generator=g)).sum() for o in out), xs)
        return [o.detach() for o in out] + list(grads)

    old = torch.get_num_threads()
    try:
        one, one_b, two, two_b = run(1), run(1), run(2), run(2)
    finally:
        torch.set_num_threads(old)
    assert all(torch.equal(a, b) for a, b in zip(one, one_b, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(two, two_b, strict=True))
    assert all(_max_rel(a, b) < 1e-6 for a, b in zip(one, two, strict=True))


ISA_PROBE = r"""
import json, math, itertools, torch
from addnorm.functional import mhc_pre
from addnorm.ops.mhc import formulas as mf
import addnorm
def perms_(n):
    return torch.stack([torch.eye(n)[list(p)] for p in itertools.permutations(range(n))])
worst = 0.0
CASES = [((7,), 4, 33, False, torch.float32, torch.bfloat16), ((5,), 3, 5, True, torch.bfloat16, torch.float32),
         ((3,), 8, 9, False, torch.float16, torch.float32), ((6,), 1, 40, True, torch.float32, torch.float32),
         ((9,), 2, 1, False, torch.float32, torch.float32), ((11,), 4, 37, False, torch.float32, torch.float32)]
for seed, (lead, n, C, lite, dt, pdt) in enumerate(CASES):
    g = torch.Generator().manual_seed(seed)
    r = math.factorial(n) if lite else n * n
    ins = [torch.randn(*lead, n, C, generator=g).to(dt),
           (torch.randn(n * C, 2 * n + r, generator=g) / (n * C) ** 0.5).to(pdt),
           *(torch.tensor(v) for v in (0.8, 0.6, 1.1)), 0.5 * torch.randn(n, generator=g),
           0.5 * torch.randn(n, generator=g), 0.5 * torch.randn(r if lite else n * n, generator=g)]
    perms = perms_(n) if lite else None
    ins = [t.requires_grad_() for t in ins]
    out = mhc_pre(*ins, perms=perms, backend="cpu")
    cots = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in out]
    gr = torch.autograd.grad(sum((o.double() * c).sum() for o, c in zip(out, cots)), ins)
    i64 = [t.detach().double().requires_grad_() for t in ins]
    e = mf.pre(*i64, None if perms is None else perms.double(), 1e-6, 20)[:4]
    ge = torch.autograd.grad(sum((o * c).sum() for o, c in zip(e, cots)), i64)
    pairs = list(zip(out[1:], e[1:]))  # the coefficients: float32 outputs of exactly upcast inputs
    if dt == pdt == torch.float32:  # and the gradients, where no 16-bit rounding of h / dh / dx is involved
        pairs += list(zip(gr, ge))
    for a, b in pairs:
        worst = max(worst, ((a.double() - b).abs().max() / (1 + b.abs().max())).item())
print(json.dumps({"isa": addnorm.cpu_kernel_availability().isa, "worst": worst}))
"""


@NEEDS_CPU
def test_instruction_set_caps_agree_with_the_float64_spec():
    """ADDNORM_CPU_ISA is read once per process: each cap in its own process; the coefficients (float32 outputs)
    and, for float32 inputs, dphi against float64 (16-bit h / dx are rounded to their dtype: judged elsewhere)."""
    for isa, name in (("avx2", "avx2+fma+f16c"), ("baseline", "baseline")):
        env = dict(os.environ, ADDNORM_CPU_ISA=isa)
        res = subprocess.run([sys.executable, "-c", ISA_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0, res.stderr[-500:]
        got = json.loads(res.stdout.strip().splitlines()[-1])
        assert got["isa"] == name
        assert got["worst"] < 5e-6, (isa, got)


# ---------------------------------------------------------------------------------------------- the model

def _model(name, dtype=torch.float32):
    from addnorm.model import GPTConfig
    from tests.frontier.frontier_cases import batch, perturbed_model

    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, placement=name, n_streams=4)
    return perturbed_model(cfg, dtype=dtype), batch(cfg, B=3, T=16)


def _step(m, idx, autocast):
    m.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits, loss = m(idx, idx)
    loss.backward()
    return logits.detach().float(), {k: p.grad.detach().double().clone() for k, p in m.named_parameters()}


@NEEDS_CPU
@pytest.mark.parametrize("name", ["mhc", "mhc_lite"])
def test_gpt_float32_torch_backend_equals_kernels(name):
    m, idx = _model(name)
    with addnorm.use_backend("torch"):
        l_t, g_t = _step(m, idx, False)
    assert addnorm.last_backend() == "torch"
    with addnorm.use_backend("auto"):
        l_k, g_k = _step(m, idx, False)
    torch.testing.assert_close(l_k, l_t, atol=1e-5, rtol=1e-5)
    for k in g_t:
        assert _max_rel(g_k[k], g_t[k]) < 2e-4, k


@NEEDS_CPU
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16_autocast"])
@pytest.mark.parametrize("name", ["mhc", "mhc_lite"])
def test_gpt_mhc_pre_backends_agree_inside_the_model(name, autocast, monkeypatch):
    """Only mhc_pre switched between the kernels and the formulas (the rest of the model on backend='torch'), so
    that bf16 autocast differences elsewhere (norms, attention) cannot hide or fake a difference here."""
    orig = SF.mhc_pre
    m, idx = _model(name)
    res = {}
    for be in ("torch", "cpu"):
        monkeypatch.setattr(SF, "mhc_pre", lambda *a, backend=None, _be=be, **kw: orig(*a, backend=_be, **kw))
        with addnorm.use_backend("torch"):
            res[be] = _step(m, idx, autocast)
    torch.testing.assert_close(res["cpu"][0], res["torch"][0], atol=1e-5, rtol=1e-5)
    # under bf16 autocast the rest of the model rounds to bf16 (an ulp is 4e-3 relative): one layer's weight
    # gradient measured 2.3e-4 apart (mhc_lite, the attention's c_proj) on an AVX-512 machine at 1 or 2 threads
    bound = 1e-3 if autocast else 2e-4
    for k in res["torch"][1]:
        assert _max_rel(res["cpu"][1][k], res["torch"][1][k]) < bound, k


def test_formulas_pre_jvp_matches_torch_func_jvp_of_the_spec():
    """The hand-written forward-mode derivative (mhc_formulas.pre_jvp, what every backend's jvp runs) against
    torch.func.jvp of mhc_formulas.pre, in float64, both mHC and mHC-lite, iters 0 and 5."""
    for lite, iters in ((False, 0), (False, 5), (True, 0)):
        ins, perms = _make((2, 3), 3, 4, lite=lite, dt=f64, pdt=f64, cdt=f64)
        g = torch.Generator().manual_seed(5)
        tans = [torch.randn(t.shape, generator=g, dtype=f64) for t in ins]
        got = mf.pre_jvp(ins, tans, perms, EPS, iters)
        _, want = torch.func.jvp(lambda *a: mf.pre(*a, perms, EPS, iters)[:4], tuple(ins), tuple(tans))
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, atol=1e-10, rtol=1e-9)


def _lost_column(backend):
    """A column whose logits sit 120 below the other's: under the matrix's max its exp underflowed to 0 in float32
    and the first (column) division made the whole H_res NaN (0 / 0), and its gradients NaN on phi and b_res."""
    ins, _ = _make((3,), 2, 4)
    ins[7] = torch.tensor([[0.0, -120.0], [0.0, -120.0]])
    return ins


@pytest.mark.parametrize("backend", KERNELS + ["torch"])
def test_a_column_far_below_the_others_stays_finite(backend):
    # Was a defect (fixed): the shift before exp was the matrix's max; it is each column's now (the first round, over
    # the columns, divides it out exactly), so a column ~104+ below the rest no longer underflows to zeros.
    ins = [t.requires_grad_() for t in _lost_column(backend)]
    out = mhc_pre(*ins, backend=backend)
    ref = mf.pre(*[t.detach().double() for t in ins], None, EPS, ITERS)
    assert all(torch.isfinite(o).all() for o in out)
    torch.testing.assert_close(out[3].double(), ref[3], atol=1e-6, rtol=1e-5)
    grads = torch.autograd.grad(sum(o.float().sum() * (k + 1) for k, o in enumerate(out)), ins)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("backend", KERNELS + ["torch"])
def test_zero_rounds_is_exp_of_the_logits(backend):
    # Was a defect (fixed): with iters = 0 every backend returned exp(L - max L), not eq. 9's M0 = exp(L) -- the max
    # shift is only divided out by a round -- and its gradient treated the max as a constant (gradcheck failed).
    n = 3
    ins, _ = _make((2,), n, 4)
    got = mhc_pre(*ins, iters=0, backend=backend)[3]
    ref = mf.pre(*[t.double() for t in ins], None, EPS, 0)
    p = ref[4]  # the projection over RMS(vec(X)): the res logits are a_res p[2n:] + b_res
    want = torch.exp(ins[4].double() * p[..., 2 * n:].unflatten(-1, (n, n)) + ins[7].double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    if backend == "torch":
        x = ins[0].double().requires_grad_()
        rest = [t.double() for t in ins[1:]]
        assert torch.autograd.gradcheck(lambda x: mhc_pre(x, *rest, iters=0, backend=backend)[3], (x,))


def test_bad_eps_freed_perms_and_no_channels_are_refused_by_name():
    ins, perms = _make((2,), 3, 4, lite=True)
    with pytest.raises(ValueError, match="eps must be a finite"):
        mhc_pre(*ins, perms=perms, eps=float("inf"))
    freed = perms.clone()
    freed.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError, match="perms has .* storage has been freed"):
        mhc_pre(*ins, perms=freed)
    x = torch.randn(2, 3, 0)
    with pytest.raises(ValueError, match="at least one channel"):
        mhc_pre(x, torch.zeros(0, 15), *ins[2:])
