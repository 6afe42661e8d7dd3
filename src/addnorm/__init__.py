"""addnorm: residual connections and normalization layers for transformers -- exact, fast, measured.

``import addnorm`` in a program that has imported torch loads the library at once (its functions, modules and
torch operators, ``torch.ops.addnorm.*``, registered). Imported before torch -- as the ``addnorm`` command is --
it loads on the first use of any of its names or right after torch's own import, whichever comes first, so
``addnorm --help`` answers without loading torch while ``import addnorm; import torch`` still finds
``torch.ops.addnorm.*`` registered.
"""

import importlib.abc
import importlib.util
import sys

from . import _moved

__version__ = "0.1.0"

_moved.install()  # old module paths keep importing (addnorm/_moved.py)



_loading = False


def _load() -> None:
    """Import the library: every public name, and the torch operators its modules register."""
    global _loading
    if _loading:
        return
    _loading = True  # a submodule's ``from .. import functional`` asks this module for the name meanwhile
    try:
        from importlib import import_module

        for module, names in _PUBLIC.items():
            m = import_module(module, __name__)
            globals().update({public: getattr(m, own) for public, own in names.items()})
    finally:
        _loading = False


# module -> {public name: its name there}
_PUBLIC = {
    ".functional": {n: n for n in ("add_layer_norm", "add_rms_norm", "last_backend", "layer_norm", "rms_norm",
                                   "tutorial_layer_norm", "use_backend", "layer_norm_add", "parallel_add_layer_norm",
                                   "parallel_add_rms_norm", "rms_norm_add", "add_derf", "add_dyt", "mhc_pre",
                                   "stream_read", "stream_write")},
    ".nn": {},
    ".kernels.cpu": {"cpu_kernel_availability": "availability"},
    ".kernels.cpu.output_pool": {"output_pool": "POOL"},  # large outputs from recycled memory: .set_limit, .release
}


__all__ = ["functional", "nn", *(public for names in _PUBLIC.values() for public in names)]


def __getattr__(name: str):  # PEP 562: only for names not yet in the module
    if not name.startswith("__") and not _loading:
        _load()
        if name in globals():  # a public name, or a submodule the loading imported
            return globals()[name]
    raise AttributeError(f"module 'addnorm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _LoadAfterTorch(importlib.abc.MetaPathFinder):
    """Loads addnorm right after torch's own import finishes, so its operators are registered for any program
    that imports addnorm first (as isort orders ``import addnorm`` before ``import torch``)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # one shot; and the search below must not find this finder again
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_torch = spec.loader.exec_module

        def exec_module(module):
            run_torch(module)
            del spec.loader.exec_module  # the loader as it was
            try:
                _load()
            except Exception:  # noqa: BLE001 -- torch imported fine; addnorm's own error comes at its first use
                pass

        spec.loader.exec_module = exec_module
        return spec


if "torch" in sys.modules:
    _load()
else:
    sys.meta_path.insert(0, _LoadAfterTorch())
