"""When a run's budget is too short for its outcome to say anything about its setting.

A run fails as ``plateau`` when its final validation loss is still at or above the unigram loss: it learned
nothing past byte frequencies. On a short budget every setting is still there: measured on this corpus, pre-norm
LayerNorm at 6 layers, d_model 64 and lr 3e-3 (the presets' fastest) ends at 3.171 nats after 100 steps, above the
plateau's 3.142, and at 2.991 after 150. A smoke run (``--steps 10`` to ``60``) reported every run, pre-norm
included, as failed. Such a run is *too short to judge*, not failed: below ``JUDGED_FROM`` steps of budget the
plateau is the budget's outcome, not the setting's. Divergence (``nan``, ``spike``) is judged at any budget.
"""

from __future__ import annotations

JUDGED_FROM = 200  # steps of budget: above the 150 at which pre-norm LayerNorm had left the plateau, with a margin


def too_short(failure: str | None, steps: int) -> bool:
    """Whether a run that ended with ``failure`` after a budget of ``steps`` is too short to judge."""
    return failure == "plateau" and steps < JUDGED_FROM
