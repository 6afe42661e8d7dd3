"""Value residual learning (Zhou et al. 2024, ResFormer, arXiv:2410.17897)."""

from __future__ import annotations

import torch
from torch import nn

LAMBDA_INIT = (0.5, 0.5)  # ResFormer's lambda_1 = lambda_2 = 0.5; learnable here


class FirstValues:
    """The first layer's attention values (``v1``), handed to every later layer of one forward.

    A plain object, not a dict or a dataclass: wrappers that rebuild the containers in a module's arguments (FSDP2's
    mixed-precision cast of every block's inputs; FSDP1's and DDP's moves to a device) hand each block its own copy of
    a dict, so the first block's values never reached the second. They pass this object through as it is.

    ``with_grad`` records whether autograd was on when ``v1`` was stored. Reentrant activation checkpointing
    (``torch.utils.checkpoint(..., use_reentrant=True)``) runs every block's forward without it and recomputes each
    with it in the backward: a later layer then mixes in a ``v1`` that has no graph, and the gradient through it to
    the first layer and the embedding would be lost without a word. That case raises instead.
    """

    __slots__ = ("v1", "with_grad")

    def __init__(self) -> None:
        self.v1: torch.Tensor | None = None
        self.with_grad = False


def value_residual_mix(v: torch.Tensor, v1: torch.Tensor, lambdas: torch.Tensor) -> torch.Tensor:
    r"""V_n' = lambda_1 V_n + lambda_2 V_1: layer n's values mixed with the first layer's."""
    return lambdas[0] * v + lambdas[1] * v1


class ValueResidual(nn.Module):
    """The first layer stores its values in ``values.v1`` (a ``FirstValues``); every later layer mixes them in."""

    def __init__(self, first_layer: bool):
        super().__init__()
        self.first_layer = first_layer
        if first_layer:
            self.register_parameter("lambdas", None)
        else:
            self.lambdas = nn.Parameter(torch.tensor(LAMBDA_INIT))

    def reset_parameters(self) -> None:
        if self.lambdas is not None:
            with torch.no_grad():
                self.lambdas.copy_(torch.tensor(LAMBDA_INIT))

    def forward(self, v: torch.Tensor, values: FirstValues | None) -> torch.Tensor:
        if not isinstance(values, FirstValues):
            raise TypeError("value_residual: the attention needs values=FirstValues() shared by the model's layers "
                            "(addnorm.model.value_residual; GPT passes one, a block called alone must be given one too), "
                            f"got {type(values).__name__}")
        if self.first_layer:
            values.v1, values.with_grad = v, torch.is_grad_enabled()
            return v
        if values.v1 is None:
            raise ValueError("value_residual: values.v1 is unset: the first layer must run before this one")
        if torch.is_grad_enabled() and not values.with_grad:
            raise RuntimeError("value_residual: the first layer's values were computed without autograd and this layer "
                               "runs with it, so their gradient would be lost. Reentrant activation checkpointing does "
                               "this (the first layer's values reach later layers outside a checkpointed block's "
                               "inputs): use torch.utils.checkpoint(..., use_reentrant=False). Running the first block "
                               "under no_grad and later ones with autograd does it too: freeze its parameters with "
                               "requires_grad_(False) instead")
        return value_residual_mix(v, values.v1, self.lambdas)
