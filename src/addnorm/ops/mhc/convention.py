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
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class MhcConvention:
    pre_eps: float = 0.0  # added to H_pre after its sigmoid
    sinkhorn_eps: float = 0.0  # Sinkhorn: the first normalisation's result + eps, every later sum + eps
    res_transposed: bool = False  # H_res's logits are mat(p_res)^T (rows normalised first, mixed transposed)

    def __post_init__(self):
        for name in ("pre_eps", "sinkhorn_eps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise ValueError(f"MhcConvention.{name} must be a finite non-negative float, got {v!r}")
        if not isinstance(self.res_transposed, bool):
            raise TypeError(f"MhcConvention.res_transposed must be a bool, got {self.res_transposed!r}")

    @property
    def is_paper(self) -> bool:
        """The paper's own equations (what the kernels compute)."""
        return self == PAPER

    @classmethod
    def deepseek_v4(cls, hc_eps: float) -> MhcConvention:
        """DeepSeek-V4's (and GLM-5-next's) hyper-connection, with its config's ``hc_eps``."""
        return cls(pre_eps=float(hc_eps), sinkhorn_eps=float(hc_eps), res_transposed=True)


PAPER = MhcConvention()
