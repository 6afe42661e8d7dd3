"""mHC's pre step as one function, on the backend ``functional.core`` picks (``use_backend`` / ``backend=``):

    mhc_pre(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms=None, convention=None)
        -> (h, H_pre, H_post, H_res): mHC's (or mHC-lite's) coefficients from the RMS-normed vec(X) and its
           projection phi, and h = H_pre X, in one pass over the widened stream X (..., n, C); ``convention``
           (``MhcConvention``) where a model departs from the paper's equations (DeepSeek-V4's; HY-V4's read
           without the comb matrix, ``groups=2``)
    mhc_write_pre(x, y, h_post, h_res, phi, ...) -> (X', h, H_pre, H_post, H_res): the write of the stream
           X' = H_res X + H_post^T y (or X + H_post^T y, h_res None) and mhc_pre's read of X' in the same pass

mHC and mHC-lite (``addnorm.model.streams``) read each sub-layer's input with it; the stream's write alone is
``functional.stream.stream_write``.
"""

from __future__ import annotations

import math

import torch

from ..ops import plain
from ..ops.mhc import formulas as mf
from ..ops.mhc import write as mw
from ..ops.mhc.autograd import DirectMhcPre, TritonMhcPre
from ..ops.mhc.convention import PAPER, MhcConvention
from ..ops.mhc.schema import CPU as MHC_CPU
from ..ops.mhc.schema import TRITON as MHC_TRITON
from ..ops.last import LAST
from ..ops.native_nodes import NODES
from ..ops.norm.autograd import c_apply as _c_apply
from . import core

__all__ = ["MhcConvention", "mhc_pre", "mhc_write_pre"]

_MHC = {"cpu": _c_apply(DirectMhcPre), "triton": _c_apply(TritonMhcPre)}
_MHC_IMPL = {"cpu": MHC_CPU[0], "triton": MHC_TRITON[0]}
_WRITE = {"cpu": _c_apply(mw.DirectMhcWritePre), "triton": _c_apply(mw.TritonMhcWritePre)}
_WRITE_IMPL = {"cpu": mw.CPU, "triton": mw.TRITON}


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
    if perms is not None and convention.groups < 3:
        raise ValueError(f"convention {convention} makes no H_res (groups={convention.groups}), but perms (mHC-lite) "
                         f"are H_res's permutations: pass perms=None, or a convention with groups=3")
    return convention


def _check_mhc(x, phi, coeffs, perms, eps, iters, groups=3):
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
    r = 0 if groups < 3 else n * n if perms is None else perms.shape[0]
    m = n if groups == 1 else 2 * n + r
    core.check_float_tensor("phi", phi)
    if tuple(phi.shape) != (n * C, m):
        cols = {1: "n (groups=1)", 2: "2n (groups=2)"}.get(groups, f"2n + {'n^2' if perms is None else 'r'}")
        raise ValueError(f"phi must have shape {(n * C, m)} (nC, {cols}) for x of shape {tuple(x.shape)}, got "
                         f"{tuple(phi.shape)}")
    # name: (elements, what they are); b_res's shape is free ((n, n) for mHC, flat for mHC-lite)
    spec = {"a_pre": (1, "a scalar"), "a_post": (1, "a scalar"), "a_res": (1, "a scalar"),
            "b_pre": (n, "one per stream"), "b_post": (n if groups > 1 else 0, "one per stream"),
            "b_res": (r, "one per H_res logit")}
    for name, t in coeffs.items():
        core.check_float_tensor(name, t)
        want, what = spec[name]
        bad_dim = t.dim() > 1 if name.startswith("a_") else name != "b_res" and t.dim() != 1
        if t.numel() != want or bad_dim:
            what = what if want else f"groups={groups} makes no {'H_post' if name == 'b_post' else 'H_res'}"
            raise ValueError(f"{name} must have {want} element{'' if want == 1 else 's'} ({what}), "
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


def run_fast(backend, entry: str, *args):
    """A widened-stream C++ entry's result (``kernels/cpu/autograd_nodes.cpp``: ``fast_mhc``, ``fast_stream_read``,
    ``fast_stream_write``, ``fast_hyper_read``, ``fast_hyper_gated``), recorded as run on the CPU; None where the
    entries may not be asked (not built, a compiler, transform, dispatch mode or tracer, another backend) or the entry
    declines -- it checks the tensors and numbers itself and declines where anything is not the plain call (for the
    hyper entries, where a gradient is wanted: ``fast_mhc``'s read and the stream's read and write then make a C++
    autograd node), which then takes the general path (and its errors)."""
    if NODES is None or not core.cpp_fast_ok(backend):
        return None
    r = getattr(NODES, entry)(*args)
    if r is not None:
        LAST["backend"] = "cpu"
    return r


def run_pre(which: str, args: tuple) -> tuple:
    """mhc_pre's outputs (six from the formulas, seven with the state from the operator; callers take the first
    four) from its operator's arguments on backend ``which``: the formulas for "torch", else the
    chosen kernels (directly where nothing stands between the tensors and them, through the operator elsewhere)."""
    if which == "torch":
        return mf.pre(*args)
    # through the operator its Autograd kernel is MhcPre
    return run_direct(_MHC[which], _MHC_IMPL[which], torch.ops.addnorm.mhc_pre, args, args[:8])


def run_direct(direct, impl, op, args: tuple, tensors: tuple):
    """An operator's call on a kernel backend: where nothing stands between the tensors and the kernels (plain
    tensors, no functorch transform), its autograd node ``direct`` when a gradient may be asked for through
    ``tensors``, else its implementation ``impl``; anything else (tracing, dispatch modes, subclasses) through the
    operator ``op``, whose dispatch decides."""
    if plain(args[0]) and not core.functorch_active():
        return direct(*args) if core.any_needs_autograd(*tensors) else impl(*args)
    return op(*args)


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
    ``MhcConvention.deepseek_v4(hc_eps)`` adds eps to H_pre and in Sinkhorn-Knopp, and transposes H_res's logits;
    ``post_scale`` and ``post_eps`` make H_post = post_scale sigmoid(.) + post_eps; ``groups=2`` makes no H_res
    (phi (nC, 2n), b_res empty; H_res comes back (..., 0, 0)), ``groups=1`` H_pre alone (phi (nC, n), b_post empty;
    H_post (..., 0)). Returns (h, H_pre, H_post, H_res): h in X's dtype, the coefficients in float32 (float64 if any
    input is).
    """
    # no gradient wanted, plain CPU tensors: the checks and the call in C++ (None: the path below)
    if (convention is None or type(convention) is MhcConvention) and (r := run_fast(
            backend, "fast_mhc", x, None, None, None, False, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms,
            eps, iters, *(convention or PAPER).fields)) is not None:
        return r
    x, phi = core.uninferred((x, phi), (a_pre, a_post, a_res, b_pre, b_post, b_res))
    coeffs = {"a_pre": a_pre, "a_post": a_post, "a_res": a_res, "b_pre": b_pre, "b_post": b_post, "b_res": b_res}
    conv = _check_convention(convention, perms)
    _check_mhc(x, phi, coeffs, perms, eps, iters, conv.groups)
    which = core.choose_backend(backend, x, tuple(x.shape[-1:]))
    args = (x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, float(eps), int(iters), *conv.fields)
    return run_pre(which, args)[:4]


def check_write(x, y, h_post, h_res, products: bool) -> None:
    """The write's tensors for the stream x (..., n, C): y (..., C), h_post (..., n), h_res (..., n, n) or None."""
    lead, (n, C) = tuple(x.shape[:-2]), tuple(x.shape[-2:])
    for name, t, shape in (("y", y, lead + (C,)), ("h_post", h_post, lead + (n,)),
                           ("h_res", h_res, lead + (n, n))):
        if t is None and name == "h_res":
            continue
        core.check_float_tensor(name, t)
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} for x of shape {tuple(x.shape)}, got {tuple(t.shape)}")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
        if not torch.compiler.is_compiling() and not core.functorch_active():
            core.check_storage(name, t)
    if products and h_res is not None:
        raise ValueError("rounding each product first (products=True) is a write without a mixing matrix's: pass "
                         "h_res=None, or products=False")


def run_write_pre(which: str, args: tuple) -> tuple:
    """mhc_write_pre's seven outputs from its operator's arguments on backend ``which`` (as ``run_pre``)."""
    if which == "torch":
        x2 = mw.write_formulas(*args[:5])
        return (x2, *mf.pre(x2, *args[5:]))
    # through the operator its Autograd kernel is MhcWritePre
    return run_direct(_WRITE[which], _WRITE_IMPL[which], torch.ops.addnorm.mhc_write_pre, args,
                      (*args[:4], *args[5:13]))


def mhc_write_pre(x, y, h_post, h_res, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, *, perms=None,
                  eps: float = 1e-6, iters: int = 20, convention: MhcConvention | None = None, products: bool = False,
                  backend: str | None = None):
    """A write of the stream X (..., n, C) and ``mhc_pre``'s read of its result, in one pass over each token:

        X' = H_res X + H_post^T y      (h_res (..., n, n): the stream family's write, ``stream_write``)
        X' = X + H_post^T y            (h_res None: no mixing matrix, each stream its own; ``products=True``
                                        rounds each H_post[i] y to X's dtype first, as eager 16-bit code does)

    rounded to X's dtype, then (h, H_pre, H_post, H_res) = mhc_pre(X', phi, ...) as ``mhc_pre`` documents. y is
    (..., C) in X's dtype, h_post (..., n). Returns (X', h, H_pre, H_post, H_res). On the CPU kernels the read sees
    X' while it is still in cache (the write and the read are one walk over the stream), and backward is one walk
    too: the read's backward, its gradient of X' added to X''s own in float32, then the write's.
    """
    if (convention is None or type(convention) is MhcConvention) and (r := run_fast(
            backend, "fast_mhc", x, y, h_post, h_res, products, phi, a_pre, a_post, a_res, b_pre, b_post, b_res,
            perms, eps, iters, *(convention or PAPER).fields)) is not None:
        return r
    x, phi = core.uninferred((x, phi), (y, h_post, h_res, a_pre, a_post, a_res, b_pre, b_post, b_res))
    coeffs = {"a_pre": a_pre, "a_post": a_post, "a_res": a_res, "b_pre": b_pre, "b_post": b_post, "b_res": b_res}
    conv = _check_convention(convention, perms)
    _check_mhc(x, phi, coeffs, perms, eps, iters, conv.groups)
    check_write(x, y, h_post, h_res, core.check_flag("products", products))
    which = core.choose_backend(backend, x, tuple(x.shape[-1:]))
    args = (x, y, h_post, h_res, bool(products), phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, float(eps),
            int(iters), *conv.fields)
    return run_write_pre(which, args)[:5]
