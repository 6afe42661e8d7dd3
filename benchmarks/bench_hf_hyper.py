"""HF's hyper-connection decoders (DeepSeek-V4, HY-V4, Qwen4-exp) as HF builds them, patched by addnorm and
compiled by torch.compile: a training step and cached decoding, side by side, with the hyper-connections' share of
each in HF and patched and the speedup that share bounds. See ``addnorm.bench.hf_hyper``.

    python benchmarks/bench_hf_hyper.py [--hidden 2048] [--layers 2] [--batch 4 --seq 256] [--out FILE]

Writes ./addnorm-results/bench_hf_hyper.json unless --out says where.
"""

import sys

from addnorm.bench.hf_hyper import main

if __name__ == "__main__":
    sys.exit(main())
