"""The launch sweep's plumbing (benchmarks/tune_gpu.py) on CPU, with a stub timer: its settings, journal, ranking
and restoring of the parameters; and ADDNORM_TRITON_LAUNCH's parsing. The sweep's numbers need a GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from addnorm.bench import gpu_tune
from addnorm.kernels.triton import norm as triton_norm

ROOT = Path(__file__).resolve().parents[1]


def _timer(speed):
    """A stub timer: each setting 'runs' (once, so the parameters are set around a real call) and is given a time
    from ``speed(label)``."""
    def timer(fns):
        out = {}
        for lab, fn in fns.items():
            fn()
            out[lab] = SimpleNamespace(median_s=speed(lab) * 1e-3)
        return out
    return timer


def test_settings_are_the_grid_and_the_start_is_timed_beside_them(tmp_path):
    assert len(gpu_tune.settings("bwd")) == 2 * 3 * 3
    before = triton_norm.launch()
    seen = []

    def speed(lab):
        seen.append(lab)
        return 1.0 if "reduce_rows=1" in lab else 0.5 if lab == "reduce_block=64,reduce_rows=8" else 0.8

    cells = gpu_tune.run([(4, 8)], ["float32"], ["rms", "layer"], ["reduce"], tmp_path, timer=_timer(speed),
                         device="cpu")
    assert triton_norm.launch() == before  # every setting restored
    assert len(cells) == 2 and all(len(c["ms"]) == 6 for c in cells)  # the start (256, 1) is one of the grid's
    assert cells[0]["start"] == "reduce_block=256,reduce_rows=1"
    table, best = gpu_tune.summary(cells)
    assert best == {"reduce_block": 64, "reduce_rows": 8}
    assert "| `reduce_block=64,reduce_rows=8` | 0.500 | 0.500 | 0.500 |" in table
    # resumed from the journal: nothing is timed again
    again = gpu_tune.run([(4, 8)], ["float32"], ["rms", "layer"], ["reduce"], tmp_path,
                         timer=_timer(lambda lab: pytest.fail("timed again")), device="cpu")
    assert again == cells


def test_a_setting_is_in_force_during_its_call(tmp_path, monkeypatch):
    import addnorm.bench.gpu as gpu

    inside = []
    real = gpu.addnorm_method

    def spy(kind):
        f = real(kind)

        def g(*a):
            inside.append(triton_norm.launch())
            return f(*a)
        return g

    monkeypatch.setattr(gpu, "addnorm_method", spy)
    before = triton_norm.launch()
    cells = gpu_tune.run([(4, 8)], ["float32"], ["rms"], ["fwd"], tmp_path, timer=_timer(lambda lab: 1.0),
                         device="cpu")
    labels = list(cells[0]["ms"])
    assert len(inside) == len(labels) == 6  # the start (4096, 256) is one of the grid's
    for lab, launch in zip(labels, inside, strict=True):
        assert {k: launch[k] for k in ("tile", "elems_per_warp")} == {
            k: int(v) for k, v in (i.split("=") for i in lab.split(","))}
    assert triton_norm.launch() == before


def test_geomean_ratios_are_over_the_same_cells():
    cells = [{"ms": {"a": 2.0, "b": 1.0, "c": 9.0}}, {"ms": {"a": 4.0, "b": 8.0}}]
    g = gpu_tune.geomean_ratios(cells, "a")
    assert set(g) == {"a", "b"}  # c was timed in one cell only: not ranked against means over two
    assert g["a"] == 1.0 and g["b"] == pytest.approx(1.0)
    assert gpu_tune.geomean_ratios(cells + [{"ms": {"b": 1.0}}], "a") == {}  # no cell set has them all


def test_launch_env_is_parsed_and_refused_by_name():
    assert triton_norm.parse_launch("tile=8192, reduce_rows=8") == {"tile": 8192, "reduce_rows": 8}
    for bad, what in [("tiles=4", "unknown parameter 'tiles'"), ("tile=3", "power of two"),
                      ("tile=x", "must be an integer"), ("reduce_rows=0", "power of two"),
                      ("tile=1073741824", "from 1 to 65536"), ("programs_per_sm=128", "from 1 to 64")]:
        with pytest.raises(ValueError, match=what):
            triton_norm.parse_launch(bad)
    before = triton_norm.launch()
    with pytest.raises(ValueError, match="reduce_rows"):
        triton_norm.set_launch(tile=8192, reduce_rows=3)  # nothing set when any value is refused
    assert triton_norm.launch() == before
    code = "from addnorm.kernels.triton import norm; print(norm.launch()['tile'])"
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, ADDNORM_TRITON_LAUNCH="tile=8192"),
                       capture_output=True, text=True)
    assert r.stdout.strip() == "8192", r.stderr
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, ADDNORM_TRITON_LAUNCH="tile=5"),
                       capture_output=True, text=True)
    assert r.returncode != 0 and "tile must be a power of two from 1 to 65536, got 5" in r.stderr


def test_without_cuda_the_script_measures_nothing(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    # env: os.environ as Python sees it (a library in the suite may have changed the C-level environment), cwd the
    # repository root (the script's path is relative)
    run = dict(capture_output=True, text=True, env=dict(os.environ), cwd=ROOT)
    r = subprocess.run([sys.executable, "benchmarks/tune_gpu.py", "--out", str(tmp_path)], **run)
    assert r.returncode == 2 and "measures nothing" in r.stderr
    r = subprocess.run([sys.executable, "benchmarks/tune_gpu.py", "--sweeps", "fwd,nope", "--out", str(tmp_path)],
                       **run)
    assert r.returncode == 2 and "--sweeps" in r.stderr
    assert json.dumps(gpu_tune.SWEEPS)  # the grid is plain data


def test_the_backward_has_its_own_warps_and_the_sweep_sets_them():
    assert triton_norm.launch()["backward_elems_per_warp"] == 1024 and triton_norm.launch()["programs_per_sm"] == 2
    old = triton_norm.set_launch(tile=4096, elems_per_warp=256)
    try:
        rows = min(triton_norm.tile() // 2048, 64)  # (the interpreter's tile is larger than a GPU's)
        assert triton_norm.config(64, 2048)[3] == min(rows * 2048 // 256, 16)  # the forward's rule
        brows = min(rows, 16)
        assert triton_norm.config(64, 2048, 16, 1024)[3] == min(brows * 2048 // 1024, 16)  # the backward's
        assert triton_norm.warps(1 << 20) == 16 and triton_norm.warps(1 << 20, 8) == 8 and triton_norm.warps(1) == 1
    finally:
        triton_norm.set_launch(**old)
    assert "backward_elems_per_warp" in gpu_tune.SWEEPS["bwd"][1]
    names = [name for grid in gpu_tune.SWEEPS.values() for name in grid[1]]
    assert all(name in triton_norm.LAUNCH_PARAMS for name in names)
    assert len(names) == len(set(names))  # disjoint: the merged best setting is each sweep's own


def test_the_backward_tile_is_its_own_parameter(monkeypatch):
    """backward_tile sizes the backward's tiles apart from the forward's ``tile``: 4096 by default (the value the
    two shared), taking 2 to 8 rows of 4096 a step when set larger; the interpreter keeps its own tile."""
    assert triton_norm.launch()["backward_tile"] == 4096
    assert triton_norm.config(64, 4096, 16, 1024, tile_elems=16384)[0] == 4  # four rows of 4096 a tile
    assert triton_norm.config(64, 4096, 2, 1024, tile_elems=16384)[0] == 2  # at most backward_rows
    assert triton_norm.config(64, 4096)[0] == max(triton_norm.tile() // 4096, 1)  # the forward's rule, unchanged
    interpreted = triton_norm.availability().interpreted
    assert triton_norm.backward_tile() == (triton_norm._INTERPRETER_TILE if interpreted else 4096)
    forward_tile = triton_norm.launch()["tile"]
    old = triton_norm.set_launch(backward_tile=16384)
    try:
        monkeypatch.setattr(triton_norm, "availability", lambda: SimpleNamespace(interpreted=False))
        assert triton_norm.backward_tile() == 16384  # on a GPU: the parameter
        assert triton_norm.launch()["tile"] == forward_tile  # the forward's tile untouched
    finally:
        monkeypatch.undo()
        triton_norm.set_launch(**old)
    with pytest.raises(ValueError, match="backward_tile must be a power of two"):
        triton_norm.parse_launch("backward_tile=6000")
    assert gpu_tune.SWEEPS["bwd_tile"] == ("bwd", {"backward_tile": [4096, 8192, 16384, 32768]})
