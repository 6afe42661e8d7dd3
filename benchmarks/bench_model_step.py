"""One GPT-2-small-shaped training step: fused Add & Norm vs eager add + LayerNorm (time, peak memory).

    python benchmarks/bench_model_step.py [--batch 4 --seq 128 --steps 5]
"""

import sys

from addnorm.bench.model_step import main

if __name__ == "__main__":
    sys.exit(main())
