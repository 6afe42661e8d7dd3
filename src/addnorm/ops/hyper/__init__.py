"""Hyper-connections without a mixing matrix (HY-V4's iHC, Qwen4-exp's gated residual) as operators on the
(..., n, C) stream: ``hyper_read`` (the gates from the stream's own RMS, and the collapse), ``hyper_write`` (the
expand), ``stream_rms_norm`` and ``gated_collapse`` (the gated read in two passes around its low-rank gate). Each
convention is a frozen dataclass (``convention``), its numbers passed to the one operator; the operators' only
implementation so far is their exact torch formulas (``formulas``), registered as composites, which autograd,
torch.compile and the fake tensors see through."""

from . import convention, formulas, schema  # noqa: F401  (schema defines the operators)
