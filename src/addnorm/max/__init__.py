"""addnorm on the Modular MAX framework (seed 004): GPT-2 LayerNorm, RMSNorm, fused Add & Norm and the
residual block as MAX modules, exact against the PyTorch backend.

Needs the ``max`` extra: ``pip install 'addnorm[max]'``. MAX compiles its kernels on first use (tens of
seconds per op on a cold cache); ``python -m addnorm.max.warm`` fills the on-disk cache once.
"""

from __future__ import annotations

from .environ import restored

with restored():
    try:
        import max.experimental  # noqa: F401
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("addnorm.max needs the MAX framework: pip install 'addnorm[max]'") from e

    from .convert import to_max, to_numpy, to_torch
    from .modules import AddLayerNorm, AddRMSNorm, LayerNorm, ResidualBlock, RMSNorm, apply_residual_connection
    from .state import layer_norm_from_state_dict, load_norm_weights

__all__ = ["LayerNorm", "RMSNorm", "AddLayerNorm", "AddRMSNorm", "ResidualBlock", "apply_residual_connection",
           "to_max", "to_numpy", "to_torch", "layer_norm_from_state_dict", "load_norm_weights"]
