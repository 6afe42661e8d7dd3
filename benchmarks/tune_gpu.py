"""Sweep the Triton kernels' launch parameters on this GPU; see ``addnorm.bench.gpu_tune``. Writes
benchmarks/results/gpu_tune/gpu_tune.{json,md} and prints the ADDNORM_TRITON_LAUNCH line of the best settings.

    python benchmarks/tune_gpu.py [--shapes 4096x4096,16384x8192,32768x2048] [--sweeps fwd,bwd,reduce]
"""

import argparse
import sys

from addnorm.bench.gpu_tune import add_arguments, main_from_args

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="tune_gpu.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(main_from_args(parser.parse_args()))
