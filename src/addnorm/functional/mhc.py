"""mHC's pre step as one function, on the backend ``functional.core`` picks (``use_backend`` / ``backend=``):

    mhc_pre(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms=None, convention=None)
        -> (h, H_pre, H_post, H_res): mHC's (or mHC-lite's) coefficients from the RMS-normed vec(X) and its
           projection phi, and h = H_pre X, in one pass over the widened stream X (..., n, C); ``convention``
           (``MhcConvention``) where a model departs from the paper's equations (DeepSeek-V4's)

mHC and mHC-lite (``addnorm.model.streams``) read each sub-layer's input with it; the stream's write is
``functional.stream.stream_write``, whose ``q`` is the statistic the next projection's RMS of vec(X') needs.
"""

from __future__ import annotations

import math

import torch

from ..ops import plain
from ..ops.mhc import formulas as mf
from ..ops.mhc.autograd import DirectMhcPre, TritonMhcPre
from ..ops.mhc.convention import PAPER, MhcConvention
from ..ops.mhc.schema import CPU as MHC_CPU
from ..ops.mhc.schema import TRITON as MHC_TRITON
from ..ops.norm.autograd import c_apply as _c_apply
from . import core

__all__ = ["MhcConvention", "mhc_pre"]

_MHC = {"cpu": _c_apply(DirectMhcPre), "triton": _c_apply(TritonMhcPre)}
_MHC_IMPL = {"cpu": MHC_CPU[0], "triton": MHC_TRITON[0]}


def _check_convention(convention, perms) -> MhcConvention:
    if convention is None:
        return PAPER
    if not isinstance(convention, MhcConvention):
        raise TypeError(f"convention must be an addnorm.functional.MhcConvention or None, got "
                        f"{type(convention).__name__}")
    if perms is not None and (convention.sinkhorn_eps or convention.res_transposed):
        raise ValueError(f"convention {convention} sets how Sinkhorn-Knopp makes H_res, but perms (mHC-lite) mixes "
                         f"permutations instead: pass perms=None, or a convention with sinkhorn_eps=0 and "
                         f"res_transposed=False")
    return convention


def _check_mhc(x, phi, coeffs, perms, eps, iters):
    core.check_float_tensor("x", x)
    if x.dim() < 2:
        raise ValueError(f"x must be a widened stream (..., n, C), got shape {tuple(x.shape)}")
    n, C = x.shape[-2], x.shape[-1]
    if n < 1:
        raise ValueError(f"x must hold at least one stream (..., n >= 1, C), got shape {tuple(x.shape)}")
    if C < 1:
        raise ValueError(f"x must have at least one channel (..., n, C >= 1): the RMS of an empty vec(X) is "
                         f"undefined, got shape {tuple(x.shape)}")
    if perms is not None:
        core.check_float_tensor("perms", perms)
        if perms.dim() != 3 or tuple(perms.shape[1:]) != (n, n) or perms.shape[0] < 1:
            raise ValueError(f"perms must be (r, {n}, {n}) permutation matrices for x of shape {tuple(x.shape)}, "
                             f"got {tuple(perms.shape)}")
        # (any (r, n, n) matrices are mixed as given -- mHC-lite's are the n! permutations, and the kernels take
        # only those; other matrices, doubly stochastic ones say, take the formulas)
        if not torch.compiler.is_compiling() and not core.functorch_active():
            core.check_storage("perms", perms)
    r = n * n if perms is None else perms.shape[0]
    core.check_float_tensor("phi", phi)
    if tuple(phi.shape) != (n * C, 2 * n + r):
        raise ValueError(f"phi must have shape {(n * C, 2 * n + r)} (nC, 2n + {'n^2' if perms is None else 'r'}) for x "
                         f"of shape {tuple(x.shape)}, got {tuple(phi.shape)}")
    # name: (elements, what they are); b_res's shape is free ((n, n) for mHC, flat for mHC-lite)
    spec = {"a_pre": (1, "a scalar"), "a_post": (1, "a scalar"), "a_res": (1, "a scalar"),
            "b_pre": (n, "one per stream"), "b_post": (n, "one per stream"), "b_res": (r, "one per H_res logit")}
    for name, t in coeffs.items():
        core.check_float_tensor(name, t)
        want, what = spec[name]
        bad_dim = t.dim() > 1 if name.startswith("a_") else name != "b_res" and t.dim() != 1
        if t.numel() != want or bad_dim:
            raise ValueError(f"{name} must have {want} element{'s' if want > 1 else ''} ({what}), "
                             f"got shape {tuple(t.shape)}")
    for name, t in (("phi", phi), *coeffs.items(), *((("perms", perms),) if perms is not None else ())):
        if not (t.is_cpu and x.is_cpu) and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise ValueError(f"iters must be a non-negative int (Sinkhorn-Knopp rounds), got {iters!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
        raise ValueError(f"eps must be a finite non-negative float, got {eps!r}")
    if not torch.compiler.is_compiling() and not core.functorch_active():
        for name, t in (("x", x), ("phi", phi), *coeffs.items()):
            core.check_storage(name, t)


def mhc_pre(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, *, perms=None, eps: float = 1e-6, iters: int = 20,
            convention: MhcConvention | None = None, backend: str | None = None):
    """mHC's pre step (DeepSeek, arXiv:2512.24880, eqs. 7-9) in one pass over the stream X (..., n, C):

        p = (vec(X) phi) / RMS(vec(X)),  H_pre = sigmoid(a_pre p[:n] + b_pre),
        H_post = 2 sigmoid(a_post p[n:2n] + b_post),
        H_res = Sinkhorn-Knopp(a_res mat(p[2n:]) + b_res, iters)   (perms=None)
              = sum_k softmax(a_res p[2n:] + b_res)_k perms[k]     (mHC-lite, arXiv:2601.05732: perms the n!
                                                                    permutation matrices, phi (nC, 2n + n!))
        h = sum_i H_pre[i] X_i

    ``convention`` (``MhcConvention``, the paper's by default) is where a model departs from these: DeepSeek-V4's
    ``MhcConvention.deepseek_v4(hc_eps)`` adds eps to H_pre and in Sinkhorn-Knopp, and transposes H_res's logits.
    Returns (h, H_pre, H_post, H_res): h in X's dtype, the coefficients in float32 (float64 if any input is).
    """
    x, phi = core.uninferred((x, phi), (a_pre, a_post, a_res, b_pre, b_post, b_res))
    coeffs = {"a_pre": a_pre, "a_post": a_post, "a_res": a_res, "b_pre": b_pre, "b_post": b_post, "b_res": b_res}
    conv = _check_convention(convention, perms)
    _check_mhc(x, phi, coeffs, perms, eps, iters)
    which = core.choose_backend(backend, x, tuple(x.shape[-1:]))
    args = (x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, float(eps), int(iters), float(conv.pre_eps),
            float(conv.sinkhorn_eps), conv.res_transposed)
    if which == "torch":
        return mf.pre(*args)[:4]
    if plain(x) and not core.functorch_active():
        if core.any_needs_autograd(x, phi, *coeffs.values()):
            return _MHC[which](*args)[:4]
        return _MHC_IMPL[which](*args)[:4]
    return torch.ops.addnorm.mhc_pre(*args)[:4]  # its Autograd kernel is MhcPre

