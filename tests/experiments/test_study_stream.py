"""What a study run keeps of its residual stream (stream.py): the RMS of each norm slot's input at every step of
the first 100 (the x of DyT's tanh(alpha x)), and the stream's RMS after the last block at the last step, in the
run's summary.json and the study's rows -- not only in metrics.jsonl, which is not committed. And BatchNorm's
train-mode loss and future leak, in every BatchNorm run's row."""

import json
import math

import pytest
import torch

from addnorm.experiments.study import RunConfig, StudyGrid, train_run
from addnorm.experiments.study import runner
from addnorm.experiments.study.config import UNIT_RMS
from addnorm.experiments.study.data import load_split
from addnorm.experiments.study.grid import run_study
from addnorm.experiments.study.stream import BlockStats, SlotStats, stream_summary

TINY = dict(depth=2, d_model=32, heads=2, seq_len=32, batch=4, steps=5, eval_every=5, eval_batches=1,
            checkpoint_every=5, warmup=0)


@pytest.fixture(scope="module")
def data():
    return load_split(max_bytes=1 << 20)


def _rms(t):
    return (t.double().pow(2).mean().sqrt()).item()


@pytest.mark.parametrize("norm", ["layer", "dyt"])
def test_each_slot_reads_the_stream_its_norm_normalizes(norm):
    """Pre-norm: block 0's attention norm reads the embedding, block i+1's the stream after block i, the final
    norm the stream after the last block -- checked against the embedding and the per-block stream RMS."""
    model = runner.build_model(RunConfig(**TINY, norm=norm))
    idx = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
    blocks, slots = BlockStats(model), SlotStats(model)
    slots.active = True
    model.train()
    model(idx)
    got = slots.read()
    after_block, _ = blocks.read()
    assert list(got) == ["attn", "mlp", "final"] and [len(v) for v in got.values()] == [2, 2, 1]
    with torch.no_grad():
        assert got["attn"][0] == pytest.approx(_rms(model.embed(idx)), rel=1e-5)
    assert got["attn"][1] == pytest.approx(after_block[0], rel=1e-5)
    assert got["final"][0] == pytest.approx(after_block[1], rel=1e-5)
    assert slots.read() == {}  # read once per step
    slots.active = False
    model(idx)
    assert slots.read() == {}  # off after the first steps
    model.eval()
    slots.active = True
    model(idx)
    assert slots.read() == {}  # an evaluation's forward is not a training step
    blocks.remove()
    slots.remove()


def test_post_norm_reads_the_sum_and_the_widened_stream_the_branch_input():
    post = runner.build_model(RunConfig(**TINY, placement="post"))
    slots = SlotStats(post)
    slots.active = True
    post(torch.zeros(1, 8, dtype=torch.long))
    assert [len(v) for v in slots.read().values()] == [2, 2]  # no final norm
    mhc = runner.build_model(RunConfig(**TINY, placement="mhc", n_streams=2))
    slots = SlotStats(mhc)
    slots.active = True
    mhc(torch.zeros(1, 8, dtype=torch.long))
    assert [len(v) for v in slots.read().values()] == [2, 2, 1]


def test_a_run_logs_the_slots_for_the_first_steps_and_keeps_them_with_the_last_stream_rms(data, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "EARLY_STEPS", 3)
    s = train_run(RunConfig(**TINY, norm="dyt"), data, tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "slot_rms" in m] == [0, 1, 2]
    assert [step for step, _ in s["early_slot_rms"]] == [0, 1, 2]
    assert s["early_slot_rms"][0][1]["attn"][0] == pytest.approx(lines[0]["slot_rms"]["attn"][0], rel=1e-4)
    assert s["last_stream_rms"] == lines[-1]["stream_rms"][-1] and s["last_stream_rms_per_block"] == \
        lines[-1]["stream_rms"]
    kept = json.loads((tmp_path / "summary.json").read_text())
    assert kept["last_stream_rms"] == s["last_stream_rms"] and kept["early_slot_rms"] == s["early_slot_rms"]
    old = {k: v for k, v in kept.items() if k not in ("last_stream_rms", "last_stream_rms_per_block",
                                                      "early_slot_rms")}
    (tmp_path / "summary.json").write_text(json.dumps(old))  # as a run finished before they were kept
    again = train_run(RunConfig(**TINY, norm="dyt"), data, tmp_path)
    assert again["reused"] and again["last_stream_rms"] == s["last_stream_rms"]
    assert again["early_slot_rms"] == s["early_slot_rms"]


def test_the_embedding_scale_sets_where_the_stream_starts(data, tmp_path, monkeypatch):
    """The audit's cause, measured: GPT-2's N(0, 0.02) embeddings start the stream at RMS ~0.03 (token plus
    position); the unit-RMS scale starts it at ~1."""
    monkeypatch.setattr(runner, "EARLY_STEPS", 1)
    start = {}
    for e in (None, UNIT_RMS):
        s = train_run(RunConfig(**{**TINY, "steps": 1, "eval_every": 1}, norm="dyt", embed_scale=e), data,
                      tmp_path / str(e))
        start[e] = s["early_slot_rms"][0][1]["attn"][0]
    assert start[None] == pytest.approx(0.02 * math.sqrt(2), rel=0.1)
    assert start[UNIT_RMS] == pytest.approx(1.0, rel=0.1)


def test_stream_summary_of_lines_without_the_stream():
    assert stream_summary([]) == {} and stream_summary([{"step": 0, "loss": 1.0}]) == {}


def test_every_batchnorm_run_records_its_train_mode_loss_and_future_leak_in_its_row(data, tmp_path):
    grid = StudyGrid(placements=("pre",), norms=("batch", "layer"), depths=(2,), lrs=(1e-3,), warmups=(0,),
                     seeds=(0,), base=RunConfig(**TINY))
    run_study(grid, data, tmp_path)
    rows = {r["norm"]: r for r in json.loads((tmp_path / "summary.json").read_text())["runs"]}
    assert rows["batch"]["future_leak"] > 0 and rows["layer"]["future_leak"] == 0.0
    assert all(math.isfinite(r["train_mode_val_loss"]) and math.isfinite(r["last_stream_rms"]) for r in rows.values())
    csv = (tmp_path / "summary.csv").read_text().splitlines()
    head = csv[0].split(",")
    assert {"future_leak", "train_mode_val_loss", "last_stream_rms"} <= set(head)


def test_a_batchnorm_run_finished_before_the_leak_was_recorded_gets_it_from_its_final_checkpoint(data, tmp_path):
    cfg = RunConfig(**TINY, norm="batch")
    s = train_run(cfg, data, tmp_path)
    old = {k: v for k, v in s.items() if k not in ("future_leak", "train_mode_val_loss")}
    (tmp_path / "summary.json").write_text(json.dumps(old))
    again = train_run(cfg, data, tmp_path)
    assert again["reused"] and again["future_leak"] == pytest.approx(s["future_leak"], rel=1e-5)
    assert again["train_mode_val_loss"] == pytest.approx(s["train_mode_val_loss"], rel=1e-5)
