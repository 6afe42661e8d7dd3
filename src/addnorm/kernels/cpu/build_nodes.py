"""Build the C++ autograd nodes (``autograd_nodes.cpp``) against the installed torch, beside ``nodes.py``:

    python -m addnorm.kernels.cpu.build_nodes [-v] [--optional]

``make setup`` runs it. ``--optional``: a failed build (no C++ compiler) is reported and exits 0, and the
Python nodes run instead.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from .nodes import NAME, SOURCE, TARGET


def build(verbose: bool = False) -> Path:
    """Compile ``autograd_nodes.cpp`` against the installed torch and put it beside this file."""
    from torch.utils import cpp_extension

    bindir = os.path.dirname(sys.executable)  # pip's `ninja` lives beside the interpreter of a virtual env
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    with tempfile.TemporaryDirectory(prefix="addnorm-nodes-") as tmp:
        cpp_extension.load(NAME, sources=[str(SOURCE)], build_directory=tmp, extra_cflags=["-O2"], verbose=verbose)
        built = Path(tmp) / (NAME + ".so")
        part = TARGET.with_suffix(".so.partial")
        shutil.copyfile(built, part)
        os.replace(part, TARGET)  # a process that already loaded the old file keeps its mapping
    return TARGET


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        path = build(verbose="-v" in args)
    except Exception as e:  # a machine without a C++ compiler still runs addnorm: the Python nodes do the work
        print(f"addnorm: the C++ autograd nodes were not built ({type(e).__name__}: {e}); the Python nodes will "
              "run instead", file=sys.stderr)
        return 0 if "--optional" in args else 1
    print(f"addnorm: built {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
