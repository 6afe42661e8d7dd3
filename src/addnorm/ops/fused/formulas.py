"""The fused forms beyond Add & Norm, in torch ops: what the kernels compute, exactly as eager code rounds it.

norm-then-add (OLMo 2's post-branch norms, the output norm of sandwich / Peri-LN):

    out = residual + Norm(x)      Norm(x) stored in x's dtype first, as eager code stores it; the sum
                                  in promote(residual, x), rounded once

parallel residual (GPT-J, GPT-NeoX, Falcon, Phi, CodeGen, Cohere):

    s  = residual + (x + x2)      ``branches_first`` (eager ``attn + mlp + residual``: x + x2 rounded first)
    s  = (residual + x) + x2      otherwise (eager ``residual + attn + mlp``, Cohere's order)
    y  = Norm(s; weight, bias)    in x's dtype, like Add & Norm's normed output
    y2 = Norm(s; weight2, bias2)  optional: a second norm of the same stream with its own parameters

Both norms share the kind, eps and statistics. Backward of the parallel form: with g = dy * w + dy2 * w2
(each term present when its output was used), ds = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dres,
the gradient of residual, x and x2 alike (Norm's backward is linear in g, so two outputs cost one pass).
"""

from __future__ import annotations

import torch

from ..norm import formulas


def norm_add_dtype(x: torch.Tensor, residual: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, residual.dtype)


def norm_add(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight):
    """(out, stats): out = residual + Norm(x)."""
    y, _, stats = formulas.forward(x, None, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, None,
                                   False)
    ct = formulas.compute_dtype(x, residual)
    return (residual.to(ct) + y.to(ct)).to(norm_add_dtype(x, residual)), stats


def parallel_sum(x, x2, residual, branches_first: bool) -> torch.Tensor:
    """The new stream in residual's dtype, rounded as eager code rounds it."""
    if x2 is None:
        t = x.to(residual.dtype) if x.dtype != residual.dtype else x
        return residual + t
    if branches_first:
        return residual + (x + x2).to(residual.dtype)
    return ((residual + x.to(residual.dtype)) + x2.to(residual.dtype)).to(residual.dtype)


def parallel_add_norm(x, x2, residual, weight, bias, weight2, bias2, kind, ndim, eps, weight_offset,
                      cast_before_weight, two, branches_first):
    """(y, y2 or None, s, stats)."""
    s = parallel_sum(x, x2, residual, branches_first)
    y, _, stats = formulas.forward(s, None, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, x.dtype,
                                   False)
    y2 = None
    if two:
        y2, _, _ = formulas.forward(s, None, weight2, bias2, kind, ndim, eps, weight_offset, cast_before_weight,
                                    x.dtype, False)
    return y, y2, s, stats


def parallel_backward(dy, dy2, dres, s, weight, bias, weight2, bias2, kind, ndim, eps, weight_offset, output_mask):
    """(ds, dweight, dbias, dweight2, dbias2) in s's and the parameters' dtypes (None where not asked for)."""
    ds = dres.to(formulas.compute_dtype(s, dres)) if dres is not None else None
    grads = []
    for d, w, b, (mw, mb) in ((dy, weight, bias, output_mask[:2]), (dy2, weight2, bias2, output_mask[2:])):
        if d is None:
            grads += [torch.zeros_like(w) if w is not None and mw else None,
                      torch.zeros_like(b) if b is not None and mb else None]
            continue
        _, _, dw, db = formulas.backward(d, None, s, w, b, kind, ndim, eps, weight_offset, s.dtype, (False, mw, mb))
        grads += [dw, db]
        ds = _add(ds, d, s, w, kind, ndim, eps, weight_offset)
    if ds is None:
        ds = torch.zeros_like(s)
    return (ds.to(s.dtype), *grads)


def _add(acc, d, s, w, kind, ndim, eps, weight_offset):
    """acc + this output's share of ds, in the compute dtype (rounded once at the end, as the kernels do)."""
    ct = formulas.compute_dtype(s, d)
    _, _, rstd, xhat = formulas.statistics(s, kind, ndim, eps, ct)
    dims = tuple(range(-ndim, 0))
    ws = formulas.scale(w, weight_offset, ct)
    g = d.to(ct) if ws is None else d.to(ct) * ws
    p = g - xhat * (g * xhat).mean(dims, keepdim=True)
    if kind == "layer":
        p = p - g.mean(dims, keepdim=True)
    p = rstd * p
    return p if acc is None else acc + p
