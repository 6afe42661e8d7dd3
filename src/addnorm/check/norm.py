"""The checks of a norm: it runs, keeps the shape, normalizes each position on its own, matches the float64 oracle
at its own eps, applies its scale (and shift) and has torch's gradients.

What it is meant to be (LayerNorm or RMSNorm) is told by its name ("rms", "layer") or a shift parameter, else by
how it behaves; where neither tells, the checks that depend on it say "not judged". The formula is compared at
unit scale and zero shift, whatever convention stores them: the weight may be applied as ``w`` or as ``1 + w``
(Gemma's zero-centred weight, which starts at zeros), and the checks find out which by setting it.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from . import formulas
from .adapters import Adapted
from .result import CheckResult, not_judged

SHAPE = (2, 8, 768)  # seed 004's test shape


def _wild(shape, seed=0):
    return np.random.default_rng(seed).normal(5.0, 10.0, size=shape)


def _small_variance(eps: float) -> float:
    """10 eps: where eps shows (inside or outside the root, or missing: about 5 % apart), which N(5, 10)'s variance
    of 100 hides under any tolerance; 1e-8 for eps = 0, where an eps hard-coded as small as 1e-10 still shows."""
    return 10.0 * eps if eps > 0 else 1e-8


def _small(shape, eps, seed=7):
    """Rows centred at 0 of variance _small_variance(eps)."""
    return np.random.default_rng(seed).normal(0.0, np.sqrt(_small_variance(eps)), size=shape)


@dataclass
class Affine:
    scale0: np.ndarray | None  # as stored, at init
    shift0: np.ndarray | None
    offset: float  # the weight is applied as offset + w: 0 (torch, Llama) or 1 (Gemma)
    scale_used: bool  # False: setting the weight changes nothing

    @property
    def any(self) -> bool:
        return self.scale0 is not None or self.shift0 is not None


@contextmanager
def _params(a: Adapted, aff: Affine, scale_eff=None, shift=None):
    """The implementation at effective scale ``scale_eff`` (default 1) and shift (default 0), restored after."""
    if aff.any:
        d = len(aff.scale0 if aff.scale0 is not None else aff.shift0)
        s = np.ones(d) if scale_eff is None else scale_eff
        a.set_affine(s - aff.offset if aff.scale0 is not None else None,
                     (np.zeros(d) if shift is None else shift) if aff.shift0 is not None else None)
    try:
        yield
    finally:
        if aff.any:
            a.set_affine(aff.scale0, aff.shift0)


def _probe_affine(a: Adapted, x) -> Affine:
    scale0, shift0 = a.get_affine()
    aff = Affine(scale0, shift0, 0.0, True)
    if scale0 is None:
        return aff
    zero_shift = np.zeros_like(shift0) if shift0 is not None else None
    try:
        a.set_affine(np.zeros_like(scale0), zero_shift)
        at0 = a.first(x)
        a.set_affine(np.ones_like(scale0), zero_shift)
        at1 = a.first(x)
    finally:
        a.set_affine(scale0, shift0)
    big = max(np.abs(at1).max(), 1e-30)
    if np.abs(at0).max() <= 1e-6 * big:
        return aff  # y = w * x_hat (+ b)
    if np.abs(at1 - at0).max() <= 1e-6 * big:
        return Affine(scale0, shift0, 0.0, False)  # the weight is not used
    return Affine(scale0, shift0, 1.0, True)  # y = (1 + w) * x_hat: zeros give x_hat


def intended_kind(name: str, has_shift: bool) -> str | None:
    """What its name says it is ("rms", "layer"), or a shift parameter (RMSNorm has none); None: nothing says."""
    n = name.lower()
    if "rms" in n:
        return "rms"
    if "layer" in n or n in ("ln", "layernorm"):
        return "layer"
    return "layer" if has_shift else None


def _centred(y) -> bool:
    return bool(np.abs(y.mean(-1)).max() < 0.05 * max(np.median(y.std(-1)), 1e-30))


def check_norm(a: Adapted, d: int, name_prefix: str = "") -> list[CheckResult]:
    def R(name, ok, detail="", hint=""):
        return CheckResult(name_prefix + name, ok, detail, hint)

    res: list[CheckResult] = []
    x = _wild(SHAPE[:-1] + (d,))
    try:
        y = a.first(x)
        res.append(R("runs", True, f"{a.description} on input of shape {x.shape}"))
    except Exception as e:  # noqa: BLE001 - the user's code may raise anything
        return [R("runs", False, f"{type(e).__name__}: {e}", "make it accept a (batch, seq, features) tensor")]
    if y.shape != x.shape:
        return res + [R("preserves shape", False, f"{x.shape} -> {y.shape}",
                        "normalize over the last dimension and keep every dimension (keepdim=True)")]
    res.append(R("preserves shape", True, f"{x.shape} -> {y.shape}"))
    if not np.isfinite(y).all():
        return res + [R("finite output", False, "NaN or Inf in the output on rows of mean 5 and std 10",
                        "look for a division by zero or the root of a negative number")]
    aff = _probe_affine(a, x)

    def core(v):
        with _params(a, aff):
            return a.first(v)

    yc = core(x)
    eps_values = (a.eps,) if a.eps is not None else formulas.CONVENTIONAL_EPS

    def pairs_at(eps):
        xs = _small((2, 4, d), eps)
        return [(yc, x), (core(xs), xs)]

    res.append(_check_positions_independent(a, d, name_prefix))
    kind, told, (eps, ok, mistake, fix), said = _kind_and_verdict(a, aff, x, yc, pairs_at, eps_values, name_prefix)
    res += said
    if kind is None:
        mean, rms = np.abs(yc.mean(-1)).max(), np.sqrt((yc * yc).mean(-1))
        return res + [not_judged(name_prefix + "is a LayerNorm or an RMSNorm",
                                 f"not judged: neither its name nor its output tells (rows come out with |mean| up to "
                                 f"{mean:.3g} and RMS in [{rms.min():.3g}, {rms.max():.3g}]: neither a LayerNorm's nor "
                                 "an RMSNorm's, nor a known mistake of one); name it LayerNorm or RMSNorm to judge it "
                                 "as one")]
    res.append(_check_normalizes(yc, kind, aff, name_prefix, fix if mistake else ""))
    note = a.eps_note or ("" if a.eps is not None else
                          "not declared: measured from its output" if ok else "not declared: assumed")
    torch_name = "torch.nn.RMSNorm" if kind == "rms" else "torch.nn.LayerNorm"
    title = (f"matches the float64 oracle and {torch_name} (eps={eps:g}{'; ' + note if note else ''}; "
             f"rows of variance 100 and {_small_variance(eps):g})")
    err = max(np.nan_to_num(np.abs(yy - formulas.reference(kind, xx, eps)), nan=np.inf).max() for yy, xx in pairs_at(eps))
    if ok:
        res.append(R(title, True, f"{kind_word(kind)}, told {told}; max |diff| {err:.2e}"))
    else:
        default = ("compare with x / sqrt(mean(x^2) + eps) * weight" if kind == "rms" else
                   "compare with (x - mean) / sqrt(var(unbiased=False) + eps) * weight + bias")
        res.append(R(title, False, f"{kind_word(kind)}, told {told}; max |diff| {err:.3g}"
                     + (f": looks like {mistake}" if mistake else ""), fix or default))
    res += _check_affine(a, d, x, aff, kind, eps, name_prefix)
    if ok and a.torch_forward is not None:
        res.append(_check_gradients(a, d, eps, kind, aff, name_prefix))
    return res


def _kind_and_verdict(a: Adapted, aff: Affine, x, yc, pairs_at, eps_values, prefix: str):
    """(kind or None, how it was told, the formula's verdict, results to show first): what it is meant to be, from
    its name, else from a bias, else from the family whose formula or known mistake its outputs match."""
    kind = intended_kind(a.name, aff.shift0 is not None)
    told = "by its name" if kind and intended_kind(a.name, False) else "by its shift (bias)" if kind else ""
    if kind is None:
        order = ("layer", "rms") if _centred(yc) else ("rms", "layer")
        kind = next((k for k in order if formulas.fit_eps(k, pairs_at, eps_values) is not None), None)
        kind = kind or next((k for k in order for e in eps_values if formulas.diagnose(k, pairs_at(e), (e,))[0]), None)
        told = "by its behaviour"
    if kind is None:
        return None, told, (eps_values[0], False, "", ""), []
    verdict = _formula_verdict(a, kind, pairs_at, eps_values)
    eps, ok, mistake, _ = verdict
    if told == "by its shift (bias)" and not ok and not mistake:
        # a bias alone says LayerNorm weakly (DyT has one too): judged only if it is a LayerNorm with gamma and
        # beta swapped (a constant at unit scale, so no formula matches)
        if not any("swapped" in r.hint for r in _check_affine(a, x.shape[-1], x, aff, kind, eps, prefix)):
            return None, told, verdict, []
    if kind == "layer" and aff.shift0 is None and mistake == formulas.RMS_UNDER_LAYER_NAME:
        # an exact RMSNorm under a LayerNorm's name: T5's convention (T5LayerNorm), or a LayerNorm that forgot the
        # mean; no bias to tell which, so it is judged as the RMSNorm it computes and the name is not judged
        said = not_judged(prefix + "is the LayerNorm its name says",
                          "not judged: it computes an RMSNorm exactly, as T5LayerNorm does by design; right if meant "
                          "as one, while a LayerNorm subtracts the mean: (x - mean) / sqrt(var + eps)")
        return "rms", "by its behaviour", _formula_verdict(a, "rms", pairs_at, eps_values), [said]
    return kind, told, verdict, []


def _formula_verdict(a: Adapted, kind: str, pairs_at, eps_values) -> tuple[float, bool, str, str]:
    """(eps, matches, mistake, remedy): the eps it computes with (its own, or the first conventional one that fits
    where it declares none), whether the correct formula gives its outputs there, else the mistake that does."""
    eps = formulas.fit_eps(kind, pairs_at, eps_values)
    if eps is not None:
        return eps, True, "", ""
    mistake, fix = next((m for e in eps_values if (m := formulas.diagnose(kind, pairs_at(e), (e,)))[0]), ("", ""))
    if not mistake and a.eps is not None:
        other = formulas.fit_eps(kind, pairs_at, [e for e in formulas.CONVENTIONAL_EPS if e != a.eps])
        if other is not None:
            mistake, fix = f"it computes with eps={other:g}, not its own eps={a.eps:g}", "pass its own eps to the formula"
    return eps_values[0], False, mistake, fix


def kind_word(kind: str) -> str:
    return "an RMSNorm" if kind == "rms" else "a LayerNorm"


def _check_normalizes(yc, kind, aff: Affine, prefix: str, fix: str) -> CheckResult:
    """``fix``: the remedy of the mistake the formula check named, the hint here too (the generic one would send an
    unbiased variance, which reduces over the right axis, looking for the axis)."""
    if kind == "rms":
        rms = np.sqrt((yc * yc).mean(-1))
        ok = bool(np.abs(rms - 1).max() < 1e-2)
        return CheckResult(prefix + "normalizes each position (RMS ≈ 1)", ok, f"RMS in [{rms.min():.4f}, {rms.max():.4f}]",
                           "" if ok else fix or "divide each position by the root of its mean square: "
                                                "x / sqrt(x.pow(2).mean(-1, keepdim=True) + eps)")
    mean, std = yc.mean(-1), yc.std(-1)
    ok = bool(np.abs(mean).max() < 1e-3 and np.abs(std - 1).max() < 1e-2)
    hint = fix or "compute mean and std over the last dim (features) of each position"
    if not ok and std.max() < 1e-6 and aff.shift0 is not None:
        hint = "every position comes out constant: at init bias is 0, so gamma (weight) and beta (bias) look swapped"
    return CheckResult(prefix + "normalizes each position (mean ≈ 0, std ≈ 1)", ok,
                       f"|mean| ≤ {np.abs(mean).max():.2e}, std in [{std.min():.4f}, {std.max():.4f}]", "" if ok else hint)


def _check_positions_independent(a: Adapted, d: int, prefix: str = "") -> CheckResult:
    """Change every other position (in the batch, then in the same sequence): this one's output must not move."""
    x = _wild((4, 6, d), 1)
    y = a.first(x)
    other_items, other_positions = x.copy(), x.copy()
    other_items[1:] = _wild((3, 6, d), 2) * 3 - 7
    other_positions[0, 1:] = _wild((5, d), 3) * 3 - 7
    by_batch = max(np.abs(a.first(other_items)[0] - y[0]).max(), np.abs(a.first(x[:1])[0] - y[0]).max())
    by_sequence = np.abs(a.first(other_positions)[0, 0] - y[0, 0]).max()
    name = prefix + "each position is normalized on its own (other batch items don't matter)"
    detail = (f"max change of one position's output when the rest of the batch changes: {by_batch:.2e}, "
              f"when the rest of its sequence changes: {by_sequence:.2e}")
    tol = 1e-5 * max(1.0, np.abs(y[0]).max())  # float32 rounding moves with the batch's size in a matmul, not more
    if by_batch >= tol:
        return CheckResult(name, False, detail, "statistics are being taken across the batch (BatchNorm-like): "
                                                "reduce over the last dim only, e.g. x.mean(-1, keepdim=True)")
    if by_sequence >= tol:
        return CheckResult(name, False, detail, "statistics are being taken over the sequence axis (dim 1), not the "
                                                "features: reduce over the last dim only, e.g. x.mean(-1, keepdim=True)")
    return CheckResult(name, True, detail)


def _check_affine(a: Adapted, d: int, x, aff: Affine, kind: str, eps: float, prefix: str) -> list[CheckResult]:
    """Nothing to check where it has no weight or bias (as elementwise_affine=False): that is no mistake."""
    if not aff.any:
        return []
    out = []
    s0 = None if aff.scale0 is None else aff.scale0 + aff.offset
    stored = " (stored as w, applied as 1 + w: zero-centred, as Gemma)" if aff.offset else ""
    init_ok = (s0 is None or np.allclose(s0, 1)) and (aff.shift0 is None or np.allclose(aff.shift0, 0))
    out.append(CheckResult(prefix + "scale starts at ones, shift at zeros", bool(init_ok),
                           stored.strip(" ()") if init_ok else
                           f"scale mean {np.mean(s0) if s0 is not None else 1:.3g}, "
                           f"shift mean {np.mean(aff.shift0) if aff.shift0 is not None else 0:.3g}{stored}",
                           "" if init_ok else "initialize weight (gamma) to ones and bias (beta) to zeros"))
    title = ("applies scale then shift: y = gamma * x_hat + beta" if aff.shift0 is not None else
             f"applies the weight: y = {'(1 + weight)' if aff.offset else 'weight'} * x_hat")
    if not aff.scale_used:
        return out + [CheckResult(prefix + title, False, "changing the weight does not change the output",
                                  "multiply the normalized x by the weight: return self.weight * x_hat")]
    g = np.random.default_rng(3)
    scale, shift = 1.5 + g.random(d), g.normal(size=d) + 2.0
    with _params(a, aff):
        own = a.first(x)
    with _params(a, aff, scale if aff.scale0 is not None else None, shift):
        y = a.first(x)
    s = scale if aff.scale0 is not None else 1.0
    b = shift if aff.shift0 is not None else 0.0
    # x_hat: its own normalized x (only the scale and shift are judged here, a wrong formula is told above), or the
    # oracle's where its own is no normalized x at all (gamma and beta swapped give a constant at unit scale)
    xhats = (own, formulas.reference(kind, x, eps))
    err = min(np.abs(y - (xhat * s + b)).max() for xhat in xhats)
    if err < 1e-3 * np.abs(xhats[1] * s + b).max():
        return out + [CheckResult(prefix + title, True, f"max |diff| {err:.2e}")]
    swapped = xhats[1] * b + s if aff.shift0 is not None else None
    if swapped is not None and np.abs(y - swapped).max() < 1e-3 * np.abs(swapped).max():
        return out + [CheckResult(prefix + title, False, "the output is beta * x_hat + gamma",
                                  "gamma (weight) and beta (bias) are swapped: return self.weight * x_hat + self.bias")]
    return out + [CheckResult(prefix + title, False, f"max |diff| {err:.3g}",
                              "multiply the normalized x by weight (gamma), then add bias (beta)")]


def _check_gradients(a: Adapted, d: int, eps, kind, aff: Affine, prefix: str) -> CheckResult:
    """dx against autograd through the float64 formula, at its own scale and shift."""
    import torch

    x = torch.tensor(_wild((2, 5, d), 4), dtype=torch.float32, requires_grad=True)
    dy = torch.randn(2, 5, d, generator=torch.Generator().manual_seed(5))
    try:
        out = a.torch_forward(x)
        (gx,) = torch.autograd.grad(out, x, dy)
    except Exception as e:  # noqa: BLE001
        return CheckResult(prefix + "gradients match torch", False, f"{type(e).__name__}: {e}",
                           "use differentiable torch operations (no .item(), .numpy() or in-place on the input)")
    x64 = x.detach().double().requires_grad_(True)
    if kind == "rms":
        ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    else:
        ref = torch.nn.functional.layer_norm(x64, (d,), eps=eps)
    if aff.scale0 is not None:
        ref = ref * torch.as_tensor(aff.scale0 + aff.offset)
    if aff.shift0 is not None:
        ref = ref + torch.as_tensor(aff.shift0)
    (gref,) = torch.autograd.grad(ref, x64, dy.double())
    err = (gx.double() - gref).abs().max().item()
    ok = err <= 1e-4 * max(1.0, gref.abs().max().item())
    return CheckResult(prefix + "gradients match torch", ok, f"max |dx - dx_torch| {err:.2e}",
                       "" if ok else f"the forward matches {kind_word(kind)} but its gradient does not: a custom "
                                     "backward (or a detach) is wrong")
