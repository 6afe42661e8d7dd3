from __future__ import annotations

import numbers


def as_normalized_shape(normalized_shape) -> tuple[int, ...]:
    """int or sequence -> tuple of ints, as torch.nn.LayerNorm accepts it."""
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    try:
        if isinstance(normalized_shape, str | bytes):
            raise TypeError
        return tuple(int(s) for s in normalized_shape)
    except (TypeError, ValueError):
        raise TypeError(f"normalized_shape must be an int or a tuple of ints, got {normalized_shape!r}") from None
