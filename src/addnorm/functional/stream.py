"""The widened residual stream's two memory-bound steps as functions, on the backend ``addnorm.functional``
would pick (``use_backend`` / ``backend=``):

    stream_read(x, h_pre)               -> h = H_pre X                     (..., n, C), (..., n) -> (..., C)
    stream_write(x, y, h_post, h_res)   -> (X' = H_res X + H_post^T y, q)   q = sum of squares of each token's X'

Hyper-connections, mHC and mHC-lite (``addnorm.model.streams``) read each sub-layer's input with the first
and write its output back with the second; ``q`` is the statistic the next mHC projection's RMS of vec(X')
needs. One pass over the stream each way on the "cpu" and "triton" backends; every output rounded once
from float32 sums (eager's batched matmul rounds the products and the add separately).
"""

from __future__ import annotations

import torch

from ..ops import plain
from ..ops.norm.autograd import c_apply as _c_apply
from ..ops.stream import formulas as sf
from ..ops.stream.autograd import DirectStreamRead, DirectStreamWrite, TritonStreamRead, TritonStreamWrite
from ..ops.stream.schema import CPU, TRITON
from . import core
from .mhc import mhc_pre  # noqa: F401  (addnorm.stream_functional, this module's old path, exported it)
from .mhc import run_fast

__all__ = ["stream_read", "stream_write"]


def _check(x, **coeffs):
    core.check_float_tensor("x", x)
    if x.dim() < 2:
        raise ValueError(f"x must be a widened stream (..., n, C), got shape {tuple(x.shape)}")
    lead, n = tuple(x.shape[:-2]), x.shape[-2]
    want = {"h_pre": lead + (n,), "h_post": lead + (n,), "h_res": lead + (n, n), "y": lead + (x.shape[-1],)}
    for name, t in coeffs.items():
        core.check_float_tensor(name, t)
        if tuple(t.shape) != want[name]:
            raise ValueError(f"{name} must have shape {want[name]} for x of shape {tuple(x.shape)}, "
                             f"got {tuple(t.shape)}")
        if not (t.is_cpu and x.is_cpu) and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if "y" in coeffs and coeffs["y"].dtype != x.dtype:
        raise TypeError(f"y dtype {coeffs['y'].dtype} must equal x dtype {x.dtype} (cast the branch output)")
    if not torch.compiler.is_compiling() and not core.functorch_active():
        for name, t in (("x", x), *coeffs.items()):
            core.check_storage(name, t)


_READ = {"cpu": _c_apply(DirectStreamRead), "triton": _c_apply(TritonStreamRead)}
_WRITE = {"cpu": _c_apply(DirectStreamWrite), "triton": _c_apply(TritonStreamWrite)}
_IMPL = {"cpu": CPU, "triton": TRITON}


def stream_read(x, h_pre, *, backend: str | None = None):
    """h = sum_i H_pre[i] X_i: the sub-layer's input read out of the widened stream."""
    # plain CPU tensors: the checks, the call and (a gradient wanted) the node in C++ (None: the path below)
    if (r := run_fast(backend, "fast_stream_read", x, h_pre)) is not None:
        return r
    x, h_pre = core.uninferred((x, h_pre))
    _check(x, h_pre=h_pre)
    which = core.choose_backend(backend, x, tuple(x.shape[-1:]))
    if which == "torch":
        return sf.read(x, h_pre)
    if plain(x) and not core.functorch_active():
        if core.any_needs_autograd(x, h_pre):
            return _READ[which](x, h_pre)
        return _IMPL[which][0](x, h_pre)
    return torch.ops.addnorm.stream_read(x, h_pre)  # its Autograd kernel is StreamRead


def stream_write(x, y, h_post, h_res, *, backend: str | None = None):
    """(X', q): X'_i = sum_j H_res[i, j] X_j + H_post[i] y, and q = per-token sum of squares of X'."""
    # plain CPU tensors: the checks, the call and (a gradient wanted) the node in C++ (None: the path below)
    if (r := run_fast(backend, "fast_stream_write", x, y, h_post, h_res)) is not None:
        return r
    x, y, h_post, h_res = core.uninferred((x, y, h_post, h_res))
    _check(x, y=y, h_post=h_post, h_res=h_res)
    which = core.choose_backend(backend, x, tuple(x.shape[-1:]))
    if which == "torch":
        return sf.write(x, y, h_post, h_res)
    if plain(x) and not core.functorch_active():
        if core.any_needs_autograd(x, y, h_post, h_res):
            return _WRITE[which](x, y, h_post, h_res)
        return _IMPL[which][2](x, y, h_post, h_res)
    return torch.ops.addnorm.stream_write(x, y, h_post, h_res)
