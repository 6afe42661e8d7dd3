"""Old module paths that still import: one table, old dotted name -> new dotted name.

When a module moves (the layout in docs/architecture.md), user code that imported it by its old path keeps
working: ``import addnorm.placement`` imports ``addnorm.model.placement`` and registers the very same module
object under the old name, so classes, isinstance checks and monkeypatching agree across both names. A
``DeprecationWarning`` names the new path. Nothing in addnorm itself imports an old path (tests/test_layering.py).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old -> new; a package entry covers its submodules too (addnorm.benchmark.gpu -> addnorm.bench.gpu), and the
# longest entry that matches wins: a submodule that left its package (addnorm.benchmark.timing) has its own line
MOVED: dict[str, str] = {
    "addnorm.fused_functional": "addnorm.functional.fused",
    "addnorm.out_buffers": "addnorm.functional.buffers",
    "addnorm.pointwise_functional": "addnorm.functional.pointwise",
    "addnorm.stream_functional": "addnorm.functional.stream",  # (mhc_pre, which it also held, is functional.mhc's)
    "addnorm.placement": "addnorm.model.placement",
    "addnorm.store": "addnorm.harness.store",
    "addnorm.experiments.corpus": "addnorm.harness.corpus",
    "addnorm.benchmark": "addnorm.bench",
    "addnorm.benchmark.timing": "addnorm.harness.timing",
}


def new_name(old: str) -> str | None:
    """The new dotted path of an old module path, or None where ``old`` did not move."""
    for prefix in sorted(MOVED, key=len, reverse=True):  # the most specific entry first
        if old == prefix or old.startswith(prefix + "."):
            return MOVED[prefix] + old[len(prefix):]
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self._spec = module.__spec__  # the import machinery sets the alias's spec on it; exec_module puts it back
        return module

    def exec_module(self, module):  # the real module ran its code when it was imported under its new name
        module.__spec__ = self._spec

    def get_code(self, fullname):
        """``python -m <old path>`` (runpy asks the loader for code to run as __main__): code that runs the new
        module as __main__ under its own name, so that its relative imports are its own package's."""
        return compile(f"import runpy\nrunpy.run_module({self.new!r}, run_name='__main__', alter_sys=True)\n",
                       f"<{fullname} moved to {self.new}>", "exec")


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        spec = importlib.util.find_spec(new)
        if spec is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new),
                                               is_package=spec.submodule_search_locations is not None)


def install() -> None:
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
