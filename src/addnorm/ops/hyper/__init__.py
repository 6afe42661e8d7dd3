"""Hyper-connections without a mixing matrix (HY-V4's iHC, Qwen4-exp's gated residual) as operators on the
(..., n, C) stream: ``hyper_read`` (the gates from the stream's own RMS, and the collapse), ``hyper_write`` (the
expand), and Qwen4-exp's gated read in two passes around its low-rank gate: ``hyper_stream_norm`` (or
``hyper_write_norm``, the write before it with the norm of its result) and ``hyper_sigmoid_gated_collapse`` (the
collapse from the gates' logits; ``hyper_gated_collapse`` takes the gates themselves). Each convention is a frozen
dataclass (``convention``), its numbers passed to the one operator. The read runs on mhc_pre's kernels, the norm,
the write+norm and the sigmoid-gated collapse on their own C kernels (``schema``, ``autograd``); their exact torch
formulas (``formulas``) everywhere else."""

from . import autograd, convention, formulas, schema  # noqa: F401  (schema defines the operators, autograd their backward)
