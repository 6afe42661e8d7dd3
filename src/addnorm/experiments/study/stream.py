"""What a study run reads of the residual stream at a training step, from forward hooks (training mode only: an
evaluation's forward leaves the step's values alone):

* ``BlockStats``: after each block, the stream's RMS and max|x| (every step; metrics.jsonl's ``stream_rms`` and
  ``stream_max``);
* ``SlotStats``: the RMS of what each norm that reads the stream normalizes -- the norm before a branch or after
  the residual sum, and the final norm -- per slot: ``{"attn": [per layer], "mlp": [per layer], "final": [one]}``
  (probe.py's slots, those of a per-slot DyT/Derf alpha0). That is the x of DyT's tanh(alpha x): where it starts
  against 1/alpha is what decides whether the bounded norm starts in its linear range. Logged for the first
  ``EARLY_STEPS`` steps only (metrics.jsonl's ``slot_rms``; the run's summary keeps them as ``early_slot_rms``).

A norm's forward returns ``(normed, x + residual)``: its second output is the sum it normalized.
"""

from __future__ import annotations

import torch
from torch import nn

from .probe import SLOTS, slot_of

EARLY_STEPS = 100
STREAM_NORMS = ("norm_before", "norm_sum", "ln_f")  # the norm slots whose input is the stream (not a branch's output)


def _rms(t: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(t.detach().float()) / t.numel() ** 0.5


class BlockStats:
    """Per-block residual-stream RMS and max|x| of the current step."""

    def __init__(self, model: nn.Module):
        n = len(model.h)
        self.values = [None] * (2 * n)  # tensors; read once per step (``read``)
        self.handles = [b.register_forward_hook(self._hook(i, n)) for i, b in enumerate(model.h)]

    def _hook(self, i, n):
        def hook(module, inputs, output):
            x, pending = output if isinstance(output, tuple) else (output, None)
            if not module.training:
                return
            if isinstance(x, list):  # Attention Residuals' depth state: the newest of its sources is the stream's
                x, pending = (x[-1] if pending is None else pending), None  # analogue (a block sum or partial sum)
            with torch.no_grad():
                s = x if pending is None else x + pending
                self.values[i] = torch.linalg.vector_norm(s) / s.numel() ** 0.5
                self.values[n + i] = s.abs().max()
        return hook

    def read(self) -> tuple[list[float], list[float]]:
        v = torch.stack(self.values).double().tolist()
        n = len(v) // 2
        return v[:n], v[n:]

    def remove(self):
        for h in self.handles:
            h.remove()


class SlotStats:
    """The RMS of each stream-reading norm's input at the current step, by slot, in forward order; on only while
    ``active`` (the runner sets it for the first EARLY_STEPS steps)."""

    def __init__(self, model: nn.Module):
        self.active = False
        self.values: list[tuple[str, torch.Tensor]] = []
        self.handles = [m.register_forward_hook(self._hook(slot_of(name)))
                        for name, m in model.named_modules() if name.rpartition(".")[2] in STREAM_NORMS]

    def _hook(self, slot: str):
        def hook(module, inputs, output):
            if self.active and module.training and isinstance(output, tuple):
                self.values.append((slot, _rms(output[1])))
        return hook

    def read(self) -> dict[str, list[float]]:
        """{slot: [RMS, ...]} of the step's forward (then cleared); {} where nothing was recorded."""
        out: dict[str, list[float]] = {}
        if self.values:
            got = torch.stack([v for _, v in self.values]).double().tolist()
            for (slot, _), v in zip(self.values, got):
                out.setdefault(slot, []).append(v)
        self.values = []
        return {s: out[s] for s in SLOTS if s in out}

    def remove(self):
        for h in self.handles:
            h.remove()


def _short(v: float) -> float:
    return float(f"{v:.5g}")


def stream_summary(lines: list[dict]) -> dict:
    """What the summary keeps of a run's stream, from its metrics lines: ``last_stream_rms`` (after the last block
    at the last step), ``last_stream_rms_per_block`` (every block at the last step) and ``early_slot_rms`` ([step,
    {slot: [RMS per layer]}] for every step that logged it: the first EARLY_STEPS, 5 significant digits); {} where
    the lines hold neither."""
    out = {}
    last = next((m for m in reversed(lines) if m.get("stream_rms")), None)
    if last is not None:
        out["last_stream_rms"] = last["stream_rms"][-1]
        out["last_stream_rms_per_block"] = last["stream_rms"]
    early = [[m["step"], {s: [_short(v) for v in vs] for s, vs in m["slot_rms"].items()}]
             for m in lines if m.get("slot_rms")]
    if early:
        out["early_slot_rms"] = early
    return out
