"""What addnorm.diagnostics costs: one training step with the recorder attached, and after it is detached.

    python benchmarks/bench_diagnostics.py   -> prints, writes benchmarks/results/diagnostics_overhead.json
"""

import json
import sys
from pathlib import Path

import torch

from addnorm import diagnostics
from addnorm.harness.timing import measure
from addnorm.model import GPT, GPTConfig


def main() -> int:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, block_size=128, n_layer=12, n_head=4, n_embd=256))
    idx = torch.randint(0, 256, (8, 128), generator=torch.Generator().manual_seed(0))

    def step():
        model.zero_grad(set_to_none=True)
        model(idx, idx)[1].backward()

    before = measure(step, min_runs=15, budget_s=4).median_s
    with diagnostics.record(model) as rec:
        attached = measure(step, min_runs=15, budget_s=4).median_s
        n0 = len(rec.records)
        step()
        per_step = len(rec.records) - n0
    after = measure(step, min_runs=15, budget_s=4).median_s
    res = {"model": "GPT 12L x 256, batch 8x128", "step_ms_plain": before * 1e3, "step_ms_recording": attached * 1e3,
           "step_ms_after_detach": after * 1e3, "overhead_recording": attached / before - 1,
           "overhead_after_detach": after / before - 1, "records_per_step": per_step}
    for k, v in res.items():
        print(f"{k:24s} {v:.4g}" if isinstance(v, float) else f"{k:24s} {v}")
    d = Path(__file__).resolve().parent / "results"
    d.mkdir(exist_ok=True)
    (d / "diagnostics_overhead.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
