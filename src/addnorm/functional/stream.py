"""The widened residual stream's two memory-bound steps as functions, on the backend ``addnorm.functional``
would pick (``use_backend`` / ``backend=``):

    stream_read(x, h_pre)               -> h = H_pre X                     (..., n, C), (..., n) -> (..., C)
    stream_write(x, y, h_post, h_res)   -> (X' = H_res X + H_post^T y, q)   q = sum of squares of each token's X'
    mhc_pre(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms=None)
                                        -> (h, H_pre, H_post, H_res): mHC's (or mHC-lite's) coefficients from the
                                           RMS-normed vec(X) and its projection phi, and h = H_pre X, in one pass

Hyper-connections, mHC and mHC-lite (``addnorm.model.streams``) read each sub-layer's input with the first
and write its output back with the second; ``q`` is the statistic the next mHC projection's RMS of vec(X')
needs. One pass over the stream each way on the "cpu" and "triton" backends; every output rounded once
from float32 sums (eager's batched matmul rounds the products and the add separately).
"""

from __future__ import annotations

import math

import torch

from . import functional as F
from .ops import plain
from .ops.norm.autograd import c_apply as _c_apply
from .ops.stream import formulas as sf
from .ops.stream.autograd import (DirectStreamRead, DirectStreamWrite, TritonStreamRead,
                                  TritonStreamWrite)
from .ops.stream.schema import CPU, TRITON
from .ops.mhc import formulas as mf
from .ops.mhc.autograd import DirectMhcPre, TritonMhcPre
from .ops.mhc.schema import CPU as MHC_CPU, TRITON as MHC_TRITON

__all__ = ["mhc_pre", "stream_read", "stream_write"]


def _tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point or t.dtype not in F.FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (float16, bfloat16, float32, float64), got {t.dtype}")


def _check(x, **coeffs):
    _tensor("x", x)
    if x.dim() < 2:
        raise ValueError(f"x must be a widened stream (..., n, C), got shape {tuple(x.shape)}")
    lead, n = tuple(x.shape[:-2]), x.shape[-2]
    want = {"h_pre": lead + (n,), "h_post": lead + (n,), "h_res": lead + (n, n), "y": lead + (x.shape[-1],)}
    for name, t in coeffs.items():
        _tensor(name, t)
        if tuple(t.shape) != want[name]:
            raise ValueError(f"{name} must have shape {want[name]} for x of shape {tuple(x.shape)}, "
                             f"got {tuple(t.shape)}")
        if not (t.is_cpu and x.is_cpu) and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if "y" in coeffs and coeffs["y"].dtype != x.dtype:
        raise TypeError(f"y dtype {coeffs['y'].dtype} must equal x dtype {x.dtype} (cast the branch output)")
    if not torch.compiler.is_compiling() and not F._functorch_active():
        for name, t in (("x", x), *coeffs.items()):
            F._check_storage(name, t)


def _which(x, backend):
    which = F._resolve(backend, x, tuple(x.shape[-1:]), None)
    F._last["backend"] = which
    return which




_READ = {"cpu": _c_apply(DirectStreamRead), "triton": _c_apply(TritonStreamRead)}
_WRITE = {"cpu": _c_apply(DirectStreamWrite), "triton": _c_apply(TritonStreamWrite)}
_IMPL = {"cpu": CPU, "triton": TRITON}


def _needs(*ts):
    return F._fwad._current_level >= 0 or (torch.is_grad_enabled() and any(t.requires_grad for t in ts))


def stream_read(x, h_pre, *, backend: str | None = None):
    """h = sum_i H_pre[i] X_i: the sub-layer's input read out of the widened stream."""
    x, h_pre = F._uninferred((x, h_pre))
    _check(x, h_pre=h_pre)
    which = _which(x, backend)
    if which == "torch":
        return sf.read(x, h_pre)
    if plain(x) and not F._functorch_active():
        if _needs(x, h_pre):
            return _READ[which](x, h_pre)
        return _IMPL[which][0](x, h_pre)
    return torch.ops.addnorm.stream_read(x, h_pre)  # its Autograd kernel is StreamRead


def stream_write(x, y, h_post, h_res, *, backend: str | None = None):
    """(X', q): X'_i = sum_j H_res[i, j] X_j + H_post[i] y, and q = per-token sum of squares of X'."""
    x, y, h_post, h_res = F._uninferred((x, y, h_post, h_res))
    _check(x, y=y, h_post=h_post, h_res=h_res)
    which = _which(x, backend)
    if which == "torch":
        return sf.write(x, y, h_post, h_res)
    if plain(x) and not F._functorch_active():
        if _needs(x, y, h_post, h_res):
            return _WRITE[which](x, y, h_post, h_res)
        return _IMPL[which][2](x, y, h_post, h_res)
    return torch.ops.addnorm.stream_write(x, y, h_post, h_res)


_MHC = {"cpu": _c_apply(DirectMhcPre), "triton": _c_apply(TritonMhcPre)}
_MHC_IMPL = {"cpu": MHC_CPU[0], "triton": MHC_TRITON[0]}


def _check_mhc(x, phi, coeffs, perms, eps, iters):
    _tensor("x", x)
    if x.dim() < 2:
        raise ValueError(f"x must be a widened stream (..., n, C), got shape {tuple(x.shape)}")
    n, C = x.shape[-2], x.shape[-1]
    if n < 1:
        raise ValueError(f"x must hold at least one stream (..., n >= 1, C), got shape {tuple(x.shape)}")
    if C < 1:
        raise ValueError(f"x must have at least one channel (..., n, C >= 1): the RMS of an empty vec(X) is "
                         f"undefined, got shape {tuple(x.shape)}")
    if perms is not None:
        _tensor("perms", perms)
        if perms.dim() != 3 or tuple(perms.shape[1:]) != (n, n) or perms.shape[0] < 1:
            raise ValueError(f"perms must be (r, {n}, {n}) permutation matrices for x of shape {tuple(x.shape)}, "
                             f"got {tuple(perms.shape)}")
        # (any (r, n, n) matrices are mixed as given -- mHC-lite's are the n! permutations, and the kernels take
        # only those; other matrices, doubly stochastic ones say, take the formulas)
        if not torch.compiler.is_compiling() and not F._functorch_active():
            F._check_storage("perms", perms)
    r = n * n if perms is None else perms.shape[0]
    _tensor("phi", phi)
    if tuple(phi.shape) != (n * C, 2 * n + r):
        raise ValueError(f"phi must have shape {(n * C, 2 * n + r)} (nC, 2n + {'n^2' if perms is None else 'r'}) for x "
                         f"of shape {tuple(x.shape)}, got {tuple(phi.shape)}")
    # name: (elements, what they are); b_res's shape is free ((n, n) for mHC, flat for mHC-lite)
    spec = {"a_pre": (1, "a scalar"), "a_post": (1, "a scalar"), "a_res": (1, "a scalar"),
            "b_pre": (n, "one per stream"), "b_post": (n, "one per stream"), "b_res": (r, "one per H_res logit")}
    for name, t in coeffs.items():
        _tensor(name, t)
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
    if not torch.compiler.is_compiling() and not F._functorch_active():
        for name, t in (("x", x), ("phi", phi), *coeffs.items()):
            F._check_storage(name, t)


def mhc_pre(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, *, perms=None, eps: float = 1e-6, iters: int = 20,
            backend: str | None = None):
    """mHC's pre step (DeepSeek, arXiv:2512.24880, eqs. 7-9) in one pass over the stream X (..., n, C):

        p = (vec(X) phi) / RMS(vec(X)),  H_pre = sigmoid(a_pre p[:n] + b_pre),
        H_post = 2 sigmoid(a_post p[n:2n] + b_post),
        H_res = Sinkhorn-Knopp(a_res mat(p[2n:]) + b_res, iters)   (perms=None)
              = sum_k softmax(a_res p[2n:] + b_res)_k perms[k]     (mHC-lite, arXiv:2601.05732: perms the n!
                                                                    permutation matrices, phi (nC, 2n + n!))
        h = sum_i H_pre[i] X_i

    Returns (h, H_pre, H_post, H_res): h in X's dtype, the coefficients in float32 (float64 if any input is).
    """
    x, phi = F._uninferred((x, phi), (a_pre, a_post, a_res, b_pre, b_post, b_res))
    coeffs = {"a_pre": a_pre, "a_post": a_post, "a_res": a_res, "b_pre": b_pre, "b_post": b_post, "b_res": b_res}
    _check_mhc(x, phi, coeffs, perms, eps, iters)
    which = _which(x, backend)
    args = (x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, float(eps), int(iters))
    if which == "torch":
        return mf.pre(*args)[:4]
    if plain(x) and not F._functorch_active():
        if _needs(x, phi, *coeffs.values()):
            return _MHC[which](*args)[:4]
        return _MHC_IMPL[which](*args)[:4]
    return torch.ops.addnorm.mhc_pre(*args)[:4]  # its Autograd kernel is MhcPre
