"""Fused Add & Norm on a GPU: addnorm's Triton kernels vs eager vs torch.compile vs Liger / flash-attention
vs the device's copy bandwidth. See ``addnorm.benchmark.gpu``; writes benchmarks/results/add_norm_gpu.{csv,json}.

    python benchmarks/bench_gpu.py [--shapes 4096x4096,16384x8192,32768x2048] [--dtypes float32,bfloat16]
"""

import argparse
import sys

from addnorm.benchmark.gpu import add_arguments, main_from_args

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="bench_gpu.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(main_from_args(parser.parse_args()))
