"""The frontier forms with the rest of PyTorch: torch.compile(fullgraph=True), DDP (gloo), bf16 autocast,
state_dict round trips."""

import io
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from addnorm.model import GPT, GPTConfig
from addnorm.model.streams import permutation_matrices
from frontier_cases import CASES, SCALAR_CASES, batch, config, perturbed_model

NAMES = list(CASES)


# The forms whose graph differs from pre's in a way a graph break could hide in: nGPT (RoPE, Scale, sdpa with
# scale=), HybridNorm (per-head QKV-norm views; hybrid_star's first block), Derf and per-slot DyT (their alpha
# arguments). Two layers of width 8 (hybrid_star needs its first block and a hybrid one), to keep compiling cheap.
_SMALL = ("hybrid", "hybrid_star", "ngpt", "derf_pre", "dyt_slots")


@pytest.mark.parametrize("name", ["hc", "mhc", "mhc_lite_derf_vr", "denseformer_dil2_per2", "lns", "value_residual_pre",
                                  "attn_res", "attn_res_block3_rms_vr", *_SMALL])
def test_compile_fullgraph_matches_eager(name):
    torch._dynamo.reset()
    cfg = config(name, n_layer=2) if name in _SMALL else config(name)
    m = perturbed_model(cfg, dtype=torch.float32)
    idx = batch(cfg)
    logits = m(idx)
    grads = torch.autograd.grad(logits.square().mean(), list(m.parameters()))
    cm = torch.compile(m, fullgraph=True)  # a graph break anywhere raises
    c_logits = cm(idx)
    c_grads = torch.autograd.grad(c_logits.square().mean(), list(m.parameters()))
    torch.testing.assert_close(c_logits, logits, atol=2e-6, rtol=1e-5)
    for (n, _), a, b in zip(m.named_parameters(), c_grads, grads):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-4, msg=n)


def _ddp_worker(rank, world, init_file, out_file, names):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    out = {}
    for name in names:
        cfg = config(name)
        model = torch.nn.parallel.DistributedDataParallel(perturbed_model(cfg, dtype=torch.float32))
        idx = batch(cfg, B=4)[rank * 2:(rank + 1) * 2]
        _, loss = model(idx, idx)
        loss.backward()
        out[name] = {n: p.grad for n, p in model.module.named_parameters()}
    if rank == 0:
        torch.save(out, out_file)
    dist.barrier()
    dist.destroy_process_group()


def _spawn(worker, tmp_path, names):
    """worker(rank, world, init_file, out_file, names) in two gloo processes; what rank 0 saved."""
    init_file, out_file = tmp_path / "init", tmp_path / "out.pt"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(worker, args=(2, str(init_file), str(out_file), names), nprocs=2, join=True)
    return torch.load(out_file)


def test_ddp_gradients_equal_single_process(tmp_path):
    ddp = _spawn(_ddp_worker, tmp_path, NAMES)
    for name in NAMES:
        cfg = config(name)
        single = perturbed_model(cfg, dtype=torch.float32)
        idx = batch(cfg, B=4)
        _, loss = single(idx, idx)
        loss.backward()
        for n, p in single.named_parameters():
            torch.testing.assert_close(ddp[name][n], p.grad, atol=1e-6, rtol=1e-5, msg=f"{name}: {n}")


def _fsdp2_worker(rank, world, init_file, out_file, names):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    out = {}
    for name in names:
        for mp in (None, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)):
            cfg = config(name)
            model = perturbed_model(cfg, dtype=torch.float32)
            kw = {} if mp is None else {"mp_policy": mp}  # mixed precision casts every block's inputs: it copies
            for block in model.h:  # each block's parameters gathered for its forward, freed after
                fully_shard(block, mesh=mesh, **kw)
            fully_shard(model, mesh=mesh, **kw)
            idx = batch(cfg, B=4)[rank * 2:(rank + 1) * 2]
            _, loss = model(idx, idx)
            loss.backward()
            mean = loss.detach().float()
            dist.all_reduce(mean)
            out[name, mp is not None] = {"loss": mean.item() / world,
                                         "grads": {n: p.grad.full_tensor() for n, p in model.named_parameters()}}
    if rank == 0:
        torch.save(out, out_file)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # as in tests/model/test_ecosystem.py: gloo's threads may still unwind at exit


def test_fsdp2_shards_every_form_and_its_gradients_equal_single_process(tmp_path):
    """fully_shard on every block of every form, in float32 and with bfloat16 mixed precision: it raised "doesn't
    support scalar parameters" on any model with a learned scalar, and under mixed precision, whose cast of each
    block's inputs copies a dict, value_residual's later layers never saw the first layer's values. In float32 the
    gathered gradients are one process's over the same global batch; in mixed precision, those of the model cast to
    bfloat16, to bfloat16's rounding."""
    names = [*NAMES, *SCALAR_CASES]  # FSDP2 refuses 0-d parameters: every learned scalar must be (1,)
    got = _spawn(_fsdp2_worker, tmp_path, names)
    for name in names:
        cfg = config(name)
        idx = batch(cfg, B=4)
        single = perturbed_model(cfg, dtype=torch.float32)
        _, loss = single(idx, idx)
        loss.backward()
        assert abs(got[name, False]["loss"] - loss.item()) < 1e-5, name
        for n, p in single.named_parameters():
            torch.testing.assert_close(got[name, False]["grads"][n], p.grad, atol=1e-6, rtol=1e-5, msg=f"{name}: {n}")
        cast = perturbed_model(cfg, dtype=torch.float32).to(torch.bfloat16)
        _, loss = cast(idx, idx)
        loss.backward()
        assert abs(got[name, True]["loss"] - loss.item()) < 0.02 * abs(loss.item()), name
        for n, p in cast.named_parameters():
            g, want = got[name, True]["grads"][n], p.grad.float()
            assert (g - want).norm() <= 0.05 * want.norm() + 1e-4, f"{name}: {n} (mixed precision)"


def _bf16_error(name):
    cfg = config(name, n_embd=32, n_head=4)
    m = perturbed_model(cfg, dtype=torch.float32)
    idx = batch(cfg)
    with torch.no_grad():
        want = m(idx)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = m(idx)
    assert torch.isfinite(got).all()
    return ((got.float() - want).norm() / want.norm()).item()


def test_bf16_autocast_is_as_accurate_as_pre():
    base = _bf16_error("pre")
    errs = {name: _bf16_error(name) for name in NAMES}
    bad = {k: v for k, v in errs.items() if not v < max(3 * base, 1e-2)}
    assert not bad, (base, bad)


def test_bf16_autocast_backward_is_finite():
    for name in ("hc", "mhc", "mhc_lite"):
        cfg = config(name)
        m = perturbed_model(cfg, dtype=torch.float32)
        idx = batch(cfg)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = m(idx, idx)
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in m.parameters()), name


@pytest.mark.parametrize("name", NAMES)
def test_torch_export_gives_the_eager_logits(name):
    """torch.export of every form, value_residual's FirstValues and Attention Residuals' depth state included."""
    cfg = config(name)
    m = perturbed_model(cfg, dtype=torch.float32).eval()
    idx = batch(cfg)
    exported = torch.export.export(m, (idx,)).module()
    torch.testing.assert_close(exported(idx), m(idx), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip(name):
    cfg = config(name)
    a = perturbed_model(cfg, seed=1, dtype=torch.float32).eval()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = GPT(cfg).eval()
    b.load_state_dict(torch.load(buf))
    idx = batch(cfg)
    assert torch.equal(a(idx), b(idx))


def _materialized_garbage(cfg: GPTConfig) -> GPT:
    """Built on the meta device and materialized with ``to_empty()``: every parameter and buffer filled with NaN
    (to_empty leaves whatever memory held; NaN makes a value nothing restored show, every time)."""
    with torch.device("meta"):
        m = GPT(cfg)
    m.to_empty(device="cpu")
    with torch.no_grad():
        for t in [*m.parameters(), *m.buffers()]:
            t.fill_(float("nan"))
    return m


@pytest.mark.parametrize("name", NAMES)
def test_meta_device_model_loads_a_checkpoint(name):
    """The large-model loading recipe: meta device, to_empty(), load_state_dict(). mHC-lite's permutation
    matrices are a buffer outside the state_dict: they were left empty (NaN logits) until rebuilt at load."""
    cfg = config(name)
    a = perturbed_model(cfg, seed=1, dtype=torch.float32).eval()
    b = _materialized_garbage(cfg).eval()
    b.load_state_dict(a.state_dict())
    idx = batch(cfg)
    assert torch.equal(a(idx), b(idx))


def _fresh_state(cfg: GPTConfig, seed: int) -> dict:
    torch.manual_seed(seed)
    return dict(GPT(cfg).state_dict())


@pytest.mark.parametrize("name", NAMES)
def test_meta_device_model_resets_every_parameter(name):
    """to_empty() then reset_parameters(), with no checkpoint: every value initialized, and the ones a fresh model
    holds whatever the seed (norm weights, gates, alphas, mHC's biases, permutations) equal a fresh model's. GPT's
    reset_parameters re-initialized only its Linear and Embedding weights."""
    cfg = config(name)
    m = _materialized_garbage(cfg)
    m.reset_parameters()
    fresh = [_fresh_state(cfg, seed) for seed in (3, 4)]
    buffers = dict(m.named_buffers())
    for n, t in list(m.state_dict(keep_vars=True).items()) + list(buffers.items()):
        assert torch.isfinite(t).all(), n
        f0 = fresh[0].get(n)
        if f0 is not None and torch.equal(f0, fresh[1][n]):  # seed-independent: must match exactly
            assert torch.equal(t, f0), n
    perms = [(n, t) for n, t in buffers.items() if n.endswith("perms")]
    for n, t in perms:
        assert torch.equal(t, permutation_matrices(round(t.size(-1))).to(t.dtype)), n


@pytest.mark.parametrize("name", ["hc", "mhc", "mhc_lite"])
def test_stream_coefficients_stay_float32_under_bf16_autocast(name):
    """The connections' coefficients (mHC's projection of vec(X), HC's LN(X) W) are computed in float32 even under
    autocast, as mHC's eqs. 14-19 do: autocast would otherwise run their GEMMs in bfloat16 (errors up to 9e-3
    in h here, measured)."""
    cfg = config(name, n_embd=32, n_head=4)
    m = perturbed_model(cfg, dtype=torch.float32)
    with torch.no_grad():
        for b in m.h:
            for s in (b.attn.streams, b.mlp.streams):
                for p in ("alpha_pre", "alpha_post", "alpha_res", "s_alpha", "s_beta"):
                    if hasattr(s, p):
                        getattr(s, p).fill_(1.0)  # projections of order 1, so a bf16 GEMM shows
    x = torch.randn(2, 5, cfg.streams, cfg.n_embd, generator=torch.Generator().manual_seed(1))
    for b in m.h:
        for s in (b.attn.streams, b.mlp.streams):
            with torch.no_grad():
                h, (h_post, h_res) = s.read(x)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    h16, (h_post16, h_res16) = s.read(x)
            for want, got in ((h, h16), (h_post, h_post16), (h_res, h_res16)):
                assert got.dtype == torch.float32
                torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name,dtype", [("mhc", torch.float32), ("mhc", torch.bfloat16), ("mhc_lite", torch.float32)])
def test_the_pending_write_seam_changes_no_bit(name, dtype, monkeypatch):
    """Each widened sub-layer leaves its write pending and the next mHC read does it in mhc_write_pre's one pass:
    the model's logits and every gradient are the bits of the same model with each write done on its own
    (float32; bfloat16's logits too, its gradients within rounding: the fused backward adds the read's gradient of X'
    in float32). The fused node is in the graph."""
    from addnorm.model import streams

    cfg = config(name)
    m = perturbed_model(cfg, dtype=dtype)
    idx = batch(cfg)

    def run():
        logits = m(idx)
        return logits, torch.autograd.grad(logits.float().square().mean(), list(m.parameters()))

    logits, grads = run()
    names, seen, todo = set(), set(), [logits.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and fn not in seen:
            seen.add(fn)
            names.add(fn.name())
            todo.extend(f for f, _ in fn.next_functions)
    if dtype == torch.float32:
        assert any("MhcWritePreNode" in n for n in names)
    monkeypatch.setattr(streams.ManifoldHyperConnection, "write_read", streams.StreamConnection.write_read)
    want_logits, want_grads = run()
    assert torch.equal(logits, want_logits)
    for (n, _), a, b in zip(m.named_parameters(), grads, want_grads):
        if dtype == torch.float32:
            assert torch.equal(a, b), n
        else:
            torch.testing.assert_close(a.float(), b.float(), atol=1e-2, rtol=2e-2, msg=n)
