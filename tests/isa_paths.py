"""The C kernels' instruction-set paths, each run in a process of its own: ``ADDNORM_CPU_ISA=baseline|avx2`` caps
the path the library picks when it loads (it is read once per process), and "native" leaves the best the CPU has.

A test hands a script (run as ``python -c``) that takes its arguments on the command line, the file to write last,
and saves there a dict whose "isa" is ``addnorm.cpu_kernel_availability().isa``; the rest is the test's to
compare, with the baseline's results (``assert_every_isa_agrees``) or with float64 formulas."""

import os
import subprocess
import sys

import torch

# each path asked for, and the path that must then have run (None: whichever is the best the CPU has)
ISAS = {"baseline": "baseline", "avx2": "avx2+fma+f16c", "native": None}


def run_under_isa(script: str, isa: str, out, *args, timeout: float = 300) -> dict:
    """Run ``script`` with ``args`` and then ``out`` on its command line under the path ``isa``, check that the
    path asked for is the one that ran, and return what the script saved to ``out``."""
    env = dict(os.environ)
    env.pop("ADDNORM_CPU_ISA", None)  # "native" must not inherit a cap from the shell that runs the tests
    if isa != "native":
        env["ADDNORM_CPU_ISA"] = isa
    subprocess.run([sys.executable, "-c", script, *map(str, args), str(out)], env=env, check=True, timeout=timeout)
    got = torch.load(out)
    assert ISAS[isa] is None or got["isa"] == ISAS[isa], f"ADDNORM_CPU_ISA={isa} ran the {got['isa']} kernels"
    return got


def run_under_every_isa(script: str, tmp_path, *args) -> dict[str, dict]:
    """``run_under_isa`` on each path in turn (baseline first), each writing ``tmp_path / "<isa>.pt"``."""
    return {isa: run_under_isa(script, isa, tmp_path / f"{isa}.pt", *args) for isa in ISAS}


def assert_every_isa_agrees(results: dict[str, dict], atol: dict[str, float], rtol: float) -> None:
    """Each path's saved tensors equal the baseline path's, for every key that ``atol`` names, within ``rtol`` and
    that key's atol (compared in float32); a key may hold a tuple of tensors (the gradients)."""
    ref = results["baseline"]
    for isa, res in results.items():
        for key, tol in atol.items():
            many = isinstance(ref[key], (tuple, list))
            for a, e in zip(res[key], ref[key], strict=True) if many else [(res[key], ref[key])]:
                torch.testing.assert_close(a.float(), e.float(), atol=tol, rtol=rtol, msg=f"{isa} {key}")
