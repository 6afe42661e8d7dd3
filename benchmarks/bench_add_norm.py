"""Fused Add & Norm vs eager PyTorch vs torch.compile vs the memory-bandwidth floor.

    python benchmarks/bench_add_norm.py [--shapes 8192x1024,...] [--allocator tuned|default]

Writes benchmarks/results/add_norm_<allocator>.{csv,json}; `python benchmarks/readme_table.py`
puts the headline numbers into README.md and the full tables into docs/performance-journal.md. Same as
`addnorm bench`.
"""

import sys

from addnorm.bench.add_norm import add_arguments, main_from_args

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="bench_add_norm.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(main_from_args(parser.parse_args()))
