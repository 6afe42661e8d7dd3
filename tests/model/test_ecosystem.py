"""GPT with the rest of PyTorch: torch.compile, DistributedDataParallel (gloo), state_dict."""

import io
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from addnorm.model import GPT, GPTConfig

CFG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)


def _batch():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 64, (4, 16), generator=g)


def test_torch_compile_matches_eager():
    torch.manual_seed(0)
    m = GPT(CFG)
    idx = _batch()
    logits, loss = m(idx, idx)
    grads = torch.autograd.grad(loss, list(m.parameters()))
    cm = torch.compile(m)
    c_logits, c_loss = cm(idx, idx)
    c_grads = torch.autograd.grad(c_loss, list(m.parameters()))
    torch.testing.assert_close(c_logits, logits, atol=1e-5, rtol=1e-5)
    for a, b in zip(c_grads, grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def _ddp_worker(rank, world, init_file, out_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(GPT(CFG))
    idx = _batch()[rank * 2:(rank + 1) * 2]  # each rank: half of the batch
    _, loss = model(idx, idx)
    loss.backward()
    if rank == 0:
        torch.save({n: p.grad for n, p in model.module.named_parameters()}, out_file)
    dist.destroy_process_group()


def test_ddp_gradients_equal_single_process(tmp_path):
    init_file, out_file = tmp_path / "init", tmp_path / "grads.pt"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_ddp_worker, args=(2, str(init_file), str(out_file)), nprocs=2, join=True)
    torch.manual_seed(0)
    single = GPT(CFG)
    idx = _batch()
    _, loss = single(idx, idx)  # mean over the whole batch = average of the two halves' means
    loss.backward()
    ddp = torch.load(out_file)
    for n, p in single.named_parameters():
        torch.testing.assert_close(ddp[n], p.grad, atol=1e-6, rtol=1e-5, msg=n)


@pytest.mark.parametrize("placement", ["pre", "deepnorm", "rezero", "mix"])
def test_state_dict_round_trip(placement):
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=32, placement=placement)
    torch.manual_seed(1)
    a = GPT(cfg).eval()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    torch.manual_seed(2)
    b = GPT(cfg).eval()
    b.load_state_dict(torch.load(buf))
    idx = _batch()
    assert torch.equal(a(idx), b(idx))
