"""The frontier forms' cost at GPT-2-small width (n_streams 4): parameters, stream bytes per token,
training-step time and peak memory, each against "pre" (see addnorm.bench.frontier_cost).

    python benchmarks/bench_frontier_cost.py [--batch 4 --seq 128 --steps 3 --forms pre,hc,mhc]
"""

import sys

from addnorm.bench.frontier_cost import main

if __name__ == "__main__":
    sys.exit(main())
