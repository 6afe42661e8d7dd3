"""Modules: thin holders of parameters whose forward is one call into addnorm.functional."""

from .add_norm import AddLayerNorm, AddRMSNorm
from .layer_norm import LayerNorm
from .rms_norm import RMSNorm
from .tutorial import TutorialLayerNorm

__all__ = ["LayerNorm", "RMSNorm", "AddLayerNorm", "AddRMSNorm", "TutorialLayerNorm"]
