"""One very wide row costs the CPU kernels no more memory than PyTorch's own ops: peak RSS over the call, in a fresh
subprocess per measurement, for a 1 x 4M float32 row, forward and forward + backward, of ``layer_norm`` and of
``add_layer_norm`` against ``x + residual`` then ``torch.nn.functional.layer_norm``. The kernels once kept whole-row
scratch copies (rows of ones and zeros, the normalized row, the sum, float64 gradient partials): 7 tensor-sizes
forward where torch needs 2."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from addnorm.kernels.cpu import availability

pytestmark = pytest.mark.skipif(not (availability().available and sys.platform.startswith("linux")),
                                reason="needs the CPU kernels and Linux's /proc/self/statm")

ROOT = Path(__file__).resolve().parents[2]
D = 1 << 22

SCRIPT = textwrap.dedent(
    """
    import gc, os, resource, sys
    import torch
    import addnorm.functional as AF

    op, mode, method, D = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    grad = mode == "fwdbwd"

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def run(x, r, w, b, method):
        n = (x.shape[-1],)
        if method == "torch":
            if op == "layer_norm":
                return (torch.nn.functional.layer_norm(x, n, w, b),)
            s = x + r
            return torch.nn.functional.layer_norm(s, n, w, b), s
        if op == "layer_norm":
            return (AF.layer_norm(x, n, w, b, backend="cpu"),)
        return AF.add_layer_norm(x, r, n, w, b, backend="cpu")

    g = torch.Generator().manual_seed(0)
    x, r, dy = (torch.randn(1, D, generator=g) for _ in range(3))
    w, b = torch.randn(D, generator=g), torch.randn(D, generator=g)
    ins = [t.requires_grad_(grad) for t in (x, r, w, b)]
    # both methods once at a small width first: imports, lazily built modules, the first-call allocations
    for m in ("torch", "addnorm"):
        small = [t[..., :64].detach().clone().requires_grad_(grad) for t in ins]
        outs = run(*small, m)
        if grad:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    del outs, small
    gc.collect()
    base = rss()
    outs = run(*ins, method)
    if grad:
        torch.autograd.backward(outs, [dy] * len(outs))
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base)
    """
)


def _peak(op, mode, method):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="2")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, op, mode, method, str(D)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(proc.stdout.split()[-1])


@pytest.mark.parametrize("mode", ["fwd", "fwdbwd"])
@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
def test_a_very_wide_row_needs_no_more_memory_than_torch(op, mode):
    torch_peak, ours = _peak(op, mode, "torch"), _peak(op, mode, "addnorm")
    size = 4 * D
    # slack: a twentieth of a tensor (page and huge-page rounding, the statistics, allocator bookkeeping)
    assert ours <= torch_peak + size // 20, (f"{op} {mode}: addnorm's peak rose {ours / size:.2f} tensor-sizes, "
                                             f"torch's {torch_peak / size:.2f}")
