"""The study's method file (method.json): recomputed from the code it must equal the committed file, and what it
says must be what the committed claims runs did -- their data's content hash, parameter counts and tokens."""

import json
from pathlib import Path

import pytest

from addnorm.experiments.study import method as M
from addnorm.experiments.study import runner
from addnorm.experiments.study.budget import form
from addnorm.experiments.study.config import RunConfig
from addnorm.experiments.study.data import load_split

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "study"


@pytest.fixture(scope="module")
def committed():
    return json.loads((RESULTS / "method.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def data():
    return load_split()


def test_the_committed_method_file_is_what_the_code_gives(committed, data):
    if data.digest != committed["corpus"]["digest"]:
        pytest.skip(f"this Python's standard library ({data.source}) is not the corpus method.json describes")
    assert M.to_json(M.facts(RESULTS, data)) == (RESULTS / "method.json").read_text(encoding="utf-8"), \
        "run python benchmarks/study_writeup.py"


def _committed_runs():
    for name in M.CLAIM_PRESETS:
        for path in sorted((RESULTS / name / "runs").glob("*/summary.json")):
            yield name, json.loads(path.with_name("config.json").read_text()), json.loads(path.read_text())


def test_the_method_is_what_the_committed_claims_runs_did(committed):
    """Every committed claims run trained on the split described, a model of the counted size, for the tokens
    stated (a run stopped by a failure or a flat curve: fewer)."""
    seen = 0
    for preset, config, summary in _committed_runs():
        p = committed["presets"][preset]
        cfg = RunConfig(**config["config"])
        assert config["data_digest"] == committed["corpus"]["digest"], summary["name"]
        assert summary["n_params"] == p["models"][form(cfg)], summary["name"]
        assert summary["val_bytes"] == committed["corpus"]["test_bytes"], summary["name"]
        planned = cfg.steps * cfg.batch * cfg.seq_len
        assert planned in p["tokens_per_run"], summary["name"]
        assert summary["tokens_seen"] == planned or summary["failed"] or summary["stopped_flat"], summary["name"]
        seen += 1
    if not seen:
        pytest.skip("no claims preset's runs are committed yet")


def test_the_optimizer_is_read_from_the_runner(monkeypatch):
    facts = M.training_facts()
    assert (facts["optimizer"], facts["betas"], facts["weight_decay"]) == (
        "AdamW", list(runner.BETAS), runner.WEIGHT_DECAY)
    monkeypatch.setattr(runner, "BETAS", (0.8, 0.95))
    assert M.training_facts()["betas"] == [0.8, 0.95]


def test_a_presets_epochs_are_its_tokens_over_the_training_bytes():
    p = M.preset_facts("claims_mixing", 1_000_000, None)
    assert p["tokens_per_run"] == [500 * 16 * 64] and p["epochs"] == [0.512]
    assert p["total_tokens"] == p["runs"] * 512_000 and p["cpu_hours"] is None
    assert set(p["models"]) == {"hc-layer-L6", "hc-layer-L24", "mhc-layer-L24"}
    assert p["n_params"] == [min(p["models"].values()), max(p["models"].values())]


def test_the_split_is_described_by_its_own_files(data):
    c = M.corpus_facts(data)
    assert c["splits"]["test"]["bytes"] == data.val_bytes and c["splits"]["dev"]["bytes"] == data.dev_bytes
    assert c["splits"]["train"]["files"] == len(data.train_files)
    assert c["splits"]["test"]["first"] == data.test_files[0] and c["digest"] == data.digest
