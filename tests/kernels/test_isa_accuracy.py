"""Every instruction-set path of the CPU kernels against the float64 truth, not against each other.

The C kernels are compiled three times (baseline x86-64, AVX2+FMA+F16C, AVX-512) and one is picked at load
time; ``ADDNORM_CPU_ISA=baseline|avx2|avx512`` caps the pick (``avx512``: without AVX512_BF16's conversions; any
other value, here ``native``, leaves the best the CPU has). The other ISA tests compare a variant with the baseline build, which agrees with an error the baseline
shares. Here each variant runs in its own process and every fused op of issue 22 -- norm-then-add (LayerNorm
and RMSNorm), the parallel residual (two norms, and one norm with ``branches_first=False``), DyT and Derf
fused with the add, the widened stream's read and write -- forward and backward, is judged against float64
formulas written here from the same rounded inputs:

- float32: ``|ours - fp64| <= 1e-5 * max|fp64|`` per output (relative to the output's scale: a norm's
  output and gradients are O(1), so this is about 1e-5 relative);
- bfloat16: ``|ours - fp64| <= 2 * |eager - fp64| + 1e-6 * max|fp64|`` where eager is the same math as
  PyTorch runs it in bfloat16 (``backend="torch"``, the composite every backend matches) -- the rule the
  Add & Norm kernels already meet (flash-attention's), with no atol of whole bf16 ulps.
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import addnorm

pytestmark = pytest.mark.skipif(not addnorm.cpu_kernel_availability().available,
                                reason="the compiled CPU kernels are not built")

ISAS = {"baseline": {"baseline"}, "avx2": {"avx2+fma+f16c", "baseline"},
        "avx512": {"avx512", "avx2+fma+f16c", "baseline"},  # what each cap may give: at most that
        "native": {"avx512+bf16", "avx512", "avx2+fma+f16c", "baseline"}}
EPS = 1e-5

# Runs every op on one backend and returns {op: [outputs..., grads of every input...]}. Executed in a
# subprocess per ISA (backend "cpu") and here (backend "torch", the eager bfloat16 error).
OPS = r'''
import torch
from addnorm.functional import layer_norm_add, parallel_add_layer_norm, parallel_add_rms_norm, rms_norm_add
from addnorm.functional import add_derf, add_dyt, stream_read, stream_write

def run_ops(inp, cot, backend, eps):
    D = inp["x"].shape[-1]
    calls = {
        "layer_norm_add": (lambda x, r, w, b: (layer_norm_add(x, r, D, w, b, eps, backend=backend),),
                           ["x", "r", "w", "b"]),
        "rms_norm_add": (lambda x, r, w: (rms_norm_add(x, r, D, w, eps, backend=backend),), ["x", "r", "w"]),
        "parallel2_layer": (lambda x, x2, r, w, b, w2, b2: parallel_add_layer_norm(
            x, x2, r, D, w, b, w2, b2, eps, backend=backend), ["x", "x2", "r", "w", "b", "w2", "b2"]),
        "parallel1_rms": (lambda x, r, w: parallel_add_rms_norm(
            x, None, r, D, w, None, eps, branches_first=False, backend=backend), ["x", "r", "w"]),
        "dyt": (lambda x, r, a, w, b: add_dyt(x, r, a, w, b, backend=backend), ["x", "r", "a", "w", "b"]),
        "derf": (lambda x, r, a, sh, w, b: add_derf(x, r, a, sh, w, b, backend=backend),
                 ["x", "r", "a", "sh", "w", "b"]),
        "stream_read": (lambda X, hp: (stream_read(X, hp, backend=backend),), ["X", "hp"]),
        "stream_write": (lambda X, y, hpo, hr: stream_write(X, y, hpo, hr, backend=backend),
                         ["X", "y", "hpo", "hr"]),
    }
    out = {}
    for name, (fn, names) in calls.items():
        ins = [inp[n].detach().clone().requires_grad_() for n in names]
        outs = [o for o in fn(*ins) if o is not None]
        grads = torch.autograd.grad(outs, ins, [c.to(o.dtype) for o, c in zip(outs, cot[name])])
        out[name] = [t.detach() for t in (*outs, *grads)]
    return out
'''

SCRIPT = OPS + r'''
import sys, addnorm
inp, cot = torch.load(sys.argv[1])
res = {dt: run_ops({k: v.to(getattr(torch, dt)) for k, v in inp.items()}, cot, "cpu", float(sys.argv[3]))
       for dt in ("float32", "bfloat16")}
torch.save({"isa": addnorm.cpu_kernel_availability().isa, "res": res}, sys.argv[2])
'''


def _reference(name):
    """float64 formulas, independent of the library: (outputs..., grads in the OPS order)."""
    def ln(s, w, b):
        return F.layer_norm(s, s.shape[-1:], w, b, EPS)

    def rms(s, w):
        return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * w

    if name == "layer_norm_add":
        return lambda x, r, w, b: (r + ln(x, w, b),)
    if name == "rms_norm_add":
        return lambda x, r, w: (r + rms(x, w),)
    if name == "parallel2_layer":
        return lambda x, x2, r, w, b, w2, b2: (ln(x + x2 + r, w, b), ln(x + x2 + r, w2, b2), x + x2 + r)
    if name == "parallel1_rms":
        return lambda x, r, w: (rms(r + x, w), r + x)
    if name == "dyt":
        return lambda x, r, a, w, b: (w * torch.tanh(a * (x + r)) + b, x + r)
    if name == "derf":
        return lambda x, r, a, sh, w, b: (w * torch.erf(a * (x + r) + sh) + b, x + r)
    if name == "stream_read":
        return lambda X, hp: ((hp.unsqueeze(-1) * X).sum(-2),)

    def write(X, y, hpo, hr):
        Xn = hr @ X + hpo.unsqueeze(-1) * y.unsqueeze(-2)
        return Xn, Xn.pow(2).sum((-2, -1))
    return write


NAMES = {"layer_norm_add": ["x", "r", "w", "b"], "rms_norm_add": ["x", "r", "w"],
         "parallel2_layer": ["x", "x2", "r", "w", "b", "w2", "b2"], "parallel1_rms": ["x", "r", "w"],
         "dyt": ["x", "r", "a", "w", "b"], "derf": ["x", "r", "a", "sh", "w", "b"],
         "stream_read": ["X", "hp"], "stream_write": ["X", "y", "hpo", "hr"]}


def _inputs():
    g = torch.Generator().manual_seed(22)
    T, D, n = 37, 259, 4  # odd sizes: every vector loop's tail runs
    inp = {"x": torch.randn(T, D, generator=g), "x2": torch.randn(T, D, generator=g),
           "r": torch.randn(T, D, generator=g), "w": 1 + 0.5 * torch.randn(D, generator=g),
           "b": 0.5 * torch.randn(D, generator=g), "w2": 1 + 0.5 * torch.randn(D, generator=g),
           "b2": 0.5 * torch.randn(D, generator=g), "a": torch.tensor(0.7), "sh": torch.tensor(0.1),
           "X": torch.randn(T, n, D, generator=g), "y": torch.randn(T, D, generator=g),
           "hp": torch.rand(T, n, generator=g), "hpo": 2 * torch.rand(T, n, generator=g),
           "hr": torch.rand(T, n, n, generator=g)}
    outs = {"layer_norm_add": [(T, D)], "rms_norm_add": [(T, D)], "parallel2_layer": [(T, D)] * 3,
            "parallel1_rms": [(T, D)] * 2, "dyt": [(T, D)] * 2, "derf": [(T, D)] * 2, "stream_read": [(T, D)],
            "stream_write": [(T, n, D), (T,)]}
    cot = {k: [torch.randn(s, generator=g) for s in shapes] for k, shapes in outs.items()}
    return inp, cot


def _truth(inp, cot, dtype):
    """float64 outputs and gradients from the inputs and cotangents as rounded to dtype."""
    out = {}
    for name, names in NAMES.items():
        ins = [inp[k].to(dtype).double().requires_grad_() for k in names]
        outs = _reference(name)(*ins)
        grads = torch.autograd.grad(outs, ins, [c.to(dtype).double() for c in cot[name]])
        out[name] = [t.detach() for t in (*outs, *grads)]
    return out


def _err(a, ref):
    return (a.double() - ref).abs().max().item()


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    d = tmp_path_factory.mktemp("isa")
    inp, cot = _inputs()
    torch.save((inp, cot), d / "inputs.pt")
    results = {}
    for isa in ISAS:
        env = {**os.environ, "ADDNORM_CPU_ISA": isa}
        subprocess.run([sys.executable, "-c", SCRIPT, str(d / "inputs.pt"), str(d / f"{isa}.pt"), str(EPS)],
                       check=True, env=env)
        results[isa] = torch.load(d / f"{isa}.pt")
    return inp, cot, results


@pytest.mark.parametrize("isa", list(ISAS))
def test_float32_matches_float64_on_every_isa(variants, isa):
    inp, cot, results = variants
    assert results[isa]["isa"] in ISAS[isa]
    truth = _truth(inp, cot, torch.float32)
    for name, got in results[isa]["res"]["float32"].items():
        for i, (a, t) in enumerate(zip(got, truth[name], strict=True)):
            scale = t.abs().max().item()
            assert _err(a, t) <= 1e-5 * scale, f"{isa} {name}[{i}]: {_err(a, t):.3g} > 1e-5 * {scale:.3g}"


@pytest.mark.parametrize("isa", list(ISAS))
def test_bfloat16_within_twice_eagers_error_on_every_isa(variants, isa):
    inp, cot, results = variants
    ns = {}
    exec(OPS, ns)  # noqa: S102 -- the same calls on the torch backend: PyTorch's own bfloat16 error
    eager = ns["run_ops"]({k: v.to(torch.bfloat16) for k, v in inp.items()}, cot, "torch", EPS)
    truth = _truth(inp, cot, torch.bfloat16)
    for name, got in results[isa]["res"]["bfloat16"].items():
        for i, (a, e, t) in enumerate(zip(got, eager[name], truth[name], strict=True)):
            bound = 2 * _err(e, t) + 1e-6 * t.abs().max().item()
            assert _err(a, t) <= bound, f"{isa} {name}[{i}]: {_err(a, t):.3g} > {bound:.3g} (eager {_err(e, t):.3g})"
