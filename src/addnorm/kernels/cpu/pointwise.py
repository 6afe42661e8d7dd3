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
from .ops import _DTYPE, _PARAM_DTYPE, _check_rc, _num_threads, _ptr, empty_rows_like, like, params, spec

KINDS = {"dyt": 0, "derf": 1}


def applies(*ts, D: int = 1) -> bool:
    return D > 0 and all(t is None or t.dtype in _DTYPE for t in ts) and availability().available


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
            KINDS[kind], _DTYPE[x.dtype], _DTYPE[residual.dtype] if residual is not None else 0, _DTYPE[sdt],
            _DTYPE[x.dtype], N, D, _ptr(xr), xr.stride(0), _ptr(rr), 0 if rr is None else rr.stride(0), _ptr(w),
            _ptr(b), pcode, alpha, shift, _ptr(y), _ptr(s), _num_threads())
        if rc:
            _check_rc(rc, "pointwise forward")
    return y, s


def backward(dy, dres, s, alpha: float, shift: float, weight, bias, kind, D, mask):
    """mask: (alpha, shift, weight, bias) gradients wanted."""
    dy, dres, s, weight, bias = resolved(dy, dres, s, weight, bias)
    N = s.numel() // D
    s = s.contiguous()
    ds = empty_rows_like(s)
    w, b, pcode = params(weight, bias, D)
    pdt = _PARAM_DTYPE[pcode]
    dw = torch.empty(D, device="cpu", dtype=pdt) if weight is not None and mask[2] else None
    db = torch.empty(D, device="cpu", dtype=pdt) if bias is not None and mask[3] else None
    scal = torch.zeros(2, device="cpu", dtype=torch.float64) if mask[0] or mask[1] else None
    dyr = as_rows(dy, D) if N else dy
    dresr = None if dres is None else (as_rows(dres, D) if N else dres)
    rc = library().pointwise_backward(
        KINDS[kind], _DTYPE[s.dtype], _DTYPE[dy.dtype], _DTYPE[dres.dtype] if dres is not None else 0, N, D, _ptr(s),
        _ptr(dyr), dyr.stride(0) if N else D, _ptr(dresr), dresr.stride(0) if dresr is not None and N else 0, _ptr(w),
        pcode, alpha, shift, _ptr(ds), _ptr(dw), _ptr(db), _ptr(scal), _num_threads())
    if rc:
        _check_rc(rc, "pointwise backward")
    return (ds, None if scal is None else scal[0], None if scal is None else scal[1], like(dw, spec(weight, w)),
            like(db, spec(bias, b)))
