"""Host side of Attention Residuals' CPU kernels (``attn_res_rows.h``).

    attn_res(sources, query, weight, eps)                            -> (h, alpha, rstd)
    attn_res_backward(dh, sources, query, weight, alpha, rstd, eps)  -> (dsources, du)

The S sources are (..., C) tensors of one kernel dtype, read as they are when contiguous (else copied); the kernel
gets their data pointers as one int64 array. u = query * weight goes in as float32 (C,); alpha and rstd come out
(..., S) float32; du = sum over tokens and sources of c_s v_s comes back in float32 (C,), from which the caller forms
dquery = du * weight and dweight = du * query.
"""

from __future__ import annotations

import torch

from ..rows import resolved
from .library import availability, library
from .norm import DTYPE, empty_rows_like, num_threads, ptr

MAX_SOURCES = 64  # AN_ATTN_MAX_S
FWD, BWD = 0, 1


def applies(sources, query, weight) -> bool:
    """Whether the kernels take this call: every source of one kernel dtype, 1 <= S <= 64, C >= 1, and a query and
    weight of a kernel dtype (float64 ones ask for float64 statistics: the formulas)."""
    dt = sources[0].dtype
    return (dt in DTYPE and all(v.dtype == dt for v in sources) and 1 <= len(sources) <= MAX_SOURCES
            and sources[0].dim() >= 1 and sources[0].shape[-1] > 0 and query.dtype in DTYPE and weight.dtype in DTYPE
            and availability().available)


def _pointers(ts) -> torch.Tensor:
    return torch.tensor([ptr(t) for t in ts], dtype=torch.int64)


def _u(query, weight):
    return (query.detach().float() * weight.detach().float()).contiguous()


def _run(op, dt, S, N, C, v, u, eps, h, alpha, rstd, dh, alpha_in, rstd_in, dv, du):
    rc = library().attn_res(op, dt, S, N, C, ptr(v), ptr(u), eps, ptr(h), ptr(alpha), ptr(rstd), ptr(dh),
                            ptr(alpha_in), ptr(rstd_in), ptr(dv), ptr(du), num_threads())
    if rc == -1:
        raise MemoryError("addnorm CPU attn_res kernel could not allocate its scratch rows")
    if rc:
        raise ValueError(f"addnorm CPU attn_res kernel refused the call (code {rc})")


def attn_res(sources, query, weight, eps):
    *sources, query, weight = resolved(*sources, query, weight)
    sources = [v.contiguous() for v in sources]
    v0, S = sources[0], len(sources)
    C = v0.shape[-1]
    N = v0.numel() // C
    h = empty_rows_like(v0)
    alpha = torch.empty(v0.shape[:-1] + (S,), device="cpu", dtype=torch.float32)
    rstd = torch.empty(v0.shape[:-1] + (S,), device="cpu", dtype=torch.float32)
    vp = _pointers(sources)
    _run(FWD, DTYPE[v0.dtype], S, N, C, vp, _u(query, weight), float(eps), h, alpha, rstd, None, None, None, None,
         None)
    return h, alpha, rstd


def attn_res_backward(dh, sources, query, weight, alpha, rstd, eps):
    dh, *sources, query, weight = resolved(dh, *sources, query, weight)
    sources = [v.contiguous() for v in sources]
    dh = dh.contiguous()
    v0, S = sources[0], len(sources)
    C = v0.shape[-1]
    N = v0.numel() // C
    dsources = [empty_rows_like(v) for v in sources]
    du = torch.empty(C, device="cpu", dtype=torch.float32)
    _run(BWD, DTYPE[v0.dtype], S, N, C, _pointers(sources), _u(query, weight), float(eps), None, None, None, dh,
         alpha.contiguous(), rstd.contiguous(), _pointers(dsources), du)
    return dsources, du
