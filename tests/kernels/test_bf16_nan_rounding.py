"""bfloat16 rounding without its NaN test (an_f32_to_bf16_nf) must never turn a NaN into a number.

The bfloat16 loops round as ``(u + 0x7fff + lsb) >> 16``. That is exact for every value but a NaN whose low 16 bits
are not zero: its rounding can carry into the exponent and sign (0x7fffffff becomes -0) or drop every mantissa bit
left (0x7f800001 becomes inf). Such a NaN can only come from a float32 operand -- weights, biases, alpha, shift,
saved statistics, the widened stream's coefficients -- so each call tests those and keeps the NaN test where one
holds such a NaN. Here every fused op and the widened stream's read and write, forward and backward, on every instruction-set path (each in its own process), gets float32 weights holding
those NaNs and bfloat16 activations holding NaN and infinities, and must put NaN and inf (with its sign) exactly
where PyTorch's composite (``backend="torch"``) puts them.
"""

import os
import subprocess
import sys

import pytest
import torch

import addnorm

pytestmark = pytest.mark.skipif(not addnorm.cpu_kernel_availability().available,
                                reason="the compiled CPU kernels are not built")

SCRIPT = r'''
import sys
import torch
import addnorm
from addnorm.functional import layer_norm_add, parallel_add_layer_norm, parallel_add_rms_norm, rms_norm_add
from addnorm.functional import add_derf, add_dyt, stream_read, stream_write

# float32 NaNs whose low half is not zero, and one whose low half is (the kind arithmetic makes)
BAD = [0x7fffffff, 0x7f800001, 0xffbfffff, 0x7fc0ffff, 0x7fc00000]
# bfloat16 NaNs (quiet, signalling, negative) and infinities
ACT = [0x7fff, 0x7f81, 0xffc1, 0x7f80, 0xff80]


def f32_bits(bits):
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


def bf16_bits(bits):
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def inputs(case):
    g = torch.Generator().manual_seed(case)
    N, D = 12, 80
    x = torch.randn(N, D, generator=g).bfloat16()
    r = torch.randn(N, D, generator=g).bfloat16()
    w = torch.randn(D, generator=g) + 1.5
    b = torch.randn(D, generator=g)
    if case == 1:  # weights and biases with NaNs of every payload, one per channel
        w[3:3 + len(BAD)] = f32_bits(BAD)
        b[20:20 + len(BAD)] = f32_bits(BAD)
    if case == 2:  # activations with NaN and infinities, one per row
        x.view(-1)[[5 + 81 * k for k in range(len(ACT))]] = bf16_bits(ACT)
    return x, r, w, b


def coefficients(case):
    """H_pre, H_post (12, 4) and H_res (12, 4, 4), float32; in case 1 one NaN of BAD per token in each."""
    g = torch.Generator().manual_seed(7)
    hp, hpo, hr = torch.rand(12, 4, generator=g), torch.rand(12, 4, generator=g), torch.rand(12, 4, 4, generator=g)
    if case == 1:
        for t in range(12):
            nan = f32_bits([BAD[t % len(BAD)]])
            hp[t, t % 4] = nan
            hpo[t, (t + 1) % 4] = nan
            hr[t, t % 4, (t // 4) % 4] = nan
    return hp, hpo, hr


def run(backend, case):
    x0, r0, w0, b0 = inputs(case)
    D = x0.shape[-1]
    a = torch.tensor(0.7)
    sh = torch.tensor(0.1)
    calls = {
        "add_layer_norm": (lambda x, r, w, b: addnorm.add_layer_norm(x, r, D, w, b, backend=backend), "xrwb"),
        "add_rms_norm": (lambda x, r, w: addnorm.add_rms_norm(x, r, D, w, backend=backend), "xrw"),
        "layer_norm_add": (lambda x, r, w, b: (layer_norm_add(x, r, D, w, b, backend=backend),), "xrwb"),
        "rms_norm_add": (lambda x, r, w: (rms_norm_add(x, r, D, w, backend=backend),), "xrw"),
        "parallel_add_layer_norm": (lambda x, r, w, b: parallel_add_layer_norm(
            x, r.flip(0), r, D, w, b, w.flip(0), b.flip(0), backend=backend), "xrwb"),
        "parallel_add_rms_norm": (lambda x, r, w: parallel_add_rms_norm(
            x, None, r, D, w, None, branches_first=False, backend=backend), "xrw"),
        "add_dyt": (lambda x, r, w, b: add_dyt(x, r, a, w, b, backend=backend), "xrwb"),
        "add_derf": (lambda x, r, w, b: add_derf(x, r, a, sh, w, b, backend=backend), "xrwb"),
        # the widened stream (n = 4, C = 20): x as X, r's first columns as y; in case 1 every token's coefficients
        # hold one NaN of BAD (one, so that which NaN an output carries does not depend on the order of its sums)
        "stream_read": (lambda x, r: (stream_read(x.view(12, 4, 20), hp, backend=backend),), "xr"),
        # X' alone: its gradient meets only the coefficients' NaN (with q's, X''s own NaN joins the same sums)
        "stream_write": (lambda x, r: stream_write(x.view(12, 4, 20), r[:, :20], hpo, hr, backend=backend)[:1],
                         "xr"),
        "stream_write_q": (lambda x, r: stream_write(x.view(12, 4, 20), r[:, :20], hpo, hr, backend=backend), "xr"),
    }
    hp, hpo, hr = coefficients(case)
    out = {}
    for name, (fn, args) in calls.items():
        ins = [{"x": x0, "r": r0, "w": w0, "b": b0}[k].clone().requires_grad_() for k in args]
        outs = [o for o in fn(*ins) if o is not None]
        grads = torch.autograd.grad(outs, ins[:2], [torch.ones_like(o) for o in outs], allow_unused=True)
        out[name] = [t.detach().float() for t in (*outs, *grads) if t is not None]
    return out


if __name__ == "__main__":
    torch.save({"isa": addnorm.cpu_kernel_availability().isa,
                "res": {case: run("cpu", case) for case in (1, 2)}}, sys.argv[1])
'''


def _ops_module(tmp_path):
    """SCRIPT written to tmp_path (the subprocesses run it) and imported here."""
    path = tmp_path / "nan_ops.py"
    path.write_text(SCRIPT)
    sys.path.insert(0, str(tmp_path))
    try:
        import nan_ops
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("nan_ops", None)
    return nan_ops, path


def _torch_side(tmp_path):
    nan_ops, path = _ops_module(tmp_path)
    return {case: nan_ops.run("torch", case) for case in (1, 2)}, path


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512", "native"])
def test_nans_and_infinities_land_where_eager_puts_them(isa, tmp_path):
    eager, script = _torch_side(tmp_path)
    out = tmp_path / f"{isa}.pt"
    env = dict(os.environ, ADDNORM_CPU_ISA=isa)
    subprocess.run([sys.executable, str(script), str(out)], env=env, check=True, timeout=300)
    got = torch.load(out)
    _same_specials(got["res"], eager, got["isa"])


def _same_specials(ours: dict, eager: dict, where: str) -> None:
    for case, ops in eager.items():
        for name, tensors in ops.items():
            got = ours[case][name]
            assert len(got) == len(tensors), name
            assert any(e.isfinite().any() for e in tensors), name  # the case leaves numbers to compare too
            for k, (o, e) in enumerate(zip(got, tensors)):
                at = f"{name} output {k}, case {case}, {where}"
                assert torch.equal(o.isnan(), e.isnan()), f"{at}: NaN at {(o.isnan() != e.isnan()).nonzero()[:4]}"
                assert torch.equal(o.isposinf(), e.isposinf()) and torch.equal(o.isneginf(), e.isneginf()), at
                fin = e.isfinite()
                torch.testing.assert_close(o[fin], e[fin], atol=0.1, rtol=0.05, msg=at)


def test_the_triton_kernels_put_nans_and_infinities_where_eager_does(tmp_path):
    """The same inputs through the Triton kernels (in the interpreter, on CPU tensors): their rounding is
    Triton's own, and their tanh/erf and exp must keep a NaN a NaN as the C kernels now do."""
    from backends import NO_TRITON, TRITON

    if not TRITON:
        pytest.skip(NO_TRITON)
    eager, _ = _torch_side(tmp_path)
    nan_ops, _ = _ops_module(tmp_path)
    _same_specials({case: nan_ops.run("triton", case) for case in (1, 2)}, eager, "triton")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_unused_first_output_with_an_infinite_weight_leaves_the_gradient_finite(dtype):
    """The two-norm parallel form with only the second output used: the first norm's weight, infinite here,
    must not reach the stream's gradient (0 * inf would make it NaN), as in eager."""
    from addnorm.functional import parallel_add_layer_norm

    g = torch.Generator().manual_seed(3)
    x, x2, r = (torch.randn(8, 64, generator=g).to(dtype).requires_grad_() for _ in range(3))
    w, b, w2, b2 = (torch.randn(64, generator=g) for _ in range(4))
    w[5] = float("inf")
    grads = {}
    for backend in ("cpu", "torch"):
        y1, y2, s = parallel_add_layer_norm(x, x2, r, 64, w, b, w2, b2, backend=backend)
        grads[backend] = torch.autograd.grad(y2.float().sum(), [x, x2, r])
    for ours, eager in zip(grads["cpu"], grads["torch"]):
        assert ours.isfinite().all() and eager.isfinite().all()
        torch.testing.assert_close(ours.float(), eager.float(), atol=0.05, rtol=0.05)
