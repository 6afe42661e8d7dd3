"""An end-to-end HF Trainer fine-tune of patched tiny models equals the unpatched one, step by step."""

import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")
pytest.importorskip("accelerate", reason="accelerate not installed (pip install -e '.[hf]'); HF Trainer needs it")

from addnorm.bench.hf_finetune import FinetuneConfig, run  # noqa: E402


@pytest.mark.parametrize("family, adds", [("llama", 4), ("gpt2", 4), ("neox", 2), ("olmo2", 4)])
def test_trainer_losses_equal_the_unpatched_run(family, adds):
    cfg = FinetuneConfig(family=family, steps=6, batch=4, seq_len=32, hidden=64, layers=2, heads=2, lr=3e-3, warmup=0)
    hf, ours = run(cfg, patched=False), run(cfg, patched=True)
    assert ours["fused_adds"] == adds and len(ours["losses"]) == len(hf["losses"]) == 6
    assert hf["losses"][-1] < hf["losses"][0]  # it trains
    for a, b in zip(ours["losses"], hf["losses"]):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (ours["losses"], hf["losses"])


def test_config_and_command_line_are_validated():
    with pytest.raises(ValueError, match="family must be one of"):
        FinetuneConfig(family="bert")
    with pytest.raises(ValueError, match="steps must be positive"):
        FinetuneConfig(steps=0)
    for args, msg in ((["--families", "bert"], "--families: unknown"), (["--steps", "2"], "--steps must be at least"),
                      (["--hidden", "0"], "--hidden must be positive"), (["--hidden", "66"], "--hidden must be a multiple")):
        p = subprocess.run([sys.executable, "-m", "addnorm.bench.hf_finetune", *args], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2 and msg in p.stderr
