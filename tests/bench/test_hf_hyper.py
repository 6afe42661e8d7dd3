"""benchmarks/bench_hf_hyper.py at a tiny size (hidden 64, 1 layer): every family timed eager and patched, the
patched model's outputs HF's, the hyper-connections' shares in [0, 1] beside the bounds they set; a method that
fails recorded and the others timed; and the share measurement (``bench.hyper_share``) counting what it says on a
model whose times are known."""

import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")

from addnorm.bench import hf_hyper  # noqa: E402
from addnorm.bench.hf_hyper import HyperBenchConfig  # noqa: E402
from addnorm.bench.hf_hyper_models import FAMILIES, HyperModelConfig, build, hf_config  # noqa: E402
from addnorm.bench.hyper_share import HyperShare  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--hidden", "64", "--layers", "1", "--batch", "1", "--seq", "8", "--prompt", "4", "--new-tokens", "2",
        "--repeats", "2", "--share-repeats", "1", "--threads", "1"]
KINDS = ("forward", "backward", "step", "decode")


class _NoCompiler(nn.Module):
    def forward(self, *args, **kwargs):
        raise RuntimeError("no compiler on this test machine")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run of the script's main: eager, patched and a compile that fails (torch.compile is slow to try here)."""
    spec = importlib.util.spec_from_file_location("bench_hf_hyper", ROOT / "benchmarks" / "bench_hf_hyper.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path_factory.mktemp("hf_hyper") / "sub" / "r.json"
    mp = pytest.MonkeyPatch()
    mp.setattr(hf_hyper.torch, "compile", lambda model: _NoCompiler())
    threads = torch.get_num_threads()  # --threads 1 sets torch's for the process: the tests after keep theirs
    try:
        assert script.main([*TINY, "--out", str(out)]) == 0
    finally:
        mp.undo()
        torch.set_num_threads(threads)
    return json.loads(out.read_text())


def test_the_results_say_where_and_how_they_were_measured(run):
    m = run["machine"]
    for key in ("processor", "cores", "torch", "torch_threads", "transformers", "addnorm_isa", "date", "device"):
        assert m[key] not in (None, ""), key
    assert run["config"]["hidden"] == 64 and run["config"]["layers"] == 1 and run["config"]["repeats"] == 2
    assert [r["family"] for r in run["results"]] == list(FAMILIES)
    assert run["table"][0].startswith("| model | method | training step, ms")


@pytest.mark.parametrize("i", range(len(FAMILIES)), ids=FAMILIES)
def test_each_family_is_timed_and_the_patched_model_is_hfs(run, i):
    r = run["results"][i]
    assert r["hf_config"]["hidden_size"] == 64 and r["hf_config"]["num_hidden_layers"] == 1
    assert set(r["train"]) == set(r["decode"]) == {"eager", "patched"}
    assert "no compiler on this test machine" in r["errors"]["compile"]
    for kind in ("train", "decode"):
        for name, t in r[kind].items():
            assert t["runs"] == 2 and 0 < t["p10_ms"] <= t["median_ms"] <= t["p90_ms"]
        assert r["speedup"][kind]["patched"] == pytest.approx(r[kind]["eager"]["median_ms"]
                                                              / r[kind]["patched"]["median_ms"])
    assert r["decode"]["eager"]["tokens_per_s"] == pytest.approx(2 / (r["decode"]["eager"]["median_ms"] / 1e3))
    c = r["check"]["patched"]
    assert c["max_abs_logits"] <= 1e-5 and c["abs_loss"] <= 1e-5 and c["max_abs_grad"] <= 1e-5
    assert c["grads_missing"] == 0 and c["same_tokens"]
    assert r["patch_report"]["final_collapse"] == 1 and r["patch_report"]["hyper_connections"] == 3


@pytest.mark.parametrize("i", range(len(FAMILIES)), ids=FAMILIES)
def test_the_shares_are_fractions_and_bound_the_speedups(run, i):
    r = run["results"][i]
    for name in ("eager", "patched"):
        for kind in KINDS:
            s = r["share"][name][kind]
            assert 0 < s["share"] < 1 and s["modules_ms"] >= 0 and s["writes_ms"] > 0, (name, kind, s)
            assert s["hyper_ms"] == pytest.approx(s["modules_ms"] + s["writes_ms"])
            assert s["share"] == pytest.approx(s["hyper_ms"] / s["total_ms"])
        step, fwd, bwd = (r["share"][name][k] for k in ("step", "forward", "backward"))
        assert step["hyper_ms"] == pytest.approx(fwd["hyper_ms"] + bwd["hyper_ms"])
    for kind in KINDS:
        b, hf, ours = r["bounds"][kind], r["share"]["eager"][kind], r["share"]["patched"][kind]
        assert b["bound"] == pytest.approx(1 / (1 - hf["share"]))
        assert b["patched_share_over_hf"] == pytest.approx(ours["share"] / hf["share"])
        t = hf["total_ms"]
        assert b["predicted"] == pytest.approx(t / (t - hf["hyper_ms"] + ours["hyper_ms"]))


# A model whose parts take known times (sleeps), forward and backward: a layer calls a hyper-connection, a norm,
# its branch, then writes the stream inline -- what the share must count is the hyper-connection and the write.
HC, NORM, BRANCH, WRITE = 0.02, 0.005, 0.04, 0.01  # forward seconds; backward: twice these


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(2 * ctx.seconds)
        return g, None


class _Part(nn.Module):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        return _Sleep.apply(x, self.seconds)


class ToyHyperConnection(_Part):  # its class names it a hyper-connection
    pass


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_hc, self.norm, self.branch = ToyHyperConnection(HC), _Part(NORM), _Part(BRANCH)

    def forward(self, x):
        y = self.branch(self.norm(self.attn_hc(x)))
        return _Sleep.apply(x + y, WRITE)  # the inline write


class _Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_Layer(), _Layer()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_the_share_counts_the_hyper_connections_and_the_writes_and_nothing_else():
    """Each part's time within half the branch's (whose time counted would overshoot it): the modules and the
    writes forward and backward, the norm and the branch left out."""
    model, x = _Toy(), torch.randn(3, 4, requires_grad=True)
    with HyperShare(model) as hs:
        out, fwd, intervals = hs.forward(lambda: model(x))
        bwd = hs.backward(intervals, lambda: out.sum().backward())
    slack = BRANCH / 2
    for s, k in ((fwd, 1), (bwd, 2)):
        assert 2 * k * HC <= s.modules_s < 2 * k * HC + slack, (k, s)
        assert 2 * k * WRITE <= s.writes_s < 2 * k * WRITE + slack, (k, s)
        assert s.total_s >= 2 * k * (HC + NORM + BRANCH + WRITE)
        assert 0 < s.share < 1


def test_the_hooks_leave_the_patched_models_hand_offs_in_place(monkeypatch):
    """The hooks are global, not the modules' own: a pre-hook on a hyper-connection would turn its hand-off off,
    and the patched model measured would not be the one timed. Every write still hands its read over (4 in 2
    layers) and the patched share counts it."""
    from addnorm.interop import handoff, patch_hf_model

    m = patch_hf_model(build(HyperModelConfig("deepseek_v4", hidden=64, layers=2)))
    handed = []
    real = handoff.take
    monkeypatch.setattr(handoff, "take", lambda mod, x: handed.append(real(mod, x)) or handed[-1])
    ids = torch.randint(1, 512, (1, 8), generator=torch.Generator().manual_seed(0))
    with HyperShare(m) as hs:
        out, fwd, intervals = hs.forward(lambda: m(input_ids=ids, labels=ids, use_cache=False))
        bwd = hs.backward(intervals, lambda: out.loss.backward())
    assert sum(h is not None for h in handed) == 4
    assert not any(mod._forward_pre_hooks for mod in m.modules())
    assert fwd.writes_s > 0 and bwd.writes_s > 0 and bwd.modules_s > 0


def test_a_model_without_hyper_connections_is_refused_by_name():
    with pytest.raises(ValueError, match="has no hyper-connection module"):
        HyperShare(nn.Sequential(nn.Linear(2, 2)))


@pytest.mark.parametrize("kw, match", [(dict(hidden=0), "hidden must be a positive integer"),
                                       (dict(repeats=0), "repeats must be"),
                                       (dict(methods=("patched",)), "methods must include 'eager'"),
                                       (dict(families=("llama",)), "families must be distinct values of"),
                                       (dict(methods=("eager", "eager")), "methods must be distinct")])
def test_the_config_names_a_bad_value(kw, match):
    with pytest.raises(ValueError, match=match):
        HyperBenchConfig(**kw)


def test_the_command_line_names_a_bad_option(capsys):
    for args, match in ((["--hidden", "100"], "hidden must be a multiple of 64"),
                        (["--families", "deepseek_v4,bert"], "families must be distinct values"),
                        (["--threads", "0"], "--threads must be a positive integer")):
        with pytest.raises(SystemExit) as e:
            hf_hyper.main([*TINY, *args])
        assert e.value.code == 2 and match in capsys.readouterr().err


def test_the_models_have_four_streams_and_few_experts():
    for fam in FAMILIES:
        cfg = hf_config(HyperModelConfig(fam, hidden=2048))[0]
        assert getattr(cfg, "hc_mult", getattr(cfg, "hc_count", None)) == 4 and cfg.hidden_size == 2048
        assert getattr(cfg, "n_routed_experts", getattr(cfg, "num_experts", None)) == 4
        assert cfg.num_experts_per_tok == 2
    m = build(HyperModelConfig("hy_v4", hidden=64, layers=1))
    assert m.dtype == torch.float32 and not m.training
    again = build(HyperModelConfig("hy_v4", hidden=64, layers=1))
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), again.state_dict().values()))
