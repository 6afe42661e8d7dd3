"""Attention Residuals' depth mix as one operator (``attn_res``: each source's RMS, the logits against the learned
query, the softmax over depth and the weighted sum in one pass): schema, autograd and torch formulas as for
``ops.norm``."""

from . import autograd, formulas, schema  # noqa: F401  (schema defines the operators; autograd registers on them)
