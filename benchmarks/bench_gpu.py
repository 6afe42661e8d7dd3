"""Fused Add & Norm on a GPU: addnorm's Triton kernels vs eager vs torch.compile vs Liger / flash-attention
vs the device's copy bandwidth. See ``addnorm.bench.gpu``; writes benchmarks/results/add_norm_gpu.{csv,json}.
With ``--ops``, the other fused forms too (norm_add, parallel, parallel2, dyt, derf, stream_read, stream_write,
mhc_pre, and mhc: mhc_pre + stream_write), against Liger-Kernel's kernels where it has them; see
``addnorm.bench.gpu_forms``; writes benchmarks/results/fused_forms_gpu.{json,md}.

    python benchmarks/bench_gpu.py [--shapes 4096x4096,16384x8192,32768x2048] [--dtypes float32,bfloat16]
    python benchmarks/bench_gpu.py --ops all        # add_norm and every other fused form
"""

import argparse
import sys

from addnorm.bench.gpu import add_arguments, main_from_args

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="bench_gpu.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(main_from_args(parser.parse_args()))
