import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

# Without a GPU the Triton kernels are tested in Triton's interpreter, on CPU tensors (backend="triton").
# Set before anything first uses Triton: the kernels are interpreted or compiled when first defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
