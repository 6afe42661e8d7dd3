"""`addnorm check FILE.py:NAME`: validate someone's LayerNorm / RMSNorm / residual implementation."""

from .checks import check_target
from .loader import load_target
from .result import CheckResult

__all__ = ["CheckResult", "check_target", "load_target"]
