"""A block with its own sublayer, ``forward(x)`` (``x + self.mlp(self.ln(x))``), seen as ``f(x, sublayer)``.

Its sublayer is the submodules with parameters that are not norms: the check puts its chosen output in place of
the last one's and reads what the first one is given, so the block's residual wiring is judged like that of
``forward(x, sublayer)``. Dropout is off (eval mode) while it runs, so that the output is the sublayer's.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .adapters import Adapted


def _sublayers(m, x) -> list:
    """The children with parameters that are not norms, in the order a forward calls them."""
    import torch

    candidates = [c for _, c in m.named_children()
                  if "norm" not in type(c).__name__.lower() and any(True for _ in c.parameters())]
    order, handles = [], [c.register_forward_pre_hook(lambda mod, args: order.append(mod)) for c in candidates]
    try:
        with torch.no_grad():
            m(torch.as_tensor(x, dtype=torch.float32))
    except Exception:  # noqa: BLE001 - the norm checks will report it
        return []
    finally:
        for h in handles:
            h.remove()
    return list(dict.fromkeys(order))


class _Probe:
    def __init__(self, out):
        self.out = out

    def __call__(self, v):
        return self.out


def as_block(a: Adapted, d: int) -> Adapted | None:
    """``a`` as f(x, sublayer) if it is a torch module with a sublayer of its own, else None."""
    import torch

    m = a.module
    if m is None or a.second or a.kind != "torch-module":
        return None
    subs = _sublayers(m, np.zeros((1, 2, d)))
    if not subs:
        return None
    first, last = subs[0], subs[-1]

    def call(x, sublayer):
        def given(mod, args):
            sublayer(args[0].detach().double().numpy())

        def replaced(mod, args, out):
            return torch.as_tensor(sublayer.out, dtype=out.dtype)

        was_training = m.training
        handles = [first.register_forward_pre_hook(given), last.register_forward_hook(replaced)]
        m.eval()
        try:
            with torch.no_grad():
                out = m(torch.as_tensor(x, dtype=torch.float32))
        finally:
            m.train(was_training)
            for h in handles:
                h.remove()
        return tuple(o.detach().double().numpy() for o in (out if isinstance(out, tuple | list) else (out,)))

    try:  # a sublayer whose output is not shaped like x (a conditioning projection) makes no residual block
        call(np.zeros((1, 2, d)), _Probe(np.zeros((1, 2, d))))
    except Exception:  # noqa: BLE001
        return None
    names = [n for n, c in m.named_children() if c in subs]
    return replace(a, second="sublayer", call=call, torch_forward=None,
                   description=f"{a.description}, a block whose sublayer is self.{', self.'.join(names)}")
