"""Host side of DyT / Derf fused with the add (``pointwise_rows.h``).

    forward(x, residual, alpha, shift, weight, bias, kind, D, want_sum) -> (y, s or None)
    backward(dy, dres, s, alpha, shift, weight, bias, kind, D, mask)     -> (ds, dalpha, dshift, dweight, dbias)

``kind`` is "dyt" (tanh) or "derf" (erf); alpha and shift are Python floats (the scalars' values); x and
residual are read as (rows, D) views (``as_rows``); s, y, ds are new contiguous tensors.
"""

from __future__ import annotations

import torch

from ..rows import as_rows, resolved
from .library import availability, library
from .norm import DTYPE, PARAM_DTYPE, check_rc, empty_rows_like, like, num_threads, params, ptr, spec

KINDS = {"dyt": 0, "derf": 1}


def applies(*ts, D: int = 1) -> bool:
    return D > 0 and all(t is None or t.dtype in DTYPE for t in ts) and availability().available


def forward(x, residual, alpha: float, shift: float, weight, bias, kind, D, want_sum: bool):
    x, residual, weight, bias = resolved(x, residual, weight, bias)
    N = x.numel() // D
    y = empty_rows_like(x)
    s = empty_rows_like(x, residual.dtype) if residual is not None and want_sum else None
    if N:
        w, b, pcode = params(weight, bias, D)
        xr = as_rows(x, D)
        rr = None if residual is None else as_rows(residual, D)
        sdt = residual.dtype if residual is not None else x.dtype
        rc = library().pointwise_forward(
            KINDS[kind], DTYPE[x.dtype], DTYPE[residual.dtype] if residual is not None else 0, DTYPE[sdt],
            DTYPE[x.dtype], N, D, ptr(xr), xr.stride(0), ptr(rr), 0 if rr is None else rr.stride(0), ptr(w),
            ptr(b), pcode, alpha, shift, ptr(y), ptr(s), num_threads())
        if rc:
            check_rc(rc, "pointwise forward")
    return y, s


def backward(dy, dres, s, alpha: float, shift: float, weight, bias, kind, D, mask):
    """mask: (alpha, shift, weight, bias) gradients wanted."""
    dy, dres, s, weight, bias = resolved(dy, dres, s, weight, bias)
    N = s.numel() // D
    s = s.contiguous()
    ds = empty_rows_like(s)
    w, b, pcode = params(weight, bias, D)
    pdt = PARAM_DTYPE[pcode]
    dw = torch.empty(D, device="cpu", dtype=pdt) if weight is not None and mask[2] else None
    db = torch.empty(D, device="cpu", dtype=pdt) if bias is not None and mask[3] else None
    scal = torch.zeros(2, device="cpu", dtype=torch.float64) if mask[0] or mask[1] else None
    dyr = as_rows(dy, D) if N else dy
    dresr = None if dres is None else (as_rows(dres, D) if N else dres)
    rc = library().pointwise_backward(
        KINDS[kind], DTYPE[s.dtype], DTYPE[dy.dtype], DTYPE[dres.dtype] if dres is not None else 0, N, D, ptr(s),
        ptr(dyr), dyr.stride(0) if N else D, ptr(dresr), dresr.stride(0) if dresr is not None and N else 0, ptr(w),
        pcode, alpha, shift, ptr(ds), ptr(dw), ptr(db), ptr(scal), num_threads())
    if rc:
        check_rc(rc, "pointwise backward")
    return (ds, None if scal is None else scal[0], None if scal is None else scal[1], like(dw, spec(weight, w)),
            like(db, spec(bias, b)))
