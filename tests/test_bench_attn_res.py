"""benchmarks/bench_attn_res.py on a tiny model: it times every form against pre and writes what it says it does."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_attn_res", ROOT / "benchmarks" / "bench_attn_res.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TINY = ["--n-layer", "2", "--n-embd", "16", "--n-head", "2", "--vocab", "32", "--batch", "1", "--seq", "4",
        "--repeats", "1", "--min-runs", "2", "--max-runs", "2", "--budget-s", "0", "--calls", "1"]


def test_a_smoke_run_writes_every_form_against_pre(bench, tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert bench.main([*TINY, "--forms", "pre,attn_res,attn_res_block,pre@torch,attn_res@torch", "--block", "3",
                       "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["settings"]["block"] == 3 and r["paper"]["training_overhead_below"] == 0.04
    assert set(r["forms"]) == {"pre", "attn_res", "attn_res_block", "pre@torch", "attn_res@torch"}
    for f, v in r["forms"].items():
        assert len(v["train_step_s"]) == len(v["infer_s"]) == 1 and v["train_step_s"][0]["runs"] >= 2
        base = "pre@torch" if f.endswith("@torch") else "pre"
        pre = r["forms"][base]["train_step_s"][0]["median"]
        assert v["train_step_vs_pre"][0] == v["train_step_s"][0]["median"] / pre
    assert r["forms"]["attn_res"]["params"] > r["forms"]["pre"]["params"]  # the queries and key-norm weights
    assert "| attn_res_block |" in capsys.readouterr().out


def test_the_default_block_size_gives_the_papers_eight_blocks(bench):
    assert [bench.paper_block_size(n) for n in (1, 4, 12, 24, 27)] == [1, 1, 3, 6, 7]


@pytest.mark.parametrize("args, match", [(["--forms", "pre,post"], "--forms: unknown"), (["--block", "0"], "--block"),
                                         (["--repeats", "0"], "--repeats")])
def test_bad_options_are_named(bench, args, match, capsys):
    with pytest.raises(SystemExit):
        bench.main([*TINY, *args])
    assert match in capsys.readouterr().err
