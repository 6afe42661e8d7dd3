"""The bfloat16 forwards compute the same thing on every instruction-set path, in the order their formula is written;
the backwards too (the same bits on the vector paths).

Two checks, each path in its own process (``ADDNORM_CPU_ISA``):

- **The formula as written.** Each output is ``((s - mean) * rstd) * (w + weight_offset) + b``, every operation
  rounded once in float32, with the kernel's own statistics, then rounded to bfloat16. Built with
  ``-fassociative-math``, gcc had regrouped that product as ``(s - mean) * (rstd * (w + off))`` in some loops: the
  outputs were as accurate, but one in ~10^5 (a bfloat16 tie) moved by a step, and not on every path alike.
- **The same bits on every path** for Add & Norm, norm-then-add and the parallel forms (one and two outputs), LayerNorm
  and RMSNorm, with and without weight offset, absent weights and biases, -0.0 weights, strided rows, rows with an
  offset and rows beyond float32's range, at widths with and without a tail and past the width where the AVX2 loops
  stop permuting (``AN_BF16_PERM_MAX_D``). The AVX2 loops keep each 16 values in the order that one unpack
  instruction gives (norm_rows.h, "the AVX2 bfloat16 forwards' order"); the sum of a row's lanes (``hsum``) once
  took an order per path and per loop, which moved a row's RMSNorm statistics by a float32 step on AVX2 and on the
  baseline build.
"""

import os
import subprocess
import sys

import pytest
import torch

import addnorm

pytestmark = pytest.mark.skipif(not addnorm.cpu_kernel_availability().available,
                                reason="the compiled CPU kernels are not built")

ISAS = ["baseline", "avx2", "avx512", "native"]

SCRIPT = r'''
import sys
import torch
import addnorm
from addnorm.kernels.cpu import norm as K

out = {}
literal_misses = {}
g = torch.Generator().manual_seed(0)
rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
for D in (48, 100, 1000, 1024, 2050, 65600):
    N = 3 if D > 4096 else 7
    for mode in ("randn", "offset", "huge", "negzero"):
        x, x2, r = rnd(N, D), rnd(N, D), rnd(N, D)
        if mode == "offset":
            x = x + 300.0
        if mode == "huge":
            x, r = x * 3e37, r * 3e37
        x, x2, r = x.bfloat16(), x2.bfloat16(), r.bfloat16()
        w, b, w2, b2 = rnd(D), rnd(D), rnd(D), rnd(D)
        if mode == "negzero":
            w[::5] = -0.0
            b[::3] = -0.0
            w2[1::4] = -0.0
            b2[::2] = -0.0
        k = f"{D}/{mode}"
        for off in (0.0, 1.0):
            c = f"{k}/{off}"
            out[c + "/an"] = addnorm.add_layer_norm(x, r, (D,), w, b, 1e-5, weight_offset=off, backend="cpu")
            out[c + "/an_nowb"] = addnorm.add_layer_norm(x, r, (D,), None, None, 1e-5, backend="cpu")
            out[c + "/rms"] = addnorm.add_rms_norm(x, r, (D,), w, 1e-6, weight_offset=off, backend="cpu")
            out[c + "/ln_nob"] = addnorm.layer_norm(x, (D,), w, None, 1e-5, weight_offset=off, backend="cpu")
            out[c + "/na"] = addnorm.layer_norm_add(x, r, (D,), w, b, 1e-5, weight_offset=off, backend="cpu")
            out[c + "/na_rms"] = addnorm.rms_norm_add(x, r, (D,), w, 1e-6, weight_offset=off, backend="cpu")
            out[c + "/par1"] = addnorm.parallel_add_layer_norm(x, x2, r, (D,), w, b, weight_offset=off, backend="cpu")
            out[c + "/par2"] = addnorm.parallel_add_layer_norm(x, x2, r, (D,), w, b, w2, b2, weight_offset=off,
                                                               backend="cpu")
            out[c + "/par2_nob"] = addnorm.parallel_add_layer_norm(x, x2, r, (D,), w, None, w2, None,
                                                                   weight_offset=off, backend="cpu")
            out[c + "/par_rms2"] = addnorm.parallel_add_rms_norm(x, x2, r, (D,), w, w2, weight_offset=off,
                                                                 backend="cpu")
            if mode == "huge":  # float64 statistics and xhat (checked_stats): not the float32 formula below
                continue
            for kind in ("layer", "rms"):
                y = torch.empty(N, D, dtype=torch.bfloat16)
                s = torch.empty(N, D, dtype=torch.bfloat16)
                st = torch.empty(2 if kind == "layer" else 1, N)
                K.forward(kind, x, r, w, b if kind == "layer" else None, 1e-5, off, False, y, s, st, N, D)
                mean = st[0][:, None] if kind == "layer" else torch.zeros(N, 1)
                bias = b if kind == "layer" else torch.full((D,), -0.0)
                t = (s.float() - mean) * st[-1][:, None]
                want = (t * (w + off) + bias).bfloat16()
                literal_misses[f"{c}/{kind}"] = int((y != want).sum())
        if D <= 2050:  # rows that are slices of wider ones
            X = rnd(N, 2 * D + 32).bfloat16()[:, 16:16 + D]
            R = rnd(N, 2 * D + 32).bfloat16()[:, 3:3 + D]
            out[k + "/strided_an"] = addnorm.add_layer_norm(X, R, (D,), w, b, 1e-5, backend="cpu")
            out[k + "/strided_par2"] = addnorm.parallel_add_layer_norm(X, R, X, (D,), w, b, w2, b2, backend="cpu")
            out[k + "/strided_na"] = addnorm.layer_norm_add(X, R, (D,), w, b, 1e-5, backend="cpu")
# the fused backward (the parallel forms; the AVX2 loops hold g and the dw / db sums permuted), with a row beyond float32's
# range among ordinary ones (its slow path adds into the same sums), gradients through one output or both
for D in (48, 1000, 1024, 65600):
    N = 3 if D > 4096 else 6
    for off in (0.0, 1.0):
        x, x2, r = (rnd(N, D).bfloat16() for _ in range(3))
        x[1] = (rnd(D) * 3e37).bfloat16()
        x, x2, r = (t.requires_grad_() for t in (x, x2, r))
        w, b, w2, b2 = (rnd(D).requires_grad_() for _ in range(4))
        for which in ("both", "y2", "y"):
            y, y2, s = addnorm.parallel_add_layer_norm(x, x2, r, (D,), w, b, w2, b2, weight_offset=off, backend="cpu")
            outs = [y, y2, s] if which == "both" else [y2 if which == "y2" else y, s]
            gs = torch.autograd.grad(outs, [x, x2, r, w, b, w2, b2], [rnd(t.shape).to(t.dtype) for t in outs],
                                     allow_unused=True)
            out[f"bwd/{D}/{off}/{which}/layer"] = tuple(t for t in gs if t is not None)
            y, _, s = addnorm.parallel_add_rms_norm(x, x2, r, (D,), w, None, weight_offset=off, backend="cpu")
            gs = torch.autograd.grad([y, s], [x, w], [rnd(y.shape).bfloat16(), rnd(s.shape).bfloat16()])
            out[f"bwd/{D}/{off}/{which}/rms"] = gs
        # the plain norm's backward (Add & Norm's, and norm-then-add's), which holds dw and db permuted on AVX2
        y, s = addnorm.add_layer_norm(x, r, (D,), w, b, 1e-5, weight_offset=off, backend="cpu")
        out[f"bwd/{D}/{off}/add_layer_norm"] = torch.autograd.grad([y, s], [x, r, w, b],
                                                                   [rnd(y.shape).bfloat16(), rnd(s.shape).bfloat16()])
        y, s = addnorm.add_rms_norm(x, r, (D,), w, 1e-6, weight_offset=off, backend="cpu")
        out[f"bwd/{D}/{off}/add_rms_norm"] = torch.autograd.grad([y], [x, r, w], [rnd(y.shape).bfloat16()])
        y = addnorm.layer_norm_add(x, r, (D,), None, b, 1e-5, backend="cpu")
        out[f"bwd/{D}/{off}/layer_norm_add"] = torch.autograd.grad([y], [x, r, b], [rnd(y.shape).bfloat16()])
# the two outputs of the two-norm parallel form given the same weights and the same gradient: the same formula for
# dw1 and dw2 (db1 and db2), so the same bits, whichever loop sums them
twins = {}
for dtype in (torch.bfloat16, torch.float32):
    for D in (48, 1000, 1024, 65600):
        N = 3 if D > 4096 else 6
        x, x2, r = (rnd(N, D).to(dtype) for _ in range(3))
        x[1] = (rnd(D) * 3e37).to(dtype)
        w, b = rnd(D), rnd(D)
        for off in (0.0, 1.0):
            ws = [t.clone().requires_grad_() for t in (w, b, w, b)]
            y, y2, s = addnorm.parallel_add_layer_norm(x, x2, r, (D,), *ws, weight_offset=off, backend="cpu")
            gy = rnd(N, D).to(dtype)
            twins[f"{dtype}/{D}/{off}/layer"] = torch.autograd.grad([y, y2], ws, [gy, gy])
            ws = [t.clone().requires_grad_() for t in (w, w)]
            y, y2, s = addnorm.parallel_add_rms_norm(x, x2, r, (D,), *ws, weight_offset=off, backend="cpu")
            twins[f"{dtype}/{D}/{off}/rms"] = torch.autograd.grad([y, y2], ws, [gy, gy])
torch.save({"isa": addnorm.cpu_kernel_availability().isa, "out": out, "literal": literal_misses, "twins": twins},
           sys.argv[1])
'''


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    d = tmp_path_factory.mktemp("bf16_order")
    res = {}
    for isa in ISAS:
        path = d / f"{isa}.pt"
        env = dict(os.environ, ADDNORM_CPU_ISA=isa, OMP_NUM_THREADS="2")
        run = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, run.stderr
        res[isa] = torch.load(path)
    return res


def _tensors(v):
    return [t for t in (v if isinstance(v, (tuple, list)) else (v,)) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("isa", ISAS)
def test_outputs_follow_the_formula_as_written(dumps, isa):
    misses = {k: n for k, n in dumps[isa]["literal"].items() if n}
    assert len(dumps[isa]["literal"]) == 72  # 6 widths x 3 kinds of row x 2 offsets x 2 norms
    assert not misses, (dumps[isa]["isa"], misses)


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "avx512"])
def test_every_path_gives_the_same_bits(dumps, isa):
    ref, got = dumps["avx512"]["out"], dumps[isa]["out"]
    assert ref.keys() == got.keys()
    differ = {}
    for key in ref:
        if isa == "baseline" and key.startswith("bwd/"):
            continue  # the portable backward sums a 48-wide row's weight gradients in its own order (float32 steps)
        for i, (a, b) in enumerate(zip(_tensors(ref[key]), _tensors(got[key]), strict=True)):
            ia, ib = (t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32) for t in (a, b))
            if not torch.equal(ia, ib):
                differ[f"{key}[{i}]"] = int((ia != ib).sum())
    assert not differ, (dumps[isa]["isa"], dumps["avx512"]["isa"], len(differ), list(differ.items())[:10])


@pytest.mark.parametrize("isa", ISAS)
def test_the_two_outputs_weight_gradients_alike(dumps, isa):
    """The two-norm parallel form with the same weights and the same gradient on both outputs: dw2 and db2 are dw1's
    and db1's formula over the same values, so the same bits. The second output's sums were a loop of their own, whose
    product gcc regrouped (``dy2 * ((s - mean) * rstd)``), so dw2 parted from dw1 by float32 steps on every path."""
    twins = dumps[isa]["twins"]
    assert len(twins) == 32  # 2 dtypes x 4 widths x 2 offsets x 2 norms
    differ = {}
    for key, grads in twins.items():
        half = len(grads) // 2
        for i in range(half):
            if not torch.equal(grads[i].view(torch.int32), grads[half + i].view(torch.int32)):
                differ[f"{key}[{i}]"] = int((grads[i] != grads[half + i]).sum())
    assert not differ, (dumps[isa]["isa"], differ)
