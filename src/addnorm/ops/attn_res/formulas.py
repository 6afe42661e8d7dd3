"""Attention Residuals' depth mix in torch ops: what the fused kernels compute, and their double backward and
forward-mode AD.

From S sources v_s (..., C) (the earlier layers' outputs, or block sums), a query q (C,) and the key norm's
weight g (C,) or none, per token (Kimi Team 2026, arXiv:2603.15031, eqs. 2-4):

    rstd_s  = 1 / sqrt(|v_s|^2 / C + eps)              RMSNorm's statistic of each source
    l_s     = rstd_s <q * g, v_s>                       = q^T RMSNorm(v_s)
    alpha   = softmax_s(l)                              over depth
    h       = sum_s alpha_s v_s

Outputs (h, alpha, rstd): h in the sources' promoted dtype; alpha and rstd (..., S) in float32 (float64 when a
source, q or g is float64), what a backward reads (as native_layer_norm's mean and rstd): not differentiable.
Backward, with u = q * g, z_s = <u, v_s> and dh the gradient of h:

    dalpha_s = <dh, v_s>;   dl_s = alpha_s (dalpha_s - sum_t alpha_t dalpha_t);   c_s = dl_s rstd_s
    dv_s     = alpha_s dh + c_s (u - l_s rstd_s v_s / C)
    du       = sum over tokens and s of c_s v_s;   dq = du * g;   dg = du * q
"""

from __future__ import annotations

import contextlib

import torch


def _autocast_off(t: torch.Tensor):
    """Autocast off on the tensor's device type (a meta tensor has no autocast to turn off)."""
    kind = t.device.type
    return torch.autocast(kind, enabled=False) if kind in ("cpu", "cuda", "xpu") else contextlib.nullcontext()


def compute_dtype(*ts) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) else torch.float32


def out_dtype(sources) -> torch.dtype:
    """The dtype of h: the sources' promoted dtype (a float32 embedding beside bf16 layer outputs gives float32)."""
    dt = sources[0].dtype
    for v in sources[1:]:
        dt = torch.promote_types(dt, v.dtype)
    return dt


def _u(query, weight, ct):
    q = query.to(ct)
    return q if weight is None else q * weight.to(ct)


def _stack(sources, ct):
    """(..., S, C) in the compute dtype."""
    return torch.stack([v.to(ct) for v in sources], dim=-2)


def _stats(V, u, eps):
    """(rstd, z, l): each (..., S)."""
    rstd = torch.rsqrt((V * V).mean(-1) + eps)
    z = V @ u
    return rstd, z, z * rstd


def forward(sources, query, weight, eps):
    """(h, alpha, rstd); see the module docstring. Autocast is off inside: the statistics are float32 at least
    whatever the caller's autocast state."""
    with _autocast_off(sources[0]):
        ct = compute_dtype(*sources, query, weight)
        V = _stack(sources, ct)
        rstd, _, logits = _stats(V, _u(query, weight, ct), eps)
        alpha = torch.softmax(logits, dim=-1)
        h = (alpha.unsqueeze(-1) * V).sum(-2)
        return h.to(out_dtype(sources)), alpha, rstd


def backward(dh, sources, query, weight, eps):
    """Gradients of (sources..., query, weight) from dh, in torch ops as the kernels compute them: differentiable
    again (double backward) and carrying forward-mode tangents. The weight's gradient is None without one."""
    with _autocast_off(sources[0]):
        ct = compute_dtype(*sources, query, weight, dh)
        V = _stack(sources, ct)
        u = _u(query, weight, ct)
        rstd, _, logits = _stats(V, u, eps)
        alpha = torch.softmax(logits, dim=-1)
        g = dh.to(ct)
        dalpha = (V @ g.unsqueeze(-1)).squeeze(-1)  # (..., S)
        dl = alpha * (dalpha - (alpha * dalpha).sum(-1, keepdim=True))
        c = dl * rstd
        dV = (alpha.unsqueeze(-1) * g.unsqueeze(-2) + c.unsqueeze(-1) * u
              - (c * logits * rstd / V.size(-1)).unsqueeze(-1) * V)
        du = (c.unsqueeze(-1) * V).reshape(-1, V.size(-1)).sum(0)
        dsources = [dV[..., s, :].to(v.dtype) for s, v in enumerate(sources)]
        dq = (du if weight is None else du * weight.to(ct)).to(query.dtype)
        dw = None if weight is None else (du * query.to(ct)).to(weight.dtype)
        return dsources, dq, dw


def jvp(sources, query, weight, t_sources, t_query, t_weight, eps):
    """Forward-mode derivative of h along the tangents (None: zero), written out (an autograd.Function's jvp runs
    inside a dual level, where torch.func.jvp cannot open another)."""
    with _autocast_off(sources[0]):
        ct = compute_dtype(*sources, query, weight)
        V = _stack(sources, ct)
        tV = torch.stack([torch.zeros_like(V[..., 0, :]) if t is None else t.to(ct) for t in t_sources], dim=-2)
        u = _u(query, weight, ct)
        tu = torch.zeros_like(u)
        if t_query is not None:
            tu = tu + (t_query.to(ct) if weight is None else t_query.to(ct) * weight.to(ct))
        if t_weight is not None:
            tu = tu + query.to(ct) * t_weight.to(ct)
        rstd, z, logits = _stats(V, u, eps)
        alpha = torch.softmax(logits, dim=-1)
        t_rstd = -(rstd ** 3) * (V * tV).sum(-1) / V.size(-1)
        t_logits = (V @ tu + tV @ u) * rstd + z * t_rstd
        t_alpha = alpha * (t_logits - (alpha * t_logits).sum(-1, keepdim=True))
        th = (t_alpha.unsqueeze(-1) * V + alpha.unsqueeze(-1) * tV).sum(-2)
        return th.to(out_dtype(sources))
