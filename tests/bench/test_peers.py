"""The CPU engines as benchmark methods (addnorm.bench.peers): each computes Add & Norm as addnorm does, judged
against the float64 oracle relative to PyTorch's own error in the same dtype; the benchmark times them forward
only, in their dtypes, and skips one that is not installed, saying so."""

import functools
import importlib.util
import json
import os

import pytest
import torch
import torch.nn.functional as F

from addnorm.bench import add_norm, peers
from addnorm.bench.report import bandwidth_table, summary_table
from addnorm.cli.main import main
from addnorm.harness.timing import measure_interleaved
from addnorm.reference import oracle

INSTALLED = [p for p in peers.PEERS if peers.missing(p) is None]
if os.environ.get("CI") and len(INSTALLED) < len(peers.PEERS):
    raise RuntimeError("CI must run the peer tests: make extras installs the peers extra "
                       f"({'; '.join(peers.missing(p) for p in peers.PEERS if p not in INSTALLED)})")


def _installed(name):
    return pytest.param(name, marks=pytest.mark.skipif(name not in INSTALLED, reason=f"{peers.missing(name)}; CI "
                                                                                      "runs these"))


PEER_PARAMS = [_installed(p) for p in peers.PEERS]
SHAPES = [(4, 8), (5, 123), (2, 769), (64, 768)]


def _inputs(kind, n, d, dtype, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s, sd=1.0, mu=0.0: (torch.randn(*s, generator=g, dtype=torch.float64) * sd + mu).to(dtype)  # noqa: E731
    x, r = mk(n, d, sd=2 * scale, mu=0.5 * scale), mk(n, d, sd=scale)
    w, b = mk(d, sd=0.5, mu=1.0), mk(d, sd=0.5)
    return x, r, w, (b if kind == "layer" else None)


def _err(t, ref):
    return (t.double() - torch.from_numpy(ref)).abs().max().item()


def _reference(kind, x, r, w, b, eps):
    """The oracle's y, and eager PyTorch's in the working dtype (the yardstick of what rounding costs)."""
    d = x.shape[-1]
    if kind == "layer":
        return oracle.add_layer_norm(x, r, w, b, eps)[0], F.layer_norm(x + r, (d,), w, b, eps)
    return oracle.add_rms_norm(x, r, w, eps)[0], F.rms_norm(x + r, (d,), w, eps)


@pytest.mark.parametrize("scale", [1.0, 0.01], ids=["unit", "small"])  # small: eps is felt in the result
@pytest.mark.parametrize("n, d", SHAPES, ids=[f"{n}x{d}" for n, d in SHAPES])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("name", PEER_PARAMS)
def test_peer_matches_the_float64_oracle(name, kind, dtype, n, d, scale):
    """(norm(x + r), x + r) with the benchmark's eps: the sum exactly torch's rounded x + r (what addnorm returns),
    the norm within 5x eager PyTorch's own error in the dtype (a graph wired with another eps, or without gamma
    or beta, is far outside it)."""
    if dtype not in peers.dtypes(name):
        pytest.skip(f"{name} does not run {dtype}")
    tdt = getattr(torch, dtype)
    x, r, w, b = _inputs(kind, n, d, tdt, scale)
    eps = add_norm.EPS[kind]
    y, s = peers.method(name, peers.PeerCell(kind, n, d, dtype, eps, 2))(x, r, w, b)
    assert y.dtype == s.dtype == tdt and y.shape == s.shape == (n, d)
    assert torch.equal(s, x + r)
    ref, eager = _reference(kind, x, r, w, b, eps)
    assert _err(y, ref) <= 5 * _err(eager, ref), (_err(y, ref), _err(eager, ref))


@pytest.mark.parametrize("name", PEER_PARAMS)
def test_a_wrong_eps_is_outside_the_bound(name):
    """The bound above can fail: the same graph built with LayerNorm's eps for an RMSNorm cell misses it."""
    x, r, w, _ = _inputs("rms", 64, 768, torch.float32, scale=0.01)
    y, _ = peers.method(name, peers.PeerCell("rms", 64, 768, "float32", 1e-5, 2))(x, r, w)
    ref, eager = _reference("rms", x, r, w, None, add_norm.EPS["rms"])
    assert _err(y, ref) > 5 * _err(eager, ref)


@pytest.mark.parametrize("name", PEER_PARAMS)
def test_inputs_that_move_are_bound_again_and_new_weights_rebuild_the_graph(name):
    """The peers bind the caller's memory and bake the weights in: a call with other tensors, or after the weights
    changed in place, must see them."""
    f = peers.method(name, peers.PeerCell("layer", 8, 64, "float32", 1e-5, 2))
    x, r, w, b = _inputs("layer", 8, 64, torch.float32)
    f(x, r, w, b)
    x2, r2 = x.flip(0).contiguous(), r * 3
    y, s = f(x2, r2, w, b)
    assert torch.equal(s, x2 + r2)
    assert _err(y, oracle.add_layer_norm(x2, r2, w, b, 1e-5)[0]) < 1e-5
    w.mul_(-2)
    b.add_(1)
    y, _ = f(x2, r2, w, b)
    assert _err(y, oracle.add_layer_norm(x2, r2, w, b, 1e-5)[0]) < 1e-5


@pytest.mark.parametrize("name", PEER_PARAMS)
def test_bad_inputs_name_the_argument(name):
    f = peers.method(name, peers.PeerCell("rms", 4, 8, "float32", 1e-6, 1))
    x, r, w, _ = _inputs("rms", 4, 8, torch.float32)
    with pytest.raises(ValueError, match=r"residual: .* \(4, 8\) float32, got \(4, 9\)"):
        f(x, torch.zeros(4, 9), w)
    with pytest.raises(ValueError, match="x: .*got \\(4, 8\\) torch.float64"):
        f(x.double(), r, w)
    with pytest.raises(ValueError, match=r"weight: .*reads contiguous memory"):
        f(x, r, torch.randn(16)[::2])
    with pytest.raises(ValueError, match="bias: RMSNorm has none"):
        f(x, r, w, w)


def test_a_cell_is_checked():
    with pytest.raises(ValueError, match="kind: expected 'layer' or 'rms', got 'batch'"):
        peers.PeerCell("batch", 4, 8, "float32", 1e-5, 2)
    with pytest.raises(ValueError, match="dtype: expected float32, float16 or bfloat16, got 'float64'"):
        peers.PeerCell("rms", 4, 8, "float64", 1e-5, 2)
    with pytest.raises(ValueError, match="threads: expected an integer >= 1, got 0"):
        peers.PeerCell("rms", 4, 8, "float32", 1e-5, 0)
    with pytest.raises(ValueError, match="peer: unknown 'tvm'; known: onnxruntime, openvino"):
        peers.missing("tvm")


@pytest.mark.skipif("onnxruntime" not in INSTALLED, reason="ONNX Runtime is not installed; CI runs this")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_onnxruntime_runs_the_skip_norm_kernel_in_16_bits(kind, dtype, tmp_path):
    """ONNX Runtime would insert Casts around a node whose dtype its CPU provider lacks, timing a float32 kernel
    and two conversions: the optimized graph is the one node."""
    import onnx
    import onnxruntime as ort

    from addnorm.bench.peers import onnxruntime as port

    cell = peers.PeerCell(kind, 4, 8, dtype, 1e-5, 1)
    _, _, w, b = _inputs(kind, 4, 8, getattr(torch, dtype))
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(port.graph(cell, w, b).SerializeToString(), so, providers=["CPUExecutionProvider"])
    nodes = [(n.op_type, n.domain) for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert nodes == [(port.OPS[kind], "com.microsoft")]


@pytest.mark.skipif("openvino" not in INSTALLED, reason="OpenVINO is not installed; CI runs this")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_openvino_never_computes_with_fewer_bits_than_the_data(dtype):
    """OpenVINO's CPU default on a CPU with bfloat16 instructions computes a float32 model in bfloat16."""
    from addnorm.bench.peers import openvino as pov

    cell = peers.PeerCell("rms", 4, 8, dtype, 1e-5, 1)
    _, _, w, _ = _inputs("rms", 4, 8, getattr(torch, dtype))
    got = str(pov.compiled(cell, w, None).get_property("INFERENCE_PRECISION_HINT"))
    allowed = {"float32": {"float32"}, "float16": {"float16", "float32"}, "bfloat16": {"bfloat16", "float32"}}
    assert got.removeprefix("<Type: '").removesuffix("'>") in allowed[dtype], got


# ---------------------------------------------------------------- in the benchmark


@pytest.fixture
def quick(monkeypatch):
    """Two timed calls a method: these tests check what is measured, not how fast."""
    monkeypatch.setattr(add_norm, "measure_interleaved",
                        functools.partial(measure_interleaved, min_runs=2, max_runs=2, budget_s=0, warmup_s=0))
    monkeypatch.setattr(add_norm, "copy_floor_gbps", lambda: 10.0)


@pytest.mark.skipif(len(INSTALLED) < len(peers.PEERS), reason="a peer is not installed; CI runs this")
def test_the_benchmark_times_the_peers_forward_in_their_dtypes(quick):
    rows = add_norm.run_benchmark([(8, 64)], ["float32", "bfloat16"], ["layer", "rms"], ["fwd", "bwd"],
                                  ["addnorm", "eager", *peers.PEERS], floor=10.0)
    measured = {(r.kind, r.dtype, r.mode, r.method) for r in rows}
    for kind in ("layer", "rms"):
        for dt in ("float32", "bfloat16"):
            assert {m for k, d, mode, m in measured if (k, d, mode) == (kind, dt, "fwd")} == \
                {"addnorm", "eager", *peers.PEERS}
            assert {m for k, d, mode, m in measured if (k, d, mode) == (kind, dt, "bwd")} == {"addnorm", "eager"}
    assert all(r.gbps > 0 and r.frac_of_floor > 0 for r in rows)
    table = bandwidth_table(rows)
    assert "| ONNX Runtime | OpenVINO |" in table.splitlines()[0] and len(table.splitlines()) == 2 + 4


def test_an_unknown_method_is_refused_with_the_peers_listed(tmp_path, capsys):
    assert main(["bench", "--out", str(tmp_path), "--methods", "addnorm,tvm"]) == 2
    err = capsys.readouterr().err
    assert "--methods: unknown value(s) tvm; valid: addnorm, eager, compile, onnxruntime, openvino" in err
    assert not list(tmp_path.iterdir())


def test_a_missing_peer_is_skipped_and_said(quick, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(peers, "missing", lambda name: f"{name}: {name} not installed ({peers.INSTALL})")
    code = main(["bench", "--out", str(tmp_path), "--methods", "addnorm,openvino", "--shapes", "4x8",
                 "--dtypes", "float32", "--kinds", "rms", "--modes", "fwd", "--allocator", "current"])
    assert code == 0
    out = capsys.readouterr().out
    assert "skipped: openvino: openvino not installed (pip install 'addnorm[peers]')" in out
    res = json.loads((tmp_path / "add_norm_current.json").read_text())
    assert [r["method"] for r in res["rows"]] == ["addnorm"]
    assert res["conditions"]["peers_skipped"] == {"openvino": "openvino: openvino not installed "
                                                               "(pip install 'addnorm[peers]')"}
    assert main(["bench", "--out", str(tmp_path), "--methods", "openvino", "--shapes", "4x8",
                 "--allocator", "current"]) == 2
    assert "--methods: nothing left to measure" in capsys.readouterr().err


@pytest.mark.skipif("onnxruntime" not in INSTALLED, reason="ONNX Runtime is not installed; CI runs this")
def test_a_run_records_the_engine_versions_and_shows_them_beside_addnorm(quick, tmp_path, capsys):
    import onnxruntime

    code = main(["bench", "--out", str(tmp_path), "--methods", "addnorm,eager,onnxruntime", "--shapes", "4x8",
                 "--dtypes", "float16", "--kinds", "layer", "--modes", "fwd,bwd", "--allocator", "current"])
    assert code == 0
    out = capsys.readouterr().out
    assert f"ORT: ONNX Runtime {onnxruntime.__version__}" in " ".join(out.split())
    res = json.loads((tmp_path / "add_norm_current.json").read_text())
    assert res["conditions"]["peers"] == {"onnxruntime": onnxruntime.__version__}
    assert sorted((r["mode"], r["method"]) for r in res["rows"]) == [
        ("bwd", "addnorm"), ("bwd", "eager"), ("fwd", "addnorm"), ("fwd", "eager"), ("fwd", "onnxruntime")]


def test_the_peers_are_imported_only_when_built():
    """An optional extra: addnorm's benchmark imports without them (the registry finds packages, never loads)."""
    import subprocess
    import sys

    code = ("import sys; import addnorm.bench.add_norm, addnorm.bench.report; "
            "from addnorm.bench import peers; [peers.missing(p) for p in peers.PEERS]; "
            "print(sorted(m for m in ('onnxruntime', 'onnx', 'openvino') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _rows_with_engines(mode="fwdbwd"):
    """A committed run's rows with two engine columns beside them (their times eager's, scaled)."""
    from pathlib import Path

    res = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/add_norm_tuned.json").read_text())
    rows = res["rows"]
    extra = [dict(r, method=p, median_ms=r["median_ms"] * k, gbps=r["gbps"] / k, frac_of_floor=r["frac_of_floor"] / k)
             for r in rows if r["method"] == "eager" and r["mode"] == "fwd" for p, k in zip(peers.PEERS, (1.3, 0.7))]
    return rows + extra, res["conditions"] | {"peers": {p: "1.2.3" for p in peers.PEERS}}


def test_the_terminal_table_with_the_engines_fits_80_columns():
    from rich.console import Console

    rows, cond = _rows_with_engines()
    console = Console(width=80, record=True)
    console.print(summary_table(rows, cond, "benchmarks/results/add_norm_tuned.csv"))
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80 and "…" not in text
    lines = [line.split() for line in text.splitlines() if line.split()[:1] in (["layer"], ["rms"])]
    assert {len(r) for r in lines} == {10}  # eager, compile, ORT, OV ("-" in the backward cells)
    assert all(r[8:] == ["-", "-"] for r in lines if r[3] != "fwd")


def test_the_bandwidth_table_shows_every_method_and_the_fastest_rival():
    rows, _ = _rows_with_engines()
    table = bandwidth_table(rows).splitlines()
    assert table[0] == ("| norm | dtype | shape | floor GB/s | addnorm | eager | compile | ONNX Runtime | OpenVINO | "
                        "addnorm vs the fastest other |")
    fwd = {(r["kind"], r["dtype"], r["rows"], r["hidden"]) for r in rows if r["mode"] == "fwd"}
    assert len(table) == 2 + len(fwd)
    first = min(fwd)
    by = {r["method"]: r for r in rows if (r["kind"], r["dtype"], r["rows"], r["hidden"]) == first and r["mode"] == "fwd"}
    cells = table[2].strip("| ").split(" | ")
    assert cells[4] == f"{by['addnorm']['gbps']:.1f} ({by['addnorm']['frac_of_floor']:.2f})"
    assert cells[8] == f"{by['openvino']['gbps']:.1f} ({by['openvino']['frac_of_floor']:.2f})"
    best = min((m for m in by if m != "addnorm"), key=lambda m: by[m]["median_ms"])
    names = {"openvino": "OpenVINO", "onnxruntime": "ONNX Runtime"}
    assert cells[9] == f"{by[best]['median_ms'] / by['addnorm']['median_ms']:.2f}× ({names.get(best, best)})"


@pytest.mark.skipif("onnxruntime" not in INSTALLED, reason="ONNX Runtime is not installed; CI runs this")
def test_the_docs_tables_are_made_from_each_machines_results_file(quick, tmp_path, monkeypatch):
    """docs/performance.md's tables beside the engines: one per results file under benchmarks/results/peers/, its
    machine and versions from the file's conditions, every number from its rows."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "readme_table", Path(__file__).resolve().parents[2] / "benchmarks" / "readme_table.py")
    rt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rt)
    monkeypatch.setattr(rt, "RESULTS", tmp_path)
    monkeypatch.setattr(rt, "PEERS_RESULTS", tmp_path / "peers")
    assert rt.peers_tables().startswith("No run is committed yet")
    for machine in ("one", "two"):
        assert main(["bench", "--out", str(tmp_path / "peers" / machine), "--methods", "addnorm,onnxruntime",
                     "--shapes", "4x8", "--dtypes", "float32", "--kinds", "rms", "--modes", "fwd",
                     "--allocator", "current"]) == 0
        (tmp_path / "peers" / machine / "add_norm_current.json").rename(tmp_path / "peers" / machine /
                                                                        "add_norm_tuned.json")
    text = rt.peers_tables()
    for machine in ("one", "two"):
        res = json.loads((tmp_path / "peers" / machine / "add_norm_tuned.json").read_text())
        assert f"(`peers/{machine}/add_norm_tuned.json`):" in text
        assert bandwidth_table(res["rows"]) in text
    assert text.count("ONNX Runtime " + res["conditions"]["peers"]["onnxruntime"]) == 2
