"""The row loops' own prefetch: off by default on AMD's CPUs, on elsewhere, ``ADDNORM_CPU_PREFETCH=0|1`` overriding,
and the same bits either way.

On the AMD EPYC the requests the loops made for the rows ahead cost more time than they saved (journal, "Software
prefetch on the AMD EPYC"); only prefetches change, so every output and gradient must be the same bits with them and
without, on each instruction-set path. The switches the library reads when it loads are checked by name: a value it
would ignore is refused. Each setting runs in its own process (the library reads the environment once)."""

import os
import subprocess
import sys

import pytest
import torch

import addnorm
from addnorm.kernels.cpu.library import check_switches
from tests.isa_paths import run_under_isa

pytestmark = pytest.mark.skipif(not addnorm.cpu_kernel_availability().available,
                                reason="the compiled CPU kernels are not built")

SCRIPT = r'''
import sys
import torch
import addnorm
from addnorm.functional import (add_derf, add_dyt, add_layer_norm, add_rms_norm, layer_norm_add,
                                parallel_add_layer_norm, parallel_add_rms_norm, rms_norm_add, stream_read,
                                stream_write)
from addnorm.kernels.cpu.library import prefetch

out = {"isa": addnorm.cpu_kernel_availability().isa, "prefetch": prefetch()}
g = torch.Generator().manual_seed(0)
for dt in (torch.bfloat16, torch.float32):
    for N, D in ((24, 1024), (9, 769), (5, 3000)):  # chunk edges (512 values) inside a row, and a tail
        x, r, x2 = (torch.randn(N, D, generator=g).to(dt).requires_grad_() for _ in range(3))
        w, b, w2, b2 = (torch.randn(D, generator=g).requires_grad_() for _ in range(4))
        calls = {
            "add_layer_norm": lambda: add_layer_norm(x, r, (D,), w, b, 1e-5, backend="cpu"),
            "add_rms_norm": lambda: add_rms_norm(x, r, (D,), w, 1e-6, backend="cpu"),
            "layer_norm_add": lambda: (layer_norm_add(x, r, (D,), w, b, 1e-5, backend="cpu"),),
            "rms_norm_add": lambda: (rms_norm_add(x, r, (D,), w, 1e-6, backend="cpu"),),
            "parallel_ln": lambda: parallel_add_layer_norm(x, x2, r, (D,), w, b, eps=1e-5, backend="cpu"),
            "parallel2_ln": lambda: parallel_add_layer_norm(x, x2, r, (D,), w, b, w2, b2, eps=1e-5, backend="cpu"),
            "parallel_rms": lambda: parallel_add_rms_norm(x, x2, r, (D,), w, eps=1e-6, backend="cpu"),
            "dyt": lambda: add_dyt(x, r, 0.7, w, b, backend="cpu"),
            "derf": lambda: add_derf(x, r, 0.7, 0.1, w, b, backend="cpu"),
        }
        for name, call in calls.items():
            outs = [o for o in call() if o is not None]
            ins = (x, r, x2, w, b, w2, b2)
            grads = torch.autograd.grad([o.float().sum() * (k + 1) for k, o in enumerate(outs)], ins,
                                        allow_unused=True)
            out[f"{name}/{dt}/{N}x{D}"] = ([o.detach() for o in outs], [gr for gr in grads if gr is not None])
    for T, n, C in ((40, 4, 1024), (7, 2, 769)):  # the widened stream: its read and write
        X = torch.randn(T, n, C, generator=g).to(dt).requires_grad_()
        y = torch.randn(T, C, generator=g).to(dt).requires_grad_()
        hp, hpo = (torch.rand(T, n, generator=g).requires_grad_() for _ in range(2))
        hr = torch.rand(T, n, n, generator=g).requires_grad_()
        h = stream_read(X, hp, backend="cpu")
        X2, q = stream_write(X, y, hpo, hr, backend="cpu")
        grads = torch.autograd.grad([h.float().sum(), X2.float().sum() * 2 + q.sum()], (X, y, hp, hpo, hr))
        out[f"stream/{dt}/{T}x{n}x{C}"] = ([h.detach(), X2.detach(), q.detach()], list(grads))
torch.save(out, sys.argv[-1])
'''


def run(tmp_path, monkeypatch, isa: str, prefetch: str | None) -> dict:
    """SCRIPT's results under ``isa`` (``run_under_isa``, which checks the path that ran) with the prefetch switch set
    to ``prefetch``, or left to the CPU's default (None)."""
    if prefetch is None:
        monkeypatch.delenv("ADDNORM_CPU_PREFETCH", raising=False)
    else:
        monkeypatch.setenv("ADDNORM_CPU_PREFETCH", prefetch)
    return run_under_isa(SCRIPT, isa, tmp_path / f"{isa}_{prefetch}.pt")


def cpu_vendor() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":")[1].strip() for line in f if line.startswith("vendor_id")), None)
    except OSError:
        return None


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_same_bits_with_and_without_prefetch(tmp_path, monkeypatch, isa):
    on, off = run(tmp_path, monkeypatch, isa, "1"), run(tmp_path, monkeypatch, isa, "0")
    assert on["prefetch"] is True and off["prefetch"] is False
    assert on["isa"] == off["isa"]
    keys = [k for k in on if "/" in k]
    assert len(keys) == 2 * (3 * 9 + 2) and keys == [k for k in off if "/" in k]
    for k in keys:
        for a, b in zip(on[k][0] + on[k][1], off[k][0] + off[k][1], strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), f"{k}: the outputs moved with the prefetch"


def test_default_follows_the_vendor(tmp_path, monkeypatch):
    vendor = cpu_vendor()
    if vendor is None:
        pytest.skip("no /proc/cpuinfo vendor_id on this machine")
    got = run(tmp_path, monkeypatch, "native", None)["prefetch"]
    assert got is (vendor != "AuthenticAMD"), f"{vendor}: prefetch {got}"


@pytest.mark.parametrize("name,value", [("ADDNORM_CPU_PREFETCH", "yes"), ("ADDNORM_CPU_PREFETCH", ""),
                                        ("ADDNORM_CPU_ISA", "avx3"), ("ADDNORM_CPU_ISA", "AVX2"),
                                        ("ADDNORM_CPU_NT_BYTES", "-1"), ("ADDNORM_CPU_NT_BYTES", "16MiB")])
def test_a_switch_the_library_would_ignore_is_refused_by_name(name, value):
    with pytest.raises(ValueError, match=name):
        check_switches({name: value})


@pytest.mark.parametrize("env", [{}, {"ADDNORM_CPU_PREFETCH": "0"}, {"ADDNORM_CPU_ISA": "baseline"},
                                 {"ADDNORM_CPU_NT_BYTES": "0"}])
def test_the_values_it_reads_pass(env):
    check_switches(env)


def test_a_bad_switch_stops_the_import(tmp_path):
    """The library loads when addnorm is imported (its availability is read then): a bad value stops that, by name."""
    env = dict(os.environ, ADDNORM_CPU_PREFETCH="on")
    code = ("import torch, addnorm.functional as F\n"
            "F.add_rms_norm(torch.randn(2, 8), torch.randn(2, 8), (8,), backend='cpu')")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "ADDNORM_CPU_PREFETCH must be one of '0', '1', got 'on'" in res.stderr, res.stderr


def test_every_request_for_rows_ahead_goes_through_the_switch():
    """The bits cannot tell a prefetch that ignores the switch from one that follows it: so the headers are read. Every
    ``__builtin_prefetch`` is in one of the helpers, every loop calls the switched ones (``prefetch_next``,
    ``prefetch_chunk``, ``prefetch_span``), and only the bfloat16 stream's loops call the ``*_always`` forms."""
    import re
    from pathlib import Path

    root = Path(addnorm.__file__).parent / "kernels" / "cpu"
    helpers = {"prefetch_next_always", "prefetch_span_always", "an_mhc_pf_at"}  # mHC's projection: its own, always
    for path in sorted(root.glob("*.h")):
        text = path.read_text()
        # each function's body: from a definition line to the next one; the helper it belongs to by name
        for m in re.finditer(r"__builtin_prefetch", text):
            head = text.rfind("\nstatic ", 0, m.start())  # the definition this call is in
            name = re.match(r"\nstatic (?:[^(]*?__attribute__\(\([^)]*\)\))?[^(]*?(?:AN_FN\((\w+)\)|(\w+))\(",
                            text[head:]) if head >= 0 else None
            name = name and (name.group(1) or name.group(2))
            line = text[:m.start()].count("\n") + 1
            assert name in helpers, f"{path.name}:{line}: a prefetch outside the helpers (in {name})"
        for m in re.finditer(r"AN_FN\((prefetch_\w+_always)\)\(", text):
            line = text[:m.start()].count("\n") + 1
            assert path.name in ("stream_rows.h", "norm_rows.h"), f"{path.name}:{line}: {m.group(1)} outside the stream"
