"""DeepSeek-V4's mHC hyper-connection (HuggingFace's ``DeepseekV4HyperConnection``; GLM-5-next's text layers hold the
same one) on addnorm's mHC and stream operators. Its final collapse (``DeepseekV4HyperHead``) is HY-V4's head form,
patched by ``interop.hyper``.

A connection is recognised by what it holds -- fn ((2 + n) n, nC), base ((2 + n) n,), scale (3,), hc_mult n,
hc_sinkhorn_iters >= 1, hc_eps, input_norm.eps -- then confirmed by running it beside addnorm's call on a probe
stream (as a norm's convention is found by probing it, ``patch.probe_convention``). Its read X -> (post, comb, h)
is one ``mhc_pre`` with ``MhcConvention.deepseek_v4(hc_eps)``: phi = fn^T, rows [pre, post, comb] as the paper's
columns; H_res = comb^T, returned transposed as HF's comb.

``write`` is what a rewritten decoder layer calls in place of its write of the stream,
``post.to(d).unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.to(d).transpose(-1, -2), X)`` (found by
``interop.mhc_rewrite``): X' = H_res X + H_post^T y with the layer's own casts of the coefficients kept. Where a
probe run found the one patched connection that reads X' next -- the layer's second, the next layer's first, the
model's final collapse -- the write and that read are one ``mhc_write_pre`` (with the next connection's convention,
or the head's, groups 1), its read left for the connection (``interop.handoff``): on the CPU kernels one pass over
the stream, each token's X' read while it is in cache. Elsewhere the write is one ``stream_write``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .. import functional as AF
from ..functional.mhc import MhcConvention
from . import handoff, hyper

_STREAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # float64: HF's modules compute in float32 there


@dataclass(frozen=True)
class MhcPlan:
    n: int  # streams
    C: int  # channels per stream
    eps: float  # the RMS of vec(X)'s (the module's input_norm)
    iters: int  # Sinkhorn-Knopp rounds
    convention: MhcConvention
    final = False  # a connection of a layer (the final collapse is interop.hyper's head)


def _number(module, name):
    v = getattr(module, name, None)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 else None


def _int(module, name):
    v = getattr(module, name, None)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None


def _param(module, name, shape) -> bool:
    t = getattr(module, name, None)
    return isinstance(t, torch.Tensor) and t.is_floating_point() and tuple(t.shape) == tuple(shape)


def _geometry(module, name):
    """(n, C, rms eps) of a module holding hc_mult, a 2-D projection ``name`` of nC columns and input_norm.eps."""
    n, eps = _int(module, "hc_mult"), _number(getattr(module, "input_norm", None), "eps")
    fn = getattr(module, name, None)
    if n is None or eps is None or not isinstance(fn, torch.Tensor) or fn.dim() != 2 or fn.shape[1] % n:
        return None
    return n, fn.shape[1] // n, eps


def recognise(module: nn.Module) -> MhcPlan | None:
    """The plan for ``module`` by what it holds now (its eps and rounds as they are now), or None."""
    geo = _geometry(module, "fn")
    if geo is None:
        return None
    n, C, eps = geo
    m = (2 + n) * n
    iters, hc_eps = _int(module, "hc_sinkhorn_iters"), _number(module, "hc_eps")
    if (iters is None or hc_eps is None or not _param(module, "fn", (m, n * C)) or not _param(module, "base", (m,))
            or not _param(module, "scale", (3,))):
        return None
    return MhcPlan(n, C, eps, iters, MhcConvention.deepseek_v4(hc_eps))


@torch.no_grad()
def probe(module: nn.Module) -> MhcPlan | None:
    """The plan whose addnorm call reproduces ``module`` on a probe stream (float32, to HF's rounding), or None."""
    plan = recognise(module)
    if plan is None:
        return None
    try:
        device = next(module.parameters()).device
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(2, 3, plan.n, plan.C, generator=g) * 2 + 0.5).to(device)
        x[1] *= 1e-3  # tokens whose RMS is near eps: a wrong eps shows there
        want = type(module).forward(module, x)
        got = _read(module, plan, x)
    except Exception:  # noqa: BLE001  (a module that cannot run on a probe -- meta weights -- is not reproduced)
        return None
    same = isinstance(want, tuple) and len(got) == len(want) and all(
        isinstance(w, torch.Tensor) and a.shape == w.shape and a.dtype == w.dtype
        and torch.allclose(a.float(), w.float(), atol=1e-5, rtol=1e-5) for a, w in zip(got, want))
    return plan if same else None


def _takes(plan: MhcPlan, x) -> bool:
    return (isinstance(x, torch.Tensor) and x.dtype in _STREAM_DTYPES and x.dim() >= 2
            and tuple(x.shape[-2:]) == (plan.n, plan.C))


def _read_args(module, plan: MhcPlan):
    """mhc_pre's projection and coefficients from the module's fn, scale and base."""
    n = plan.n
    fn, base, scale = module.fn, module.base, module.scale
    return fn.t(), scale[0], scale[1], scale[2], base[:n], base[n:2 * n], base[2 * n:].view(n, n)


def _read(module, plan: MhcPlan, x):
    """The module's output (post, comb, h) from one mhc_pre on the stream x (..., n, C)."""
    h, _, post, h_res = AF.mhc_pre(x, *_read_args(module, plan), eps=plan.eps, iters=plan.iters,
                                   convention=plan.convention)
    return post, h_res.transpose(-1, -2), h  # HF's comb is H_res^T: a view, which the layer transposes back


def forward(module: nn.Module, x, *args, **kwargs):
    """A patched hyper-connection: the read its write handed over, or one addnorm call, or -- where addnorm does
    not take the call -- the module's own forward."""
    pending = handoff.take(module, x)
    plan = recognise(module) if "_addnorm_hyper" in module.__dict__ else None
    if args or kwargs or plan is None or not _takes(plan, x):
        return type(module).forward(module, x, *args, **kwargs)
    return pending if pending is not None else _read(module, plan, x)


def _coefficients(stream, y, post, comb, dtype, transposed):
    """(H_post, H_res) as the layer mixes with them (its casts, its transpose), when one stream_write computes
    its expression in the stream's dtype; else None."""
    ts = (stream, y, post, comb)
    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in ts):
        return None
    if dtype is not None and not isinstance(dtype, torch.dtype):
        return None
    h_post = post if dtype is None else post.to(dtype)
    h_res = comb if dtype is None else comb.to(dtype)
    h_res = h_res.transpose(-1, -2) if transposed else h_res
    if stream.dtype not in _STREAM_DTYPES or y.dtype != stream.dtype or len({t.device for t in ts}) != 1:
        return None
    if stream.dim() < 2 or y.dim() != stream.dim() - 1:
        return None
    lead, (n, C) = tuple(stream.shape[:-2]), tuple(stream.shape[-2:])
    if (tuple(y.shape) != lead + (C,) or tuple(h_post.shape) != lead + (n,)
            or tuple(h_res.shape) != lead + (n, n)):
        return None
    # the layer's sum is in the stream's dtype only when neither coefficient promotes it
    if any(torch.promote_types(stream.dtype, t.dtype) != stream.dtype for t in (h_post, h_res)):
        return None
    return h_post, h_res


def _write_and_read(reader, stream, y, h_post, h_res):
    """(X', the read of X' that ``reader`` -- the patched hyper-connection found to read it next -- would compute),
    in one call: a connection of this family's (its mhc_pre's read), or interop.hyper's (DeepSeek-V4's final
    collapse); None where it must compute its own (a pre-hook that could change its input, another shape)."""
    if isinstance(reader.__dict__.get("_addnorm_hyper"), MhcPlan):
        plan = recognise(reader)
        if plan is None or reader._forward_pre_hooks or not _takes(plan, stream):
            return None
        x2, h, _, post, h_res2 = AF.mhc_write_pre(stream, y, h_post, h_res, *_read_args(reader, plan), eps=plan.eps,
                                                  iters=plan.iters, convention=plan.convention)
        return x2, (post, h_res2.transpose(-1, -2), h)  # as _read returns it
    return hyper.write_and_read_to_hand_over(reader, stream, y, h_post, h_res)


def write(layer, site, stream, y, post, comb, dtype, transposed, eager):
    """``eager()`` -- the layer's ``post.to(d).unsqueeze(-1) * y.unsqueeze(-2) + (comb.to(d)^T) @ stream`` -- on
    addnorm's operators: with the next read of its result where a probe run found it (``handoff``), else alone."""
    coeffs = _coefficients(stream, y, post, comb, dtype, transposed)
    if coeffs is None:
        s = eager()
        handoff.record(layer, site, s)
        return s
    readers = handoff.readers(layer, site)
    fused = _write_and_read(readers[0], stream, y, *coeffs) if len(readers) == 1 and handoff.enabled(layer) else None
    if fused is None:
        x2 = AF.stream_write(stream, y, *coeffs)[0]
        handoff.record(layer, site, x2)
        return x2
    x2, pending = fused
    handoff.give(readers[0], x2, pending)
    return x2
