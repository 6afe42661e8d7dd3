"""The CPU kernels run in threads with small stacks: no kernel frame may need more than a few KiB.

A thread made with ``threading.stack_size(32768)`` calls every op family the C library serves, forward and
backward, float32 and bfloat16, at shapes that take the parallel path (many chunks) and the single-thread path; the
subprocess must exit 0 (a frame past the stack's end is a segfault, reported by faulthandler). The frames themselves
are measured too, where gcc can build the library with -fstack-usage."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from addnorm.kernels.cpu import availability

pytestmark = pytest.mark.skipif(not availability().available, reason="the CPU kernels are not built")

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "addnorm" / "kernels" / "cpu" / "addnorm_cpu.c"

SCRIPT = textwrap.dedent(
    """
    import math, sys, threading
    import torch
    import addnorm.functional as AF
    from addnorm.functional import layer_norm_add, parallel_add_rms_norm
    from addnorm.functional import add_dyt, add_derf
    from addnorm.functional import mhc_pre, mhc_write_pre, stream_read, stream_write
    from addnorm.functional import MhcConvention, ProjectedGates, StreamNorm, hyper_read, hyper_write_read
    from addnorm.functional import stream_rms_norm

    def grads(outs, ins):
        outs = [o for o in outs if o.is_floating_point() and o.requires_grad]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        assert all(t.grad is not None for t in ins if t.requires_grad)

    def leaf(*shape, dtype=torch.float32):
        return torch.randn(*shape).to(dtype).requires_grad_()

    def families(N, D, dtype):
        x, r, w, b = leaf(N, D, dtype=dtype), leaf(N, D, dtype=dtype), leaf(D), leaf(D)
        grads(AF.add_layer_norm(x, r, (D,), w, b, backend="cpu"), [x, r, w, b])
        grads([AF.rms_norm(x, (D,), w, backend="cpu")], [x, w])
        grads(layer_norm_add(x, r, (D,), w, b, backend="cpu"), [x, r])
        x2 = leaf(N, D, dtype=dtype)
        grads(parallel_add_rms_norm(x, x2, r, (D,), w, w, backend="cpu"), [x, x2, r])
        grads(add_dyt(x, r, torch.tensor(0.7, requires_grad=True), w, b, backend="cpu"), [x, r])
        grads(add_derf(x, r, torch.tensor(0.7, requires_grad=True), torch.tensor(0.1, requires_grad=True), w, b,
                       backend="cpu"), [x, r])
        n, C = 4, D // 4
        X, y = leaf(N, n, C, dtype=dtype), leaf(N, C, dtype=dtype)
        hp, hpo = torch.rand(N, n, requires_grad=True), torch.rand(N, n, requires_grad=True)
        hr = torch.softmax(torch.randn(N, n, n), -1).requires_grad_()
        grads([stream_read(X, hp, backend="cpu"), *stream_write(X, y, hpo, hr, backend="cpu")], [X, y, hp, hpo, hr])
        for lite in (False, True):
            r_ = math.factorial(n) if lite else n * n
            phi = (torch.randn(n * C, 2 * n + r_) / math.sqrt(n * C)).requires_grad_()
            co = [torch.tensor(v, requires_grad=True) for v in (0.8, 0.6, 1.1)]
            bs = [leaf(n), leaf(n), leaf(r_) if lite else leaf(n, n)]
            perms = None
            if lite:
                import itertools
                perms = torch.stack([torch.eye(n)[list(p)] for p in itertools.permutations(range(n))])
            grads(mhc_pre(X, phi, *co, *bs, perms=perms, backend="cpu"), [X, phi])
            if not lite:  # the write of the stream and the read of its result in one pass, with its mixing matrix
                grads(mhc_write_pre(X, y, hpo, hr, phi, *co, *bs, convention=MhcConvention.deepseek_v4(1e-6),
                                    backend="cpu"), [X, y, hpo, hr, phi])
        # HY-V4's read without the comb matrix, its head, and the write+read without a mixing matrix
        conv = ProjectedGates(1e-6, pre_eps=1e-3, post_scale=1.5, post_eps=1e-3)
        W, s2, b2 = leaf(2 * n, n * C), leaf(2), leaf(2 * n)
        grads(hyper_read(X, W, s2, b2, convention=conv, backend="cpu"), [X, W])
        grads(hyper_read(X, W[:n], s2[:1], b2[:n], convention=conv, backend="cpu")[:2], [X])
        grads(hyper_write_read(X, y, hpo, W, s2, b2, convention=conv, backend="cpu"), [X, y, hpo, W])
        grads([stream_rms_norm(X, W[0].reshape(n, C), convention=StreamNorm(1e-6), backend="cpu")], [X, W])

    def body(shapes):
        for dtype in (torch.float32, torch.bfloat16):
            for N, D in shapes:
                families(N, D, dtype)

    torch.set_num_threads(2)
    # once on the main thread first: Python's own first imports (unmarshalling a module's code) need more than
    # 32 KiB of stack, and addnorm imports some modules on first use
    body([(2, 8)])
    threading.stack_size(int(sys.argv[1]))
    # 2048 x 512: 16 chunks over two threads (the task table that lived on the stack); 3 x 96: one thread
    done = []
    t = threading.Thread(target=lambda: done.append(body([(2048, 512), (3, 96)])))
    t.start()
    t.join()
    print("ok" if done else "the thread raised")
    """
)


def test_every_op_family_runs_in_a_thread_with_a_small_stack():
    stack = 32768
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", SCRIPT, str(stack)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.strip() == "ok", proc.stderr[-3000:]


# a few KiB per frame: the deepest chain (fork/join, task, row loop, inner kernel) then stays far below 32 KiB
FRAME_LIMIT = 8192


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to measure the frames with")
def test_no_kernel_frame_needs_more_than_a_few_kib(tmp_path):
    cmd = ["gcc", "-O3", "-std=gnu11", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
           "-fno-trapping-math", "-ffp-contract=off", "-pthread", "-fopenmp", "-fPIC", "-fstack-usage",
           "-I" + sysconfig.get_paths()["include"], "-c", str(SOURCE), "-o", str(tmp_path / "k.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    if proc.returncode != 0:
        pytest.skip(f"gcc could not build the library here: {proc.stderr[-500:]}")
    frames = []
    for line in next(tmp_path.glob("*.su")).read_text().splitlines():
        where, size, kind = line.rsplit("\t", 2)
        frames.append((int(size), kind, re.sub(r".*/", "", where)))
    assert len(frames) > 100, frames  # every instruction set's row kernels were measured
    too_big = [f for f in frames if f[0] > FRAME_LIMIT or "bounded" not in f[1] and f[1] != "static"]
    assert not too_big, sorted(too_big, reverse=True)
