"""benchmarks/bench_gated_read_floor.py at a tiny size: both modules timed, the GEMMs found in each by the
profiler (the module's own Linear layers: the same work patched and in HF), the floor they set written beside the
ratio, and bad sizes refused by name."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gated_read_floor",
                                                  ROOT / "benchmarks" / "bench_gated_read_floor.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiny_run_writes_the_floor(tmp_path, capsys):
    out = tmp_path / "floor.json"
    assert _bench().main(["--hidden", "64", "--tokens", "8", "--repeats", "2", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["streams"] == 4 and r["hidden"] == 64 and r["tokens"] == 8 and r["lowrank"] >= 1
    for k in ("hf", "patched"):
        assert 0 < r["module_ms"][k]["min"] <= r["module_ms"][k]["median"] <= r["module_ms"][k]["max"]
        assert r["gemm_ms"][k] > 0  # the gate's and the injection weights' GEMMs are found in both
    assert r["patched_over_hf"] == pytest.approx(r["module_ms"]["patched"]["median"] / r["module_ms"]["hf"]["median"])
    assert r["gemm_floor"] == pytest.approx(r["gemm_ms"]["patched"] / r["module_ms"]["hf"]["median"])
    assert "its floor (the GEMMs alone)" in capsys.readouterr().out


@pytest.mark.parametrize("arg", ["--hidden", "--tokens", "--repeats"])
def test_bad_sizes_are_refused_by_name(arg, capsys):
    with pytest.raises(SystemExit) as e:
        _bench().main([arg, "0"])
    assert e.value.code == 2 and arg in capsys.readouterr().err
