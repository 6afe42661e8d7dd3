"""The checks, each a small function: run, shape, normalization, oracle, gradients, row independence,
scale/shift order, initial values -- and for residual implementations, that the input is really added."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..reference import oracle
from .adapters import Adapted, adapt


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str = ""
    hint: str = ""


SHAPE = (2, 8, 768)  # seed 004's test shape


def _wild(shape, seed=0):
    return np.random.default_rng(seed).normal(5.0, 10.0, size=shape)


def _small(shape, eps, seed=7):
    """Rows whose variance is 10 eps, centred at 0: where eps shows (inside or outside the root, or missing: about
    5 % apart), which N(5, 10)'s variance of 100 hides under any tolerance."""
    return np.random.default_rng(seed).normal(0.0, np.sqrt(10.0 * eps), size=shape)


def _layer_candidates(x, eps) -> dict:
    m = x.mean(-1, keepdims=True)
    var_b, var_u = x.var(-1, keepdims=True), x.var(-1, ddof=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return {
            "unbiased std with eps outside the square root (the tutorial form)": (x - m) / (np.sqrt(var_u) + eps),
            "unbiased variance (divides by D-1)": (x - m) / np.sqrt(var_u + eps),
            "eps added outside the square root": (x - m) / (np.sqrt(var_b) + eps),
            "no eps at all": (x - m) / np.sqrt(var_b),
            "RMSNorm (no mean subtraction)": x / np.sqrt((x * x).mean(-1, keepdims=True) + eps),
            "the mean is not subtracted": x / np.sqrt(var_b + eps),
        }


def _rms_candidates(x, eps) -> dict:
    ms = (x * x).mean(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return {
            "no square root (divides by the mean square)": x / (ms + eps),
            "the sum of squares instead of their mean": x / np.sqrt((x * x).sum(-1, keepdims=True) + eps),
            "eps added outside the square root": x / (np.sqrt(ms) + eps),
            "no eps at all": x / np.sqrt(ms),
            "the mean is subtracted (a LayerNorm, not an RMSNorm)":
                (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps),
        }


def _diagnose_formula(pairs, eps, is_rms=False) -> str:
    """Name the known mistake that every (y, x) pair matches, the closest one where several do."""
    best, best_err = "", np.inf
    cands = [(_rms_candidates if is_rms else _layer_candidates)(x, eps) for _, x in pairs]
    for name in cands[0]:
        errs = [np.abs(y - c[name]).max() / max(1.0, np.abs(c[name]).max()) for (y, _), c in zip(pairs, cands)]
        err = max(errs)
        if np.isfinite(err) and err < 1e-4 and err < best_err:
            best, best_err = name, err
    return best


FIX = {  # LayerNorm's mistakes (_layer_candidates), each with its remedy
    "unbiased std with eps outside the square root (the tutorial form)":
        "use the biased variance and put eps inside the root: (x - mean) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)",
    "unbiased variance (divides by D-1)": "use x.var(-1, unbiased=False) (LayerNorm divides by D, not D-1)",
    "eps added outside the square root": "put eps inside the square root: / sqrt(var + eps)",
    "no eps at all": "add eps inside the square root: / sqrt(var + eps)",
    "the mean is not subtracted": "subtract the mean before dividing: (x - mean) / sqrt(var + eps)",
}
RMS_FIX = {  # RMSNorm's (_rms_candidates)
    "no square root (divides by the mean square)": "divide by the root: x / sqrt(mean(x^2) + eps)",
    "the sum of squares instead of their mean": "take the mean of the squares: x.pow(2).mean(-1, keepdim=True)",
    "eps added outside the square root": "put eps inside the square root: / sqrt(mean(x^2) + eps)",
    "no eps at all": "add eps inside the square root: / sqrt(mean(x^2) + eps)",
    "the mean is subtracted (a LayerNorm, not an RMSNorm)": "RMSNorm does not center: x / sqrt(mean(x^2) + eps)",
}


def _unscaled(y, scale0, shift0):
    """The normalized part of y, at the implementation's own affine parameters."""
    y = y - (shift0 if shift0 is not None else 0)
    return y if scale0 is None else y / scale0


def check_norm(a: Adapted, d: int) -> list[CheckResult]:
    res: list[CheckResult] = []
    x = _wild(SHAPE[:-1] + (d,))
    try:
        y = a.call(x)
        res.append(CheckResult("runs", True, f"{a.description} on input of shape {x.shape}"))
    except Exception as e:  # noqa: BLE001 - the user's code may raise anything
        return [CheckResult("runs", False, f"{type(e).__name__}: {e}", "make it accept a (batch, seq, features) tensor")]
    if y.shape != x.shape:
        return res + [CheckResult("preserves shape", False, f"{x.shape} -> {y.shape}",
                                  "normalize over the last dimension and keep every dimension (keepdim=True)")]
    res.append(CheckResult("preserves shape", True, f"{x.shape} -> {y.shape}"))
    if not np.isfinite(y).all():
        return res + [CheckResult("finite output", False, "NaN or Inf in the output", "add eps inside the square root")]
    scale0, shift0 = a.get_affine()
    eps = a.eps if a.eps is not None else 1e-5
    # LayerNorm or RMSNorm? RMSNorm has no shift and does not center its rows: N(5, 10) rows come out with a mean
    # near 0.45 of their spread; a LayerNorm's (or one that forgot only the eps) near 0
    yh = _unscaled(y, scale0, shift0)
    centred = np.abs(yh.mean(-1)).max() < 0.05 * np.median(yh.std(-1))
    is_rms = shift0 is None and not centred
    torch_name = "torch.nn.RMSNorm" if is_rms else "torch.nn.LayerNorm"
    if is_rms:
        rms = np.sqrt((yh * yh).mean(-1))
        ok = np.abs(rms - 1).max() < 1e-2
        res.append(CheckResult("normalizes each position (RMS ≈ 1)", ok, f"RMS in [{rms.min():.4f}, {rms.max():.4f}]",
                               "" if ok else "divide each position by the root of its mean square: "
                                             "x / sqrt(x.pow(2).mean(-1, keepdim=True) + eps)"))
    else:
        mean, std = y.mean(-1), y.std(-1)
        ok = np.abs(mean).max() < 1e-3 and np.abs(std - 1).max() < 1e-2
        hint = "compute mean and std over the last dim (features) of each position"
        if not ok and std.max() < 1e-6 and shift0 is not None:
            hint = "every position comes out constant: at init bias is 0, so gamma (weight) and beta (bias) look swapped"
        res.append(CheckResult("normalizes each position (mean ≈ 0, std ≈ 1)", ok,
                               f"|mean| ≤ {np.abs(mean).max():.2e}, std in [{std.min():.4f}, {std.max():.4f}]",
                               "" if ok else hint))
    # the oracle, at the implementation's own eps: on the wild rows and on rows of variance 10 eps, where eps shows
    def oracle_of(v):
        return oracle.rms_norm(v, scale0, eps) if is_rms else oracle.layer_norm(v, scale0, shift0, eps)

    pairs = [(y, x)]
    err = np.abs(y - oracle_of(x)).max()
    if eps > 0:
        xs = _small((2, 4, d), eps)
        try:
            ys = np.asarray(a.call(xs), dtype=np.float64)
        except Exception as e:  # noqa: BLE001
            ys = np.full(xs.shape, np.nan)
            res.append(CheckResult("runs on rows of small variance", False, f"{type(e).__name__}: {e}"))
        pairs.append((ys, xs))
        with np.errstate(invalid="ignore"):
            err = max(err, np.nan_to_num(np.abs(ys - oracle_of(xs)), nan=np.inf).max())
    tol = 1e-4
    title = f"matches the float64 oracle and {torch_name} (eps={eps:g}; rows of variance 100 and {10 * eps:g})"
    if err <= tol:
        res.append(CheckResult(title, True, f"max |diff| {err:.2e}"))
    else:
        mistake = _diagnose_formula([(_unscaled(yy, scale0, shift0), xx) for yy, xx in pairs], eps, is_rms)
        default = ("compare with x / sqrt(mean(x^2) + eps) * weight" if is_rms else
                   "compare with (x - mean) / sqrt(var(unbiased=False) + eps) * weight + bias")
        res.append(CheckResult(title, False, f"max |diff| {err:.3g}" + (f": looks like {mistake}" if mistake else ""),
                               (RMS_FIX if is_rms else FIX).get(mistake, default)))
    res.append(_check_rows_independent(a, d))
    res += _check_affine(a, d, x, eps, is_rms)
    if a.torch_module is not None:
        res.append(_check_gradients(a, d, eps, is_rms))
    return res


def _check_rows_independent(a: Adapted, d: int) -> CheckResult:
    x = _wild((4, 6, d), 1)
    y = a.call(x)
    x2 = x.copy()
    x2[1:] = _wild((3, 6, d), 2) * 3 - 7  # change every other sequence in the batch
    y2 = a.call(x2)
    alone = a.call(x[:1])
    diff = max(np.abs(y2[0] - y[0]).max(), np.abs(alone[0] - y[0]).max())
    ok = diff < 1e-5
    return CheckResult("each position is normalized on its own (other batch items don't matter)", ok,
                       f"max change of one sequence's output when the rest of the batch changes: {diff:.2e}",
                       "" if ok else "statistics are being taken across the batch (BatchNorm-like): "
                                     "reduce over the last dim only, e.g. x.mean(-1, keepdim=True)")


def _check_affine(a: Adapted, d: int, x, eps, is_rms) -> list[CheckResult]:
    scale0, shift0 = a.get_affine()
    out = []
    if scale0 is None and shift0 is None:
        return [CheckResult("has learnable scale and shift", False, "no weight/gamma or bias/beta found",
                            "add self.weight = ones(d) (gamma) and self.bias = zeros(d) (beta)")]
    init_ok = (scale0 is None or np.allclose(scale0, 1)) and (shift0 is None or np.allclose(shift0, 0))
    out.append(CheckResult("scale starts at ones, shift at zeros", init_ok,
                           "" if init_ok else f"scale mean {np.mean(scale0):.3g}, shift mean {np.mean(shift0) if shift0 is not None else 0:.3g}",
                           "" if init_ok else "initialize weight (gamma) to ones and bias (beta) to zeros"))
    g = np.random.default_rng(3)
    scale, shift = 1.5 + g.random(d), g.normal(size=d) + 2.0
    a.set_affine(scale, shift if shift0 is not None else None)
    try:
        y = a.call(x)
    finally:
        a.set_affine(scale0, shift0)
    xhat = oracle.rms_norm(x, None, eps) if is_rms else oracle.layer_norm(x, None, None, eps)
    want = xhat * scale + (shift if shift0 is not None else 0)
    swapped = xhat * shift + scale if shift0 is not None else None
    err = np.abs(y - want).max()
    if err < 1e-3 * np.abs(want).max():
        out.append(CheckResult("applies scale then shift: y = gamma * x_hat + beta", True, f"max |diff| {err:.2e}"))
    elif swapped is not None and np.abs(y - swapped).max() < 1e-3 * np.abs(swapped).max():
        out.append(CheckResult("applies scale then shift: y = gamma * x_hat + beta", False,
                               "the output is beta * x_hat + gamma", "gamma (weight) and beta (bias) are swapped: "
                               "return self.weight * x_hat + self.bias"))
    else:
        out.append(CheckResult("applies scale then shift: y = gamma * x_hat + beta", False, f"max |diff| {err:.3g}",
                               "multiply the normalized x by weight (gamma), then add bias (beta)"))
    return out


def _check_gradients(a: Adapted, d: int, eps, is_rms) -> CheckResult:
    import torch

    m = a.torch_module
    x = torch.tensor(_wild((2, 5, d), 4), dtype=torch.float32, requires_grad=True)
    ref = (torch.nn.RMSNorm(d, eps=eps) if is_rms else torch.nn.LayerNorm(d, eps=eps))
    with torch.no_grad():
        s0, b0 = a.get_affine()
        if s0 is not None:
            ref.weight.copy_(torch.as_tensor(s0))
        if b0 is not None and getattr(ref, "bias", None) is not None:
            ref.bias.copy_(torch.as_tensor(b0))
    dy = torch.randn(2, 5, d, generator=torch.Generator().manual_seed(5))
    try:
        out = m(x)
        out = out[0] if isinstance(out, tuple) else out
        (gx,) = torch.autograd.grad(out, x, dy)
    except Exception as e:  # noqa: BLE001
        return CheckResult("gradients match torch", False, f"{type(e).__name__}: {e}",
                           "use differentiable torch operations (no .item(), .numpy() or in-place on the input)")
    (gref,) = torch.autograd.grad(ref(x), x, dy)
    err = (gx - gref).abs().max().item()
    ok = err <= 1e-4 * max(1.0, gref.abs().max().item())
    return CheckResult("gradients match torch", ok, f"max |dx - dx_torch| {err:.2e}",
                       "" if ok else "the forward formula differs from LayerNorm's, so its gradient does too")


def check_residual(a: Adapted, d: int) -> list[CheckResult]:
    x = _wild((2, 8, d), 6)
    sub = np.random.default_rng(7).normal(size=(2, 8, d))
    try:
        y = a.call(x, sub)
    except Exception as e:  # noqa: BLE001
        return [CheckResult("runs", False, f"{type(e).__name__}: {e}", "call it as f(x, sublayer_output)")]
    res = [CheckResult("runs", True, f"{a.description} on two inputs of shape {x.shape}")]
    ok_shape = y.shape == x.shape
    res.append(CheckResult("preserves shape", ok_shape, f"{x.shape} -> {y.shape}"))
    if not ok_shape:
        return res
    plain = np.abs(y - (x + sub)).max()
    addnorm = np.abs(y - oracle.layer_norm(x + sub)).max()
    if plain < 1e-4 * np.abs(x).max():
        res.append(CheckResult("adds the input: y = x + sublayer_output", True, f"max |diff| {plain:.2e}"))
    elif addnorm < 1e-3:
        res.append(CheckResult("adds the input and normalizes: y = LayerNorm(x + sublayer_output)", True,
                               f"max |diff| {addnorm:.2e}"))
    else:
        forgot = np.abs(y - sub).max() < 1e-4 * np.abs(sub).max() or np.abs(y - oracle.layer_norm(sub)).max() < 1e-3
        res.append(CheckResult("adds the input: y = x + sublayer_output", False, f"max |y - (x + sublayer_output)| {plain:.3g}",
                               "the residual is missing: return x + sublayer_output (the input must be added back)"
                               if forgot else "return x + sublayer_output"))
    return res


def check_target(target, d: int = 768, extra_adapters=()) -> tuple[Adapted, list[CheckResult]]:
    a = adapt(target, d, extra_adapters)
    if a.n_inputs == 2:
        return a, check_residual(a, d)
    return a, check_norm(a, d)
