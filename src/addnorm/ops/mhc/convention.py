"""Where a model's mHC departs from the paper's equations, as data: one convention object that the same
operator (``mhc_pre``) takes, rather than a copy of the operator per model.

The paper (``formulas``): H_pre = sigmoid(.), H_post = 2 sigmoid(.), H_res = Sinkhorn-Knopp from exp(logits),
columns then rows in each round, no eps. DeepSeek-V4 (HuggingFace's ``DeepseekV4HyperConnection``, also
GLM-5-next's) projects in the same order (pre, post, res), scales post by 2 as well and computes every
coefficient in float32 with autocast off (as ``formulas`` always does), but

- adds eps to H_pre after the sigmoid;
- starts Sinkhorn from a softmax + eps and adds eps to every later normalisation's sums;
- normalises the rows of mat(logits) first and mixes the streams with the transpose of the result.

The last is the paper's column-first order on the transposed logits: transposing turns each row
normalisation into a column one, so H_res = SK_cols-first(mat(logits)^T), which is what ``res_transposed``
says (the matrix that multiplies X, as in the paper's H_res X).

HY-V4's iHC (``ops.hyper``'s ``ProjectedGates``) is the same read without the comb matrix: ``groups=2`` (the
projection makes H_pre and H_post, phi (nC, 2n); no H_res), H_post = ``post_scale`` sigmoid(.) + ``post_eps`` (its
hc_magnitude and hc_eps where the paper has 2 and 0); its final collapse, ``groups=1``, makes H_pre alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class MhcConvention:
    pre_eps: float = 0.0  # added to H_pre after its sigmoid
    sinkhorn_eps: float = 0.0  # Sinkhorn: the first normalisation's result + eps, every later sum + eps
    res_transposed: bool = False  # H_res's logits are mat(p_res)^T (rows normalised first, mixed transposed)
    post_scale: float = 2.0  # H_post = post_scale sigmoid(.) + post_eps (HY-V4: hc_magnitude)
    post_eps: float = 0.0  # (HY-V4: hc_eps)
    groups: int = 3  # the maps made: 3 H_pre, H_post, H_res; 2 no H_res (HY-V4's iHC); 1 H_pre alone (a head)

    def __post_init__(self):
        for name in ("pre_eps", "sinkhorn_eps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise ValueError(f"MhcConvention.{name} must be a finite non-negative float, got {v!r}")
        for name in ("post_scale", "post_eps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"MhcConvention.{name} must be a finite float, got {v!r}")
        if not isinstance(self.res_transposed, bool):
            raise TypeError(f"MhcConvention.res_transposed must be a bool, got {self.res_transposed!r}")
        if isinstance(self.groups, bool) or self.groups not in (1, 2, 3):
            raise ValueError(f"MhcConvention.groups must be 1 (H_pre), 2 (H_pre, H_post) or 3 (and H_res), got "
                             f"{self.groups!r}")

    @property
    def fields(self) -> tuple:
        """The operators' convention arguments: (pre_eps, res_eps, res_transposed, post_scale, post_eps, groups)."""
        return (float(self.pre_eps), float(self.sinkhorn_eps), self.res_transposed, float(self.post_scale),
                float(self.post_eps), int(self.groups))

    @property
    def is_paper(self) -> bool:
        """The paper's own equations (what the kernels compute)."""
        return self == PAPER

    @classmethod
    def deepseek_v4(cls, hc_eps: float) -> MhcConvention:
        """DeepSeek-V4's (and GLM-5-next's) hyper-connection, with its config's ``hc_eps``."""
        return cls(pre_eps=float(hc_eps), sinkhorn_eps=float(hc_eps), res_transposed=True)


PAPER = MhcConvention()
