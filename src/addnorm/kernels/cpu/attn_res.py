"""Host side of Attention Residuals' CPU kernels (``attn_res_rows.h``)."""

from __future__ import annotations


def applies(sources, query, weight) -> bool:
    return False
