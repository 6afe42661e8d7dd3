"""When has a validation curve flattened? The ``long`` preset's stopping rule, a function of the curve alone.

Rule: at an evaluation after ``t`` steps, the curve has flattened when the best validation loss of the last 20 %
of the steps improved on the best before them by less than 1 %:

    (best(v_s : s <= 0.8 t) - best(v_s : s <= t)) / best(v_s : s <= 0.8 t) < 0.01

judged only from the ``MIN_EVALS``-th evaluation on (earlier, 20 % of the steps holds too few evaluations to
tell a plateau from noise), and only where an evaluation lies at or before 0.8 t. The best, not the last, value:
one noisy evaluation neither stops a run nor keeps it going.

A curve whose last 20 % of the steps has not gone below ``plateau`` (the corpus's unigram loss: the model has
learned nothing past byte frequencies) has not flattened, however level it is: it is on the plateau, and runs
leave it late. (The last 20 %, not the whole curve: a run that dipped below the plateau early and went back onto
it is on the plateau.) A NaN evaluation in that window leaves the curve unjudged: it is not flat. In
``long`` two pre-norm DyT seeds sat just above it (3.24 nats, the unigram loss 3.14) for 700 steps and then
trained to 1.82-1.85 nats; the third was stopped at step 1000 as "flat" by the rule without this condition, and
resumed under it, left the plateau after step 1000 and trained to 1.94.
"""

from __future__ import annotations

import math

WINDOW = 0.2  # the last 20 % of the steps
MIN_GAIN = 0.01  # less than 1 % better over that window: flat
MIN_EVALS = 10


def _split(curve: list[tuple[int, float]]) -> tuple[list[float], list[float]]:
    """The losses of ``curve`` before and within its last ``WINDOW`` of the steps (NaNs kept)."""
    cut = (1.0 - WINDOW) * curve[-1][0]
    return [v for s, v in curve if s <= cut], [v for s, v in curve if s > cut]


def improvement(curve: list[tuple[int, float]]) -> float | None:
    """The relative improvement of the best loss over the last ``WINDOW`` of the steps of ``curve`` (pairs
    (steps done, validation loss), in order), or None where it cannot be judged yet."""
    if len(curve) < MIN_EVALS:
        return None
    before, window = (list(filter(math.isfinite, part)) for part in _split(curve))
    if not before:
        return None
    ref = min(before)
    return (ref - min(before + window)) / ref if ref > 0 else 0.0


def flatten_step(curve: list[tuple[int, float]], plateau: float = math.inf) -> int | None:
    """The steps done at the first evaluation where the curve had flattened below ``plateau``, or None."""
    for i in range(len(curve)):
        gain = improvement(curve[:i + 1])
        if gain is None or gain >= MIN_GAIN:
            continue
        window = _split(curve[:i + 1])[1]
        if all(math.isfinite(v) for v in window) and min(window) < plateau:
            return curve[i][0]
    return None
