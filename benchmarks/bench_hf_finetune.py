"""HF Trainer fine-tuning of tiny Llama and GPT-2 models, patched by addnorm vs not: losses, step time, peak
memory. See ``addnorm.bench.hf_finetune``; writes benchmarks/results/hf_finetune.json.

    python benchmarks/bench_hf_finetune.py [--steps 60] [--families llama,gpt2]
"""

import sys

from addnorm.bench.hf_finetune import main

if __name__ == "__main__":
    sys.exit(main())
