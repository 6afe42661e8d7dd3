"""What a study run measures inside the model at each evaluation, on one fixed validation batch in evaluation mode:

* ``saturation``: per DyT/Derf norm slot (``attn``, ``mlp``, ``final``), the fraction of the elements whose
  argument ``z = alpha * x (+ shift for Derf)`` has ``|z| > SATURATION_THRESHOLD`` = 2, where tanh'(2) = 0.07 and
  erf'(2) / erf'(0) = 0.02: the input has left the near-linear range and its gradient is mostly cut. This is the
  threshold of the saturation numbers of Verma 2026 (arXiv:2604.23434: 49 % of DyT activations saturated at 1M
  tokens, 23 % at 118M; their artifacts count |alpha x| > 2). ``alpha`` is each slot's mean learned alpha.
* ``composite_gain_fwd`` / ``composite_gain_bwd``: for a widened stream (hc, mhc, mhc_lite), per sub-layer in
  depth order, the mHC paper's Amax gain magnitude of the composite mixing products (``diagnostics.mixing``);
  the summary keeps the largest of the last evaluation.
"""

from __future__ import annotations

import torch
from torch import nn

from ...diagnostics.mixing import composite_gains
from ...nn import Derf, DyT

SATURATION_THRESHOLD = 2.0
SLOTS = ("attn", "mlp", "final")


def slot_of(name: str) -> str:
    """The norm slot of a module named in ``GPT.named_modules()``: inside a block's attention or feed-forward
    sub-layer, or the final norm."""
    parts = name.split(".")
    return "attn" if "attn" in parts else "mlp" if "mlp" in parts else "final"


def saturated(z: torch.Tensor, threshold: float = SATURATION_THRESHOLD) -> tuple[int, int]:
    """(how many elements of ``z`` have |z| > threshold, how many elements)."""
    return int((z.abs() > threshold).sum()), z.numel()


def bounded_argument(module: DyT | Derf, s: torch.Tensor) -> torch.Tensor:
    """The argument of the bounded function: alpha * s for DyT, alpha * s + shift for Derf."""
    z = module.alpha * s
    return z + module.shift if isinstance(module, Derf) else z


@torch.no_grad()
def probe(model: nn.Module, x: torch.Tensor) -> dict:
    """One forward of ``x`` in evaluation mode with hooks; the model's mode is restored. Returns only the
    measures the model has (an empty dict for a single-stream model with LayerNorm)."""
    counts = {s: [0, 0] for s in SLOTS}
    alphas: dict[str, list[float]] = {s: [] for s in SLOTS}
    h_res: list[torch.Tensor] = []
    handles = []

    def on_norm(module, args, output, slot):
        hit, total = saturated(bounded_argument(module, output[1]))
        counts[slot][0] += hit
        counts[slot][1] += total
        alphas[slot].append(float(module.alpha))

    for name, m in model.named_modules():
        if isinstance(m, DyT | Derf):
            handles.append(m.register_forward_hook(lambda mod, a, o, slot=slot_of(name): on_norm(mod, a, o, slot)))
        elif name.endswith("h_res_tap"):
            handles.append(m.register_forward_hook(lambda mod, a, o: h_res.append(o.detach())))
    was_training = model.training
    model.eval()
    try:
        model(x)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    out = {}
    if any(total for _, total in counts.values()):
        out["saturation"] = {s: hit / total for s, (hit, total) in counts.items() if total}
        out["alpha"] = {s: sum(v) / len(v) for s, v in alphas.items() if v}
    if h_res:
        gains = composite_gains(h_res)
        out["composite_gain_fwd"] = [g["composite_gain_fwd"] for g in gains]
        out["composite_gain_bwd"] = [g["composite_gain_bwd"] for g in gains]
    return out
