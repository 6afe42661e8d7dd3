"""addnorm: residual connections and normalization layers for transformers -- exact, fast, measured.

``import addnorm`` in a program that has imported torch loads the library at once (its functions, modules and
torch operators, ``torch.ops.addnorm.*``, registered). Imported before torch -- as the ``addnorm`` command is --
it loads on the first use of any of its names, so that ``addnorm --help`` answers without loading torch.
"""

import sys

from . import _moved

__version__ = "0.1.0"

_moved.install()  # old module paths keep importing (addnorm/_moved.py)

__all__ = [
    "functional",
    "nn",
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "tutorial_layer_norm",
    "layer_norm_add",
    "rms_norm_add",
    "parallel_add_layer_norm",
    "parallel_add_rms_norm",
    "add_dyt",
    "add_derf",
    "stream_read",
    "stream_write",
    "mhc_pre",
    "use_backend",
    "last_backend",
    "cpu_kernel_availability",
    "output_pool",
]


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
                                   "tutorial_layer_norm", "use_backend")},
    ".nn": {},
    ".fused_functional": {n: n for n in ("layer_norm_add", "parallel_add_layer_norm", "parallel_add_rms_norm",
                                         "rms_norm_add")},
    ".kernels.cpu": {"cpu_kernel_availability": "availability"},
    ".kernels.cpu.output_pool": {"output_pool": "POOL"},  # large outputs from recycled memory: .set_limit, .release
    ".pointwise_functional": {"add_derf": "add_derf", "add_dyt": "add_dyt"},
    ".stream_functional": {n: n for n in ("mhc_pre", "stream_read", "stream_write")},
}


def __getattr__(name: str):  # PEP 562: only for names not yet in the module
    if not name.startswith("__") and not _loading:
        _load()
        if name in globals():  # a public name, or a submodule the loading imported
            return globals()[name]
    raise AttributeError(f"module 'addnorm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if "torch" in sys.modules:
    _load()
