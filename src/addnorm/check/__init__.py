"""`addnorm check FILE.py:NAME`: validate someone's LayerNorm / RMSNorm / residual implementation."""

from .checks import CheckResult, check_target
from .loader import load_target

__all__ = ["CheckResult", "check_target", "load_target"]
