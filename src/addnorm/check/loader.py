"""Load ``NAME`` from ``FILE.py`` without installing it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_target(spec: str):
    """``path/to/file.py:Name`` -> the object named Name in that file."""
    if ":" not in spec:
        raise ValueError(f"expected FILE.py:NAME, got {spec!r} (e.g. my_norm.py:LayerNorm)")
    path_s, name = spec.rsplit(":", 1)
    path = Path(path_s)
    if path.is_dir():
        raise FileNotFoundError(f"{path}: a directory, not a Python file")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix != ".py":
        raise ValueError(f"{path}: not a .py file (expected FILE.py:NAME)")
    mod_name = f"_addnorm_check_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    if not hasattr(module, name):
        names = sorted(n for n in vars(module) if not n.startswith("_"))
        raise AttributeError(f"{path} has no {name!r}; it defines: {', '.join(names)}")
    return getattr(module, name)
