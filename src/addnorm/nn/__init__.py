"""Modules: thin holders of parameters whose forward is one call into addnorm.functional."""

from .add_norm import AddLayerNorm, AddRMSNorm
from .derf import Derf
from .dyt import DyT
from .factory import NORM_KINDS, make_norm
from .layer_norm import LayerNorm
from .replace import replace_norms
from .rms_norm import RMSNorm
from .tutorial import TutorialLayerNorm

__all__ = ["LayerNorm", "RMSNorm", "AddLayerNorm", "AddRMSNorm", "TutorialLayerNorm", "DyT", "Derf", "make_norm", "NORM_KINDS",
           "replace_norms"]
