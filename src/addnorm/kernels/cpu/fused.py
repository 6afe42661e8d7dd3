"""Host side of the fused forms' CPU kernels (``fused_rows.h``): norm-then-add and the parallel residual.

    norm_add(x, residual, weight, bias, kind, D, eps, ...)            -> (out, stats or None)
    parallel_add_norm(x, x2, residual, weight, bias, weight2, bias2, kind, D, eps, ...)
                                                                      -> (y, y2 or None, s, stats or None)
    parallel_backward(dy, dy2, dres, s, stats, weight, bias, weight2, bias2, kind, D, ...)
                                                                      -> (ds, dw, db, dw2, db2)

Norm-then-add's backward is the plain norm's (``ops.add_norm_backward``). Tensors are read as (rows, D)
with unit stride on D (``as_rows``); statistics are float32, (2, N) = (mean, rstd) or (1, N) = (rstd,).
"""

from __future__ import annotations

import torch

from ..rows import as_rows, resolved
from .library import KIND_CODES, availability, library
from .norm import DTYPE, PARAM_DTYPE, check_rc, empty_rows_like, like, num_threads, params, ptr, spec, stats_ptrs


def applies(*ts, D: int = 1) -> bool:
    """Whether the kernels take these tensors' dtypes (None: absent) and a row of D elements."""
    return D > 0 and all(t is None or t.dtype in DTYPE for t in ts) and availability().available


def _params(ps, D: int):
    """The parameters as the kernels read them, sharing one dtype: each as it is where all are contiguous
    and of one kernel dtype, else float32 copies."""
    present = [p for p in ps if p is not None]
    if not present:
        return list(ps), 0
    dt = present[0].dtype
    if dt in DTYPE and all(p.dtype == dt and p.is_contiguous() for p in present):
        return list(ps), DTYPE[dt]
    return [None if p is None else p.detach().reshape(D).to(torch.float32).contiguous() for p in ps], 0


def _rs(t, D):
    return 0 if t is None else t.stride(0)


def _run_forward(kind, x, a, m, post, params, eps, weight_offset, cast_before_weight, amdt, ndt, y, y2, s_out,
                 stats, N, D):
    (w1, b1, w2, b2), pcode = params
    mean, rstd = stats_ptrs(stats, kind, N)
    code = DTYPE
    xr, ar, mr, pr = as_rows(x, D), None if a is None else as_rows(a, D), None if m is None else as_rows(m, D), \
        None if post is None else as_rows(post, D)
    yv, y2v, sv = (None if t is None else t.view(N, D) for t in (y, y2, s_out))
    odt = (y if y is not None else y2).dtype if (y is not None or y2 is not None) else x.dtype
    rc = library().fused_forward(
        KIND_CODES[kind], int(cast_before_weight), code[x.dtype], code[a.dtype] if a is not None else 0,
        code[m.dtype] if m is not None else 0, code[amdt], code[(s_out.dtype if s_out is not None else x.dtype)],
        code[post.dtype] if post is not None else 0, code[odt], code[ndt], N, D,
        ptr(xr), _rs(xr, D), ptr(ar), _rs(ar, D), ptr(mr), _rs(mr, D), ptr(pr), _rs(pr, D),
        ptr(w1), ptr(b1), ptr(w2), ptr(b2), pcode, float(weight_offset), float(eps),
        ptr(yv), _rs(yv, D), ptr(y2v), _rs(y2v, D), ptr(sv), _rs(sv, D), mean, rstd, num_threads())
    if rc:
        check_rc(rc, "fused forward")


def norm_add(x, residual, weight, bias, kind, D, eps, weight_offset, cast_before_weight, out_dtype, want_stats=True):
    """out = residual + Norm(x) in out_dtype (promote(x, residual)); stats float32 (None unless wanted)."""
    x, residual, weight, bias = resolved(x, residual, weight, bias)
    N = x.numel() // D
    stats = torch.empty(2 if kind == "layer" else 1, N, device="cpu", dtype=torch.float32) if want_stats else None
    out = empty_rows_like(x, out_dtype)
    if N:
        _run_forward(kind, x, None, None, residual, _params((weight, bias, None, None), D), eps, weight_offset,
                     cast_before_weight, x.dtype, x.dtype, out, None, None, stats, N, D)
    return out, stats


def parallel_add_norm(x, x2, residual, weight, bias, weight2, bias2, kind, D, eps, weight_offset, cast_before_weight,
                      two, branches_first, want_stats=True):
    """(y in x's dtype, y2 or None, s in residual's dtype, stats or None)."""
    x, x2, residual, weight, bias, weight2, bias2 = resolved(x, x2, residual, weight, bias, weight2, bias2)
    N = x.numel() // D
    stats = torch.empty(2 if kind == "layer" else 1, N, device="cpu", dtype=torch.float32) if want_stats else None
    y = empty_rows_like(x)
    y2 = empty_rows_like(x) if two else None
    s = empty_rows_like(residual)
    if N:
        # the kernel forms X + round_amdt(A + M): map the eager order onto it
        if x2 is None:
            X, A, M, amdt = residual, x, None, residual.dtype
        elif branches_first:  # residual + (x + x2)
            X, A, M, amdt = residual, x, x2, torch.promote_types(x.dtype, x2.dtype)
        else:  # (residual + x) + x2
            X, A, M, amdt = x2, residual, x, residual.dtype
        _run_forward(kind, X, A, M, None, _params((weight, bias, weight2 if two else None, bias2 if two else None), D),
                     eps, weight_offset, cast_before_weight, amdt, x.dtype, y, y2, s, stats, N, D)
    return y, y2, s, stats


def parallel_backward(dy, dy2, dres, s, stats, weight, bias, weight2, bias2, kind, D, weight_offset, output_mask):
    """(ds in s's dtype, dweight, dbias, dweight2, dbias2): parameter gradients in their parameters' shapes
    and dtypes, None where not asked for (or the parameter is absent)."""
    dy, dy2, dres, s, weight, bias, weight2, bias2 = resolved(dy, dy2, dres, s, weight, bias, weight2, bias2)
    stats = stats.contiguous()  # a saved tensor an unpack hook may have handed back in another layout
    N = s.numel() // D
    ps = (weight, bias, weight2, bias2)
    (w1, b1, w2, b2), pcode = _params(ps, D)
    want = [p is not None and bool(mk) and d is not None
            for p, mk, d in zip(ps, output_mask, (dy, dy, dy2, dy2), strict=True)]
    pdt = PARAM_DTYPE[pcode]
    grads = [torch.empty(D, device="cpu", dtype=pdt) if w else None for w in want]
    ds = empty_rows_like(s)
    sr = as_rows(s, D)
    dyr, dy2r, dresr = (None if t is None else as_rows(t, D) for t in (dy, dy2, dres))
    mean, rstd = stats_ptrs(stats, kind, N)
    code = DTYPE
    rc = library().fused_backward(
        KIND_CODES[kind], code[s.dtype], code[dy.dtype] if dy is not None else 0,
        code[dy2.dtype] if dy2 is not None else 0, code[dres.dtype] if dres is not None else 0, code[s.dtype], N, D,
        ptr(sr), _rs(sr, D), mean, rstd, ptr(dyr), _rs(dyr, D), ptr(dy2r), _rs(dy2r, D), ptr(w1),
        ptr(w2), pcode, float(weight_offset), ptr(dresr), _rs(dresr, D), ptr(ds.view(-1, D) if N else ds), D,
        *(ptr(g) for g in grads), num_threads())
    if rc:
        check_rc(rc, "fused backward")
    read = (w1, b1, w2, b2)
    out = []
    for g, p, r, mk in zip(grads, ps, read, output_mask, strict=True):
        if g is None:
            out.append(torch.zeros_like(p) if p is not None and mk else None)
        else:
            out.append(like(g, spec(p, r)))
    return (ds, *out)


# ---------------------------------------------------------------- the eager fast path's host calls
# Contiguous CPU tensors of one dtype the kernels take (the caller checks): one C call, nothing else. At
# 64 x 768 the general path's Python costs as much as the kernel.


def norm_add_contiguous(x, residual, weight, bias, kind, eps, weight_offset, cast_before_weight, want_stats):
    """(out, stats or None) for contiguous x and residual of one dtype."""
    x, residual, weight, bias = resolved(x, residual, weight, bias)
    D = x.shape[-1]
    N = x.numel() // D
    out = empty_rows_like(x)
    stats = torch.empty(2 if kind == "layer" else 1, N, device="cpu", dtype=torch.float32) if want_stats else None
    w, b, pcode = params(weight, bias, D)
    code = DTYPE[x.dtype]
    mean, rstd = stats_ptrs(stats, kind, N)
    rc = library().fused_forward(
        KIND_CODES[kind], int(cast_before_weight), code, 0, 0, code, code, code, code, code, N, D, ptr(x), D,
        None, 0, None, 0, ptr(residual), D, ptr(w), ptr(b), None, None, pcode, weight_offset, eps,
        ptr(out), D, None, 0, None, 0, mean, rstd, num_threads())
    if rc:
        check_rc(rc, "fused forward")
    return out, stats


def parallel_contiguous(x, x2, residual, weight, bias, weight2, bias2, kind, eps, weight_offset, cast_before_weight,
                        branches_first, want_stats):
    """(y, y2 or None, s, stats or None) for contiguous x, x2 (or None) and residual of one dtype; y2 when
    weight2 or bias2 is given."""
    x, x2, residual, weight, bias, weight2, bias2 = resolved(x, x2, residual, weight, bias, weight2, bias2)
    D = x.shape[-1]
    N = x.numel() // D
    two = weight2 is not None or bias2 is not None
    y = empty_rows_like(x)
    y2 = empty_rows_like(x) if two else None
    s = empty_rows_like(x)
    stats = torch.empty(2 if kind == "layer" else 1, N, device="cpu", dtype=torch.float32) if want_stats else None
    (w1, b1, w2, b2), pcode = _params((weight, bias, weight2, bias2), D)
    code = DTYPE[x.dtype]
    if x2 is None:
        X, A, M = residual, x, None
    elif branches_first:
        X, A, M = residual, x, x2
    else:
        X, A, M = x2, residual, x
    mean, rstd = stats_ptrs(stats, kind, N)
    rc = library().fused_forward(
        KIND_CODES[kind], int(cast_before_weight), code, code, code, code, code, 0, code, code, N, D, ptr(X), D,
        ptr(A), D, ptr(M), D, None, 0, ptr(w1), ptr(b1), ptr(w2), ptr(b2),
        pcode, weight_offset, eps, ptr(y), D, ptr(y2), D, ptr(s), D, mean,
        rstd, num_threads())
    if rc:
        check_rc(rc, "fused forward")
    return y, y2, s, stats
