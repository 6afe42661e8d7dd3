"""float16 Add & Norm forward on its own loop (``norm_rows.h``'s ``fwd_rows_f16``: bfloat16's specialised loop with
F16C's conversions and a blocked first sum), on every instruction-set path: the new residual stream equal to eager's
``x + r`` to the bit, the output within one float16 ulp of the float64 answer from that stream, eager's answer for a row
holding NaN or inf -- at a narrow row, a row with a tail, a wide row, and a call large enough to stream its outputs
(non-temporal stores). float16 parameters are converted by the picked path's F16C loop (``an_param_f32``)."""

import pytest
import torch

from tests.isa_paths import ISAS, run_under_isa

SCRIPT = r"""
import sys, torch, addnorm
out = sys.argv[-1]
g = torch.Generator().manual_seed(0)
res = {"isa": addnorm.cpu_kernel_availability().isa}
for N, D in ((3, 768), (5, 1000), (2, 65536), (4096, 2048)):
    x = torch.randn(N, D, generator=g).half()
    r = torch.randn(N, D, generator=g).half()
    if N == 5:  # NaN, inf, and a sum that overflows float16
        x[0, 3] = float("nan"); x[1, 7] = float("inf"); x[2, 0] = 60000.0; r[2, 0] = 60000.0
    if N == 2:  # a channel far above the rest
        x[1, 11] = 300.0
    w = (torch.randn(D, generator=g) * 0.5 + 1).half()
    b = (torch.randn(D, generator=g) * 0.1).half()
    with torch.no_grad():
        for kind in ("layer", "rms"):
            if kind == "layer":
                y, s = addnorm.add_layer_norm(x, r, (D,), w, b, 1e-5)
            else:
                y, s = addnorm.add_rms_norm(x, r, (D,), w, 1e-5)
            res[f"{kind}_{N}x{D}"] = (x, r, w, b, y, s)
torch.save(res, out)
"""


def _reference(kind, s, w, b):
    s64, w64, b64 = s.double(), w.double(), b.double()
    if kind == "layer":
        mean = s64.mean(-1, keepdim=True)
        var = ((s64 - mean) ** 2).mean(-1, keepdim=True)
        return (s64 - mean) / torch.sqrt(var + 1e-5) * w64 + b64
    return s64 / torch.sqrt((s64 * s64).mean(-1, keepdim=True) + 1e-5) * w64


@pytest.mark.parametrize("isa", list(ISAS))
def test_float16_forward_is_exact_on_every_path(isa, tmp_path):
    got = run_under_isa(SCRIPT, isa, tmp_path / "f16.pt")
    cases = {name: v for name, v in got.items() if name != "isa"}
    assert len(cases) == 8
    for name, (x, r, w, b, y, s) in cases.items():
        kind = name.split("_")[0]
        assert s.dtype == y.dtype == torch.float16, name
        assert torch.equal(s, x + r) or torch.equal(s.isnan(), (x + r).isnan()) and torch.equal(
            s[~s.isnan()], (x + r)[~s.isnan()]), name
        ref = _reference(kind, s, w, b)
        finite = torch.isfinite(s).all(-1)  # rows with NaN or inf in the stream: eager's answer (NaN, or 0 / inf)
        eager = (torch.nn.functional.layer_norm(s, s.shape[-1:], w, b, 1e-5) if kind == "layer"
                 else torch.nn.functional.rms_norm(s, s.shape[-1:], w, 1e-5))
        assert torch.equal(y[~finite].isnan(), eager[~finite].isnan()), name
        ok = ~y[~finite].isnan()
        assert torch.equal(y[~finite][ok], eager[~finite][ok]), name
        yf, rf = y[finite].double(), ref[finite]
        ulp = torch.finfo(torch.float16).eps * torch.maximum(rf.abs(), torch.tensor(2.0 ** -14, dtype=torch.float64))
        err = ((yf - rf).abs() / ulp).max().item()
        assert err <= 1.0, (name, err)
