"""Which kernel backends the shared tables run on: the CPU kernels, and the Triton kernels where Triton
is installed and runs here on CPU tensors (its interpreter; ``conftest`` sets TRITON_INTERPRET=1 on a
machine without CUDA). CI installs Triton (``make extras``), so there the Triton kernels always run."""

import importlib.util
import os

import addnorm
from addnorm.kernels.triton import availability as triton_availability

HAVE_TRITON = importlib.util.find_spec("triton") is not None
if not HAVE_TRITON and os.environ.get("CI"):
    raise RuntimeError("CI must run the Triton tests: .ci/run installs the extra (make extras)")

# the C extension is built with optional=True (a machine without a compiler still installs addnorm), so a build
# that fails leaves the CPU kernels out of every table below without a word: CI must not pass that way
if os.environ.get("CI") and not addnorm.cpu_kernel_availability().available:
    raise RuntimeError(f"CI must run the CPU kernels, and they did not load: {addnorm.cpu_kernel_availability().reason}")

TRITON = HAVE_TRITON and triton_availability().available and triton_availability().interpreted
NO_TRITON = "Triton is not installed (pip install -e '.[gpu]'); CI runs these"

KERNELS = (["cpu"] if addnorm.cpu_kernel_availability().available else []) + (["triton"] if TRITON else [])
BACKENDS = KERNELS + ["torch"]
