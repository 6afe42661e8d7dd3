"""The checks of a residual connection: is the input added back, and where does the norm sit?

Told from behaviour, with the sublayer's output ``s`` chosen by the check (given as a tensor, returned by a
sublayer the check passes in, or put in place of a block's own sublayer's output):

    x + s                      adds the input (no norm, or pre-norm: x + sublayer(Norm(x)))
    Norm(x + s)                post-norm: the output depends on x + s only
    (Norm(x + s), x + s)       a fused Add & Norm (addnorm.nn.AddRMSNorm): the normed sum and the sum
    x + Norm(s)                the sublayer's output normalized, then added (sandwich / Peri-LN)

Where a norm is found, its own checks follow (``the norm: ...``). The mistakes named: the input not added (the
output depends on s only), the sublayer's output not added (on x only), the norm on the residual path
(Norm(x) + s). Anything else is "not judged".
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .adapters import Adapted, adapt, norm_inside
from .norm import check_norm
from .result import CheckResult, not_judged

ADDS = "adds the input: y = x + sublayer_output"
PREFIX = "the norm: "


def _close(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(b).max()))


class _Sublayer:
    """The sublayer the check passes in: returns the chosen output, remembers what it was given."""

    def __init__(self, out):
        self.out, self.seen = out, None

    def __call__(self, v):
        self.seen = np.asarray(v, dtype=np.float64)
        return self.out


def _runner(a: Adapted):
    """g(x, s) -> (outputs, the sublayer's input or None)."""
    def g(x, s):
        if a.second == "sublayer":
            sub = _Sublayer(s)
            return a.call(x, sub), sub.seen
        return a.call(x, s), None

    return g


def _normalizes(y) -> bool:
    """Rows of mean 0 and std 1 (a LayerNorm's) or of RMS 1 (an RMSNorm's), at unit scale."""
    std, rms = y.std(-1), np.sqrt((y * y).mean(-1))
    return bool((np.abs(y.mean(-1)).max() < 1e-2 and np.abs(std - 1).max() < 2e-2) or np.abs(rms - 1).max() < 2e-2)


def check_residual(a: Adapted, d: int) -> list[CheckResult]:
    g = _runner(a)
    rng = np.random.default_rng(7)
    x = np.random.default_rng(6).normal(5.0, 10.0, size=(2, 8, d))
    s, s2, x2 = rng.normal(size=(2, 8, d)), rng.normal(size=(2, 8, d)), rng.normal(-3.0, 4.0, size=(2, 8, d))
    try:
        outs, seen = g(x, s)
    except Exception as e:  # noqa: BLE001 - the user's code may raise anything
        how = "f(x, sublayer)" if a.second == "sublayer" else "f(x, sublayer_output)"
        return [CheckResult("runs", False, f"{type(e).__name__}: {e}", f"call it as {how}")]
    y = outs[0]
    res = [CheckResult("runs", True, f"{a.description} on two inputs of shape {x.shape}")]
    ok_shape = y.shape == x.shape
    res.append(CheckResult("preserves shape", ok_shape, f"{x.shape} -> {y.shape}"))
    if not ok_shape:
        return res
    zero = np.zeros_like(x)
    at_sum = g(x + s, zero)[0][0]  # Norm(x + s), for a norm that sees only the sum
    only_s = _close(y, g(x2, s)[0][0])
    only_x = _close(y, g(x, s2)[0][0])
    post = "sublayer(x)" if a.second == "sublayer" else "sublayer_output"
    if _close(y, x + s):
        if seen is not None and not _close(seen, x) and _normalizes(seen):
            return res + [CheckResult("adds the input: y = x + sublayer(Norm(x)) (pre-norm)", True,
                                      "max |y - (x + s)| " + f"{np.abs(y - x - s).max():.2e}")] + _pre_norm_part(a, d)
        return res + [CheckResult(ADDS, True, f"max |diff| {np.abs(y - (x + s)).max():.2e}")]
    if len(outs) > 1 and _close(outs[1], x + s) and _close(y, at_sum):
        return res + [CheckResult("adds the input, returns the sum and its norm: (Norm(x + residual), x + residual)", True,
                                  "a fused Add & Norm")] + _part(a, d, "sum")
    if _close(y, at_sum) and not only_x and not only_s:
        return res + [CheckResult(f"adds the input, then normalizes (post-norm): y = Norm(x + {post})", True,
                                  "the output depends on x + s only")] + _part(a, d, "sum")
    if only_s and only_x:
        return res + [CheckResult(ADDS, False, "the output depends on neither input")]
    if only_s:
        normed = not _close(y, s)
        detail = "the output depends on the sublayer's output only" + (", normalized" if normed else ": y = s")
        hint = ("the residual is missing: add the input before the norm: "
                + ("return self.norm(x + sublayer(x))" if a.second == "sublayer" else
                   "return self.norm(x + sublayer_output)") if normed and (seen is None or _close(seen, x)) else
                "the residual is missing: return x + sublayer(self.norm(x))" if a.second == "sublayer" else
                "the residual is missing: return x + sublayer_output (the input must be added back)")
        return res + [CheckResult(ADDS, False, detail, hint)]
    if only_x:
        return res + [CheckResult("adds the sublayer's output", False, "the output depends on x only",
                                  "the sublayer's output is dropped: return x + sublayer_output")]
    if _close(y - x, g(x2, s)[0][0] - x2) and _normalizes(y - x):
        return res + [CheckResult(ADDS.replace("x + sublayer_output", "x + Norm(sublayer_output)"), True,
                                  "the sublayer's output is normalized, then added (sandwich / Peri-LN)")]
    if _close(y - s, g(x, s2)[0][0] - s2) and _normalizes(y - s):
        return res + [CheckResult(ADDS, False, "y = Norm(x) + sublayer_output: the residual path itself is normalized",
                                  "keep the residual path as it is: normalize the sublayer's input "
                                  "(pre-norm: x + sublayer(Norm(x))) or the sum (post-norm: Norm(x + sublayer(x)))")]
    return res + [not_judged("adds the input", "not judged: the output is none of x + s, Norm(x + s), "
                                               "(Norm(x + s), x + s), x + Norm(s)")]


def _part(a: Adapted, d: int, where: str) -> list[CheckResult]:
    """The norm's own checks: of its norm submodule where it has one, else of v -> f(v, 0) (Norm(v + 0))."""
    inner = _norm_module(a)
    if inner is not None:
        return check_norm(adapt(inner, d), d, PREFIX)
    def zero(v):
        return _Sublayer(np.zeros_like(v)) if a.second == "sublayer" else np.zeros_like(v)

    part = replace(a, description=f"{a.description}, with a zero sublayer output", second="",
                   call=lambda v: a.call(v, zero(v)), torch_forward=_with_zero_residual(a))
    return check_norm(part, d, PREFIX)


def _with_zero_residual(a: Adapted):
    import torch

    def forward(t):
        out = a.module(t, torch.zeros_like(t))
        return out[0] if isinstance(out, tuple | list) else out

    return forward if a.module is not None and a.second == "tensor" else None


def _pre_norm_part(a: Adapted, d: int) -> list[CheckResult]:
    inner = _norm_module(a)
    if inner is not None:
        return check_norm(adapt(inner, d), d, PREFIX)

    def seen(v):
        sub = _Sublayer(np.zeros_like(v))
        a.call(v, sub)
        return (sub.seen,)

    return check_norm(replace(a, description=f"{a.description}, what its sublayer is given", second="", call=seen,
                              torch_forward=None), d, PREFIX)


def _norm_module(a: Adapted):
    """The one norm submodule of a module (a wrapper's or a block's), or None (it is the norm, or has several)."""
    return None if a.module is None else norm_inside(a.module)
