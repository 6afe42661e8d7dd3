"""The mHC paper's measure of a widened stream: the Amax gain magnitude of the stream-mixing matrices.

mHC (arXiv:2512.24880, section 3.1, Figures 3 and 7): for sub-layer l of L (attention and FFN counted apart),
the single-layer mapping H_res_l and the composite mapping prod_{i=1}^{L-l} H_res_{L-i} = H_res_{L-1} ... H_res_l
(eq. 4: what carries the stream entering sub-layer l to the top). The Amax gain magnitude of a mapping A is its
maximum absolute row sum, max_i sum_j |A_ij| (the forward signal's worst-case growth), and its maximum absolute
column sum, max_j sum_i |A_ij| (the backward gradient's), "averaged over all tokens in a selected sequence":
computed per token (H_res depends on the token), then averaged. The paper reports up to ~3000 for HC and ~1.6 for
mHC at 27B (both the largest over the composite mappings; mHC's is the backward one: Sinkhorn-Knopp ends on the
rows, so every row of mHC's H_res sums to 1 exactly and so does every row of a product of them -- mHC's forward
gain is 1 by construction, and only the columns, normalized one round earlier, can drift).
"""

from __future__ import annotations

import torch


def _gains(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(forward, backward) Amax gain of every (n, n) matrix of ``a`` (..., n, n): max absolute row / column sum."""
    a = a.double().abs()
    return a.sum(-1).amax(-1), a.sum(-2).amax(-1)


@torch.no_grad()
def amax_gain(a: torch.Tensor) -> tuple[float, float]:
    """(forward, backward) Amax gain magnitude of one (n, n) matrix: max_i sum_j |a_ij|, max_j sum_i |a_ij|."""
    f, b = _gains(a)
    return f.item(), b.item()


@torch.no_grad()
def composite_gains(h_res: list[torch.Tensor]) -> list[dict[str, float]]:
    """Per sub-layer l (h_res[l] of shape (..., n, n), per token): the gains of H_res_l and of the composite mapping
    H_res_{L-1} ... H_res_l, each computed per token and then averaged over the tokens."""
    n = h_res[0].shape[-1]
    hs = [h.double().reshape(-1, n, n) for h in h_res]
    out, prod = [None] * len(hs), None
    for i in range(len(hs) - 1, -1, -1):  # from the top down: prod = H_{L-1} ... H_i
        prod = hs[i] if prod is None else prod @ hs[i]
        hf, hb = _gains(hs[i])
        cf, cb = _gains(prod)
        out[i] = {"h_res_gain_fwd": hf.mean().item(), "h_res_gain_bwd": hb.mean().item(),
                  "composite_gain_fwd": cf.mean().item(), "composite_gain_bwd": cb.mean().item()}
    return out
