"""The GPU benchmark of the fused forms (addnorm.bench.gpu_forms), run on the CPU at a tiny size: its plumbing
(every op, norm and mode; the methods; the rows, the files, the journal, --ops), with torch.compile and the timer
stood in for, and Liger-Kernel replaced by torch versions of the Functions it calls -- written from Liger's
kernels (liger_kernel/ops/mhc.py, fused_add_rms_norm.py, rms_norm.py, dyt.py) with their argument checks -- so
that the adapters' argument order and coefficient conventions are checked against addnorm's own ops. No GPU."""

import argparse
import json
import sys
import time
import types

import pytest
import torch

from addnorm.bench import fused_forms, gpu, gpu_cells, gpu_forms
from addnorm.harness.timing import Timing

SHAPE = (8, 16)  # tokens (rows) x C (hidden)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one intra-op thread (a second one, woken per op on a busy machine, costs milliseconds)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --- Liger-Kernel's Functions, in torch (forward only; autograd differentiates them) ---------------------------

class _Coeffs:
    @staticmethod
    def apply(x, phi, b, alpha_pre, alpha_post, alpha_res, allow_fp32, tmax, rms_eps, pre_eps, sinkhorn_eps,
              post_mult):
        assert x.dtype in ((torch.bfloat16, torch.float16, torch.float32) if allow_fp32 else
                           (torch.bfloat16, torch.float16))
        assert x.dim() >= 3
        hc, c = x.shape[-2:]
        m = hc * hc + 2 * hc
        assert phi.shape == (hc * c, m) and b.shape == (m,) and b.dtype == torch.float32
        assert alpha_pre.dim() == alpha_post.dim() == alpha_res.dim() == 0
        v = x.reshape(-1, hc * c).float()
        mix = (v @ phi.float()) * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + rms_eps)
        pre = torch.sigmoid(mix[:, :hc] * alpha_pre + b[:hc]) + pre_eps
        post = torch.sigmoid(mix[:, hc:2 * hc] * alpha_post + b[hc:2 * hc]) * post_mult
        logits = mix[:, 2 * hc:].view(-1, hc, hc) * alpha_res + b[2 * hc:].view(hc, hc)
        mat = torch.softmax(logits, -1) + sinkhorn_eps  # a row softmax, then a column normalization
        mat = mat / (mat.sum(-2, keepdim=True) + sinkhorn_eps)
        for _ in range(tmax - 1):
            mat = mat / (mat.sum(-1, keepdim=True) + sinkhorn_eps)
            mat = mat / (mat.sum(-2, keepdim=True) + sinkhorn_eps)
        outer = x.shape[:-2]
        return pre.view(*outer, hc), post.view(*outer, hc), mat.view(*outer, hc, hc)


class _Pre:
    @staticmethod
    def apply(x, h_pre):
        return (x.float() * h_pre.float().unsqueeze(-1)).sum(-2).to(x.dtype)


class _PostRes:
    @staticmethod
    def apply(x, f_out, h_post, h_res):
        out = torch.einsum("...oi,...ic->...oc", h_res.float(), x.float())
        return (out + h_post.float().unsqueeze(-1) * f_out.float().unsqueeze(-2)).to(x.dtype)


def _rms(s, w, eps, offset):
    return (s.float() * torch.rsqrt(s.float().pow(2).mean(-1, keepdim=True) + eps)).to(s.dtype) * (w + offset)


class _FusedAddRMSNorm:
    @staticmethod
    def apply(X, R, W, eps, offset=0.0, casting_mode="llama", in_place=False):
        assert not in_place and casting_mode == "llama"
        s = X + R
        return _rms(s, W, eps, offset), s


class _RMSNorm:
    @staticmethod
    def apply(X, W, eps, offset=0.0, casting_mode="llama", in_place=True, row_mode=None):
        assert not in_place and casting_mode == "llama"
        return _rms(X, W, eps, offset)


class _DyT:
    @staticmethod
    def apply(x, alpha, gamma, beta):
        assert alpha.shape == (1,)
        y = gamma * torch.tanh(alpha * x)
        return y if beta is None else y + beta


@pytest.fixture
def fake_liger(monkeypatch):
    mods = {"liger_kernel": {}, "liger_kernel.ops": {},
            "liger_kernel.ops.mhc": {"LigerMHCCoeffsFunction": _Coeffs, "LigerMHCPreFunction": _Pre,
                                     "LigerMHCPostResFunction": _PostRes},
            "liger_kernel.ops.fused_add_rms_norm": {"LigerFusedAddRMSNormFunction": _FusedAddRMSNorm},
            "liger_kernel.ops.rms_norm": {"LigerRMSNormFunction": _RMSNorm},
            "liger_kernel.ops.dyt": {"LigerDyTFunction": _DyT}}
    for name, attrs in mods.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.fixture
def no_liger(monkeypatch):
    for name in ("liger_kernel", "liger_kernel.ops"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError


def _quick_timer(steps, device):
    """One call of each step, timed: the plumbing's check, not a measurement."""
    out = {}
    for name, step in steps.items():
        t0 = time.perf_counter()
        step()
        t = max(time.perf_counter() - t0, 1e-9)
        out[name] = Timing(t, t, t, 1)
    return out


# --- coverage -------------------------------------------------------------------------------------------------

def test_every_fused_op_is_covered():
    assert set(fused_forms.OPS) <= set(gpu_forms.GPU_OPS)
    assert gpu_forms.parse_ops("all") == ["add_norm", *gpu_forms.GPU_OPS]
    assert gpu_forms.parse_ops("mhc,stream_read,mhc") == ["mhc", "stream_read"]
    with pytest.raises(ValueError, match="--ops"):
        gpu_forms.parse_ops("add_norm,nope")
    for op in gpu_forms.GPU_OPS:  # each has minimum bytes, and they grow with the mode
        mb = [gpu_forms.min_bytes(op, m, 8, 16, 2) for m in ("fwd", "bwd", "fwdbwd")]
        assert 0 < mb[0] and mb[2] == mb[0] + mb[1]
    assert gpu_forms.min_bytes("mhc", "fwd", 8, 16, 4) == (fused_forms.min_bytes("mhc_pre", "fwd", 8, 16, 4)
                                                           + fused_forms.min_bytes("stream_write", "fwd", 8, 16, 4))


# Liger counterparts: where Liger has a kernel for the op (the rest are no liger rows)
LIGER = {("norm_add", "rms"), ("parallel", "rms"), ("parallel2", "rms"), ("dyt", "-"), ("stream_read", "-"),
         ("stream_write", "-"), ("mhc_pre", "-"), ("mhc", "-")}


def test_run_covers_every_op_norm_mode_and_method(monkeypatch, fake_liger, tmp_path):
    compiled, resets = [], []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(kw) or fn)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    modes = ["fwd", "bwd", "fwdbwd"]
    rows, skipped = gpu_forms.run(gpu_forms.GPU_OPS, [SHAPE], ["float32"], ["layer", "rms"], modes,
                                  [*gpu_forms.METHODS, "flash_attn"], device="cpu", timer=_quick_timer,
                                  floor_bytes=1 << 16)
    cells = {}
    for r in rows:
        cells.setdefault((r.op, r.kind, r.mode), set()).add(r.method)
        assert r.median_ms > 0 and r.gbps > 0 and r.frac_of_floor > 0
        assert r.min_bytes == gpu_forms.min_bytes(r.op, r.mode, *SHAPE, 4)
    want = {(op, k) for op in gpu_forms.GPU_OPS for k in (["layer", "rms"] if op in fused_forms.NORM_OPS else ["-"])}
    assert set(cells) == {(op, k, m) for op, k in want for m in modes}
    for (op, k, m), methods in cells.items():
        assert methods == {"addnorm", "eager", "compile"} | ({"liger"} if (op, k) in LIGER else set()), (op, k, m)
    assert len(compiled) == len(resets) == len(cells) and all(kw == {"dynamic": False} for kw in compiled)
    assert not [k for k in skipped if k.count("/") > 2], skipped  # no method's call failed
    assert any(k.startswith("flash_attn/") for k in skipped) and "liger/derf/-" in skipped
    path = gpu_forms.write(rows, gpu_forms.conditions("cpu", skipped), tmp_path, "gpu_cpu")
    data = json.loads(path.read_text())
    assert len(data["rows"]) == len(rows) and data["conditions"]["n_streams"] == fused_forms.N_STREAMS
    md = (tmp_path / "fused_forms_gpu_cpu.md").read_text()
    assert "vs liger" in md and md.count("\n") == 2 + len(cells)


def test_without_liger_its_rows_are_skipped_with_a_reason(no_liger):
    rows, skipped = gpu_forms.run(["mhc_pre", "parallel"], [SHAPE], ["float32"], ["rms"], ["fwd"],
                                  ["addnorm", "liger"], device="cpu", timer=_quick_timer, floor_bytes=1 << 16)
    assert {(r.op, r.method) for r in rows} == {("mhc_pre", "addnorm"), ("parallel", "addnorm")}
    assert set(skipped) == {"liger/mhc_pre/-", "liger/parallel/rms"}


def _outputs(fn, prepare, op, kind, dtype=torch.float32, tweak=None):
    args = fused_forms.make_inputs(gpu_forms._source_op(op), *SHAPE, dtype, kind, False)
    if tweak:
        args = tweak(args)
    if prepare:
        args, _ = prepare(args, False)
    return fn(*args)


def _sharp(args):
    """mHC's inputs with coefficients far from uniform (logits of order 1, where 20 rounds of Sinkhorn-Knopp have
    converged either way round): a slip in the layout of phi or b, or in H_res's orientation, shows."""
    g = torch.Generator().manual_seed(1)
    x, phi, *_ = args
    n = fused_forms.N_STREAMS
    return (x, phi, torch.tensor(1.0), torch.tensor(0.7), torch.tensor(1.3), torch.randn(n, generator=g),
            torch.randn(n, generator=g), torch.randn(n, n, generator=g))


@pytest.mark.parametrize("op, kind", sorted(LIGER))
def test_liger_counterparts_compute_our_op(op, kind, fake_liger):
    """Same inputs, same outputs (forward, float32): Liger's op is given ours in its own conventions."""
    tweak = _sharp if op in ("mhc_pre", "mhc") else None
    ours = _outputs(gpu_forms.fused(op, kind), None, op, kind, tweak=tweak)
    theirs = _outputs(*gpu_forms.liger(op, kind), op, kind, tweak=tweak)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        # Sinkhorn-Knopp: Liger ends its 20 rounds on the columns (and adds 1e-6), ours on the rows
        torch.testing.assert_close(b, a, atol=5e-5 if op.startswith("mhc") else 1e-5, rtol=1e-4)
    if op == "mhc_pre":  # H_res far from its transpose and from uniform: the check can tell a slip
        h_res = ours[2]
        assert (h_res - h_res.mT).abs().max() > 0.3 and (h_res - 0.25).abs().max() > 0.3


def test_liger_mhc_takes_phi_in_half_precision_and_grads_reach_every_input(fake_liger):
    fn, prepare = gpu_forms.liger("mhc", "-")
    args, params = prepare(fused_forms.make_inputs("mhc_pre", *SHAPE, torch.bfloat16, "-", True), True)
    assert args[0].dtype == args[1].dtype == torch.bfloat16 and args[2].shape == (24,)
    assert all(p.is_leaf and p.requires_grad for p in params)
    step = gpu_forms.make_step(fn, "mhc", "bwd", *SHAPE, torch.bfloat16, "-", "cpu", prepare)
    grads = step()
    assert len(grads) == 6 and all(g is not None and g.shape == p.shape for g, p in zip(grads, params))


def test_the_cpu_timer_and_the_journal(tmp_path):
    journal = tmp_path / "j.partial.jsonl"
    rows, _ = gpu_forms.run(["stream_read"], [SHAPE], ["float32"], ["rms"], ["fwd", "fwdbwd"], ["addnorm", "eager"],
                            device="cpu", floor_bytes=1 << 16, journal=journal)  # gpu_cells.timed's CPU fallback
    assert {(r.mode, r.method) for r in rows} == {(m, k) for m in ("fwd", "fwdbwd") for k in ("addnorm", "eager")}
    assert all(r.runs >= 5 for r in rows) and len(journal.read_text().splitlines()) == 2

    def never(steps, device):
        raise AssertionError("a journalled cell was measured again")

    again, _ = gpu_forms.run(["stream_read"], [SHAPE], ["float32"], ["rms"], ["fwd", "fwdbwd"], ["addnorm", "eager"],
                             device="cpu", timer=never, floor_bytes=1 << 16, journal=journal)
    assert again == rows
    from addnorm.kernels.triton import availability, norm as triton_ops

    if availability().available:  # cells measured under other launch parameters are measured again
        old = triton_ops.set_launch(reduce_rows=8 if triton_ops.launch()["reduce_rows"] != 8 else 4)
        try:
            with pytest.raises(AssertionError, match="measured again"):
                gpu_forms.run(["stream_read"], [SHAPE], ["float32"], ["rms"], ["fwd"], ["addnorm", "eager"],
                              device="cpu", timer=never, floor_bytes=1 << 16, journal=journal)
        finally:
            triton_ops.set_launch(**old)



def test_add_norm_gpu_bench_resumes_from_its_journal(monkeypatch, tmp_path):
    """Add & Norm's own GPU table journals each finished cell too: a stage cut short keeps its cells, and the
    next run measures only the rest; the journal goes once the results are written."""
    monkeypatch.setattr(gpu_cells, "FLOOR_BYTES", 1 << 16)
    journal = tmp_path / "a.partial.jsonl"
    rows, _ = gpu.run([SHAPE], ["float32"], ["rms", "layer"], ["fwd"], ["addnorm", "eager"], "cpu",
                      journal=journal, timer=_quick_timer)
    assert {(r.kind, r.method) for r in rows} == {(k, m) for k in ("rms", "layer") for m in ("addnorm", "eager")}
    lines = journal.read_text().splitlines()
    assert len(lines) == 2
    journal.write_text(lines[0] + "\n" + lines[1][:40])  # the second cell's line cut short by the interruption
    timed = []

    def counting(steps, device):
        timed.append(set(steps))
        return _quick_timer(steps, device)

    again, _ = gpu.run([SHAPE], ["float32"], ["rms", "layer"], ["fwd"], ["addnorm", "eager"], "cpu",
                       journal=journal, timer=counting)
    assert len(timed) == 1 and [r.kind for r in again[:2]] == ["rms", "rms"] and {r.kind for r in again[2:]} == {"layer"}
    monkeypatch.setattr(gpu_cells, "timed", _quick_timer)
    assert gpu.main_from_args(_args("--device", "cpu", "--shapes", "8x16", "--dtypes", "float32", "--kinds", "rms",
                                    "--modes", "fwd", "--methods", "addnorm,eager", "--out", str(tmp_path))) == 0
    assert (tmp_path / "add_norm_gpu_cpu.json").exists() and not (tmp_path / "add_norm_gpu_cpu.partial.jsonl").exists()

def _args(*argv):
    p = argparse.ArgumentParser()
    gpu.add_arguments(p)
    return p.parse_args(list(argv))


def test_bench_gpu_ops_option(monkeypatch, tmp_path, capsys):
    assert _args().ops == "add_norm"  # the default: Add & Norm alone, as before
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main_from_args(_args("--ops", "all", "--out", str(tmp_path))) == 2
    assert "not measured" in capsys.readouterr().err and not list(tmp_path.iterdir())
    assert gpu.main_from_args(_args("--ops", "stream_read,bogus", "--device", "cpu", "--out", str(tmp_path))) == 2
    assert "--ops" in capsys.readouterr().err
    monkeypatch.setattr(gpu_cells, "timed", _quick_timer)
    monkeypatch.setattr(gpu_cells, "FLOOR_BYTES", 1 << 16)
    rc = gpu.main_from_args(_args("--ops", "stream_write,mhc", "--device", "cpu", "--shapes", "8x16", "--dtypes",
                                  "float32", "--modes", "fwd", "--methods", "addnorm,eager", "--out", str(tmp_path)))
    assert rc == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "fused_forms_gpu_cpu.json").read_text())
    assert {(r["op"], r["method"]) for r in data["rows"]} == {(o, m) for o in ("stream_write", "mhc")
                                                              for m in ("addnorm", "eager")}
    assert (tmp_path / "fused_forms_gpu_cpu.md").exists() and not list(tmp_path.glob("*.partial.jsonl"))
    assert data["conditions"]["ops"] == ["stream_write", "mhc"]
    from addnorm.kernels.triton import availability, norm as triton_ops

    if availability().available:  # the launch parameters the kernels ran with, as ADDNORM_TRITON_LAUNCH writes them
        assert triton_ops.parse_launch(data["conditions"]["launch"]) == triton_ops.launch()


def test_cpu_behaviour_of_fused_forms_inputs_is_unchanged():
    """device= is the only change to fused_forms: its default is the CPU, and the same values on any device."""
    a = fused_forms.make_inputs("mhc_pre", *SHAPE, torch.float32, "-", True)
    b = fused_forms.make_inputs("mhc_pre", *SHAPE, torch.float32, "-", True, device="cpu")
    assert all(x.device.type == "cpu" and x.is_leaf and x.requires_grad and torch.equal(x, y) for x, y in zip(a, b))
