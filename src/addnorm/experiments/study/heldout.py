"""The loss on a split read whole: every byte after the first predicted exactly once, from non-overlapping
sequences -- no random draw, so every run is measured on the same bytes.

A split of n + 1 bytes x_0 .. x_n is cut into windows of T = ``seq_len`` targets: window i has the inputs
x[iT : (i+1)T] and the targets x[iT+1 : (i+1)T+1] (the last window shorter where T does not divide n). Each byte is
predicted from the bytes before it in its window (0 to T - 1 of them, as in training, where a sequence starts
anywhere), in evaluation mode, and the loss is

    L = -(1/n) sum_{j=1..n} log p(x_j | its window's bytes before it),

each window's sum accumulated in float64 (a mean of per-batch means would weight the short last window as a whole
one).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from .data import SplitCorpus

SEQUENCES = 64  # windows per forward pass (a fixed number: the same arithmetic, so the same loss, on every call)


@torch.no_grad()
def heldout_loss(model, data: torch.Tensor, seq_len: int, sequences: int = SEQUENCES) -> float:
    """L above, of ``model`` (which returns logits (B, T, vocab) for ids (B, T)) on ``data`` (uint8 bytes); the
    model's training mode is restored."""
    n = len(data) - 1
    if n < 1:
        raise ValueError(f"data: a split to read whole needs at least 2 bytes, got {len(data)}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be an integer >= 1, got {seq_len!r}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    whole = n // seq_len
    x = data[:whole * seq_len].view(whole, seq_len)  # (windows, T)
    y = data[1:whole * seq_len + 1].view(whole, seq_len)
    total = torch.zeros((), dtype=torch.float64)
    for i in range(0, whole, sequences):
        total += _nll_sum(model, x[i:i + sequences], y[i:i + sequences], device)
    if whole * seq_len < n:  # the last, shorter window
        total += _nll_sum(model, data[whole * seq_len:n][None], data[whole * seq_len + 1:][None], device)
    model.train(was_training)
    return (total / n).item()


def _nll_sum(model, x: torch.Tensor, y: torch.Tensor, device) -> torch.Tensor:
    """The summed -log p of the targets ``y`` (B, T) given the inputs ``x`` (B, T), in float64 on the CPU."""
    logits = model(x.long().to(device))  # (B, T, vocab)
    nll = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.long().reshape(-1).to(device),
                          reduction="sum")
    return nll.double().cpu()


def final_losses(model, data: SplitCorpus, seq_len: int, diverged: bool = False) -> dict:
    """A run's final losses, each split read whole: the test split (``final_val_loss``, what every claim reads, over
    ``val_bytes`` bytes; the seconds it took as ``test_eval_seconds``) and the dev split (``final_dev_loss``, what
    picks a claim's learning rate, over ``dev_bytes``), with the test split's plateau (``test_unigram_nats``). A
    run that ``diverged`` (NaN) is not measured: NaN losses."""
    out = {"val_bytes": data.val_bytes, "dev_bytes": data.dev_bytes, "test_unigram_nats": data.test_unigram_nats}
    if diverged:
        return {"final_val_loss": float("nan"), "final_dev_loss": float("nan"), **out, "test_eval_seconds": None}
    t0 = time.perf_counter()
    test = heldout_loss(model, data.test, seq_len)
    seconds = time.perf_counter() - t0
    return {"final_val_loss": test, "final_dev_loss": heldout_loss(model, data.dev, seq_len), **out,
            "test_eval_seconds": seconds}
