"""Shared sample tables (PyTorch OpInfo style): every parity test draws its inputs from here.

A sample is (leading shape, normalized_shape, layout). Layouts make stride bugs visible:
"contiguous", "permuted" (a transposed view), "sliced" (every other row of a bigger buffer filled
with NaN around the data, so reading outside the view poisons the result), "expanded" is used
for upstream gradients (stride 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sample:
    lead: tuple[int, ...]
    normalized_shape: tuple[int, ...]
    layout: str = "contiguous"

    @property
    def shape(self) -> tuple[int, ...]:
        return self.lead + self.normalized_shape

    @property
    def D(self) -> int:
        return math.prod(self.normalized_shape)

    def __str__(self) -> str:
        return f"{self.lead}x{self.normalized_shape}-{self.layout}"


SAMPLES = [
    Sample((4,), (8,)),
    Sample((0,), (16,)),  # zero rows
    Sample((3, 0), (5,)),  # zero rows, 2 leading dims
    Sample((7,), (1,)),  # normalized size 1
    Sample((5, 3), (123,)),
    Sample((2,), (769,)),
    Sample((3,), (3000,)),
    Sample((2, 3), (4, 5)),  # multi-dim normalized_shape
    Sample((6,), (2, 3, 7)),
    Sample((), (33,)),  # no leading dims at all
    Sample((9,), (64,), "permuted"),
    Sample((5, 4), (123,), "sliced"),
    Sample((8,), (769,), "sliced"),
    Sample((4, 6), (31,), "permuted"),
]


def make(sample: Sample, dtype=torch.float32, scale: float = 1.0, shift: float = 0.0, seed: int = 0,
         requires_grad: bool = False) -> torch.Tensor:
    """A tensor of sample.shape in sample.layout (values N(shift, scale²))."""
    g = torch.Generator().manual_seed(seed)
    shape = sample.shape
    if sample.layout == "contiguous":
        t = torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift
        t = t.to(dtype)
    elif sample.layout == "permuted":
        # build the transposed storage, then transpose back: same shape, non-unit strides
        n = len(shape)
        if n < 2:
            raise ValueError("permuted layout needs >= 2 dims")
        perm_shape = shape[:-2] + (shape[-1], shape[-2])
        base = (torch.randn(perm_shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)
        t = base.transpose(-1, -2)
        assert not t.is_contiguous() or t.numel() <= 1
    elif sample.layout == "sliced":
        big = torch.full((shape[0] * 2 + 1,) + shape[1:-1] + (shape[-1] + 3,), float("nan"), dtype=dtype)
        vals = (torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)
        t = big[1::2, ..., 2:2 + shape[-1]]
        t.copy_(vals)
    else:
        raise ValueError(sample.layout)
    if requires_grad:
        t.requires_grad_(True)
    return t


def upstream(sample: Sample, dtype=torch.float32, seed: int = 1, expanded: bool = False) -> torch.Tensor:
    """An upstream gradient; expanded=True gives stride-0 along the leading dims."""
    g = torch.Generator().manual_seed(seed)
    if expanded:
        row = torch.randn(sample.normalized_shape, generator=g, dtype=torch.float64).to(dtype)
        return row.expand(sample.shape)
    return torch.randn(sample.shape, generator=g, dtype=torch.float64).to(dtype)


def params(sample: Sample, dtype=torch.float32, seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    w = (1 + 0.5 * torch.randn(sample.normalized_shape, generator=g, dtype=torch.float64)).to(dtype)
    b = (0.5 * torch.randn(sample.normalized_shape, generator=g, dtype=torch.float64)).to(dtype)
    return w, b
