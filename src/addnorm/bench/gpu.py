"""Fused Add & Norm on a GPU: addnorm's Triton kernels vs eager PyTorch vs torch.compile vs Liger-Kernel and
flash-attention (where importable) vs the device's copy bandwidth. Same rows, CSV and JSON as the CPU
benchmark (``add_norm.py``), written to ``add_norm_gpu.{csv,json}``.

Every cell -- norm x dtype x shape x mode (fwd, bwd, fwdbwd) -- times its methods interleaved: rounds of
``block`` calls of each method in turn between two CUDA events, so clock and thermal drifts fall on all
of them alike; the floor (a device-to-device ``copy_`` of 512 MiB) is timed among them. GB/s are on the
minimum bytes (fwd: read x, r; write y, s -- as the CPU table), ``frac_of_floor`` is that over the copy's.

    python benchmarks/bench_gpu.py [--shapes 4096x4096,16384x8192,32768x2048] [--dtypes float32,bfloat16]

Without a CUDA device it says so and measures nothing (exit 2): GPU numbers are never estimated.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from .. import functional as AF
from . import gpu_cells, gpu_forms
from .add_norm import Row, eager_add_norm, make_step, min_bytes, parse_options, write_results
from .gpu_cells import append_cell, conditions, launch_label, read_cells

SHAPES = [(4096, 4096), (16384, 8192), (32768, 2048)]
DTYPES = ["float32", "bfloat16"]
KINDS = ["layer", "rms"]
MODES = ["fwd", "bwd", "fwdbwd"]
METHODS = ["addnorm", "eager", "compile", "liger", "flash_attn"]


def addnorm_method(kind):
    def f(x, r, w, b):
        if kind == "layer":
            return AF.add_layer_norm(x, r, x.shape[-1], w, b)
        return AF.add_rms_norm(x, r, x.shape[-1], w)

    return f


def liger_method(kind):
    """Liger-Kernel's fused add + RMSNorm (it has no fused add + LayerNorm): None where not importable."""
    if kind != "rms":
        return None
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    except ImportError:
        return None
    return lambda x, r, w, b: LigerFusedAddRMSNormFunction.apply(x, r, w, 1e-6, 0.0, "llama", False)


def flash_attn_method(kind):
    """flash-attention's Triton layer_norm_fn / rms_norm_fn with the residual fused (prenorm=True)."""
    try:
        from flash_attn.ops.triton.layer_norm import layer_norm_fn, rms_norm_fn
    except ImportError:
        return None
    if kind == "layer":
        return lambda x, r, w, b: layer_norm_fn(x, w, b, residual=r, eps=1e-5, prenorm=True)
    return lambda x, r, w, b: rms_norm_fn(x, w, None, residual=r, eps=1e-6, prenorm=True)


def _method(method, kind, compiled):
    if method == "addnorm":
        return addnorm_method(kind)
    if method == "eager":
        return eager_add_norm(kind)
    if method == "compile":
        if kind not in compiled:
            compiled[kind] = torch.compile(eager_add_norm(kind), dynamic=False)
        return compiled[kind]
    return {"liger": liger_method, "flash_attn": flash_attn_method}[method](kind)


def run(shapes, dtypes, kinds, modes, methods, device, progress=None, *, journal: Path | None = None,
        timer=None) -> tuple[list[Row], dict]:
    """Every norm x dtype x shape x mode, the methods timed side by side with the copy floor. With ``journal``
    each finished cell is appended there, and a cell found there (with the same methods) is not measured again:
    a run cut short resumes. ``timer(steps, device) -> {name: Timing}`` defaults to ``gpu_cells.timed``."""
    import torch._dynamo.config as dynamo_config

    # one compiled function per kind meets every shape, dtype and grad mode: each is a recompile of the same
    # code, and past dynamo's limit (8) compile silently falls back to eager -- timed as "compile". Allow one
    # per cell, and fail loudly rather than time eager under compile's name.
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 4 * len(shapes) * len(dtypes) * len(modes))
    dynamo_config.fail_on_recompile_limit_hit = True
    timer = timer or gpu_cells.timed
    floor_bytes = gpu_cells.FLOOR_BYTES
    done = read_cells(journal, Row)
    rows, skipped, compiled = [], {}, {}
    src = torch.ones(floor_bytes // 4, device=device)
    dst = torch.empty_like(src)
    floor_step = lambda: dst.copy_(src)  # noqa: E731
    total = len(shapes) * len(dtypes) * len(kinds) * len(modes)
    task = progress.add_task("gpu benchmark", total=total) if progress else None
    for n, d in shapes:
        for dt_name in dtypes:
            dtype = getattr(torch, dt_name)
            es = torch.tensor([], dtype=dtype).element_size()
            for kind in kinds:
                for mode in modes:
                    key = f"{kind}|{dt_name}|{n}|{d}|{mode}|{launch_label()}"
                    hit = done.get((key, tuple(methods)))  # measured before, with the same methods
                    if hit is not None:
                        rows += hit[0]
                        skipped |= hit[1]
                        if progress:
                            progress.advance(task)
                        continue
                    if progress:
                        progress.update(task, description=f"{kind} {dt_name} {n}x{d} {mode}")
                    steps, cell_rows, cell_skipped = {}, [], {}
                    with torch.set_grad_enabled(mode != "fwd"):
                        for m in methods:
                            fn = _method(m, kind, compiled)
                            if fn is None:
                                cell_skipped[f"{m}/{kind}"] = "not importable here, or no such fused op"
                                continue
                            try:
                                steps[m] = make_step(fn, mode, n, d, dtype, kind, device)
                                steps[m]()
                            except Exception as e:  # noqa: BLE001  (a peer's API we could not call: say so)
                                steps.pop(m, None)
                                cell_skipped[f"{m}/{kind}/{dt_name}"] = f"{type(e).__name__}: {e}"[:200]
                        steps["floor"] = floor_step
                        timings = timer(steps, device)
                    floor = 2 * floor_bytes / timings["floor"].median_s / 1e9
                    mb = min_bytes(mode, n, d, es)
                    for m in steps:
                        if m == "floor":
                            continue
                        t = timings[m]
                        cell_rows.append(Row(kind, dt_name, n, d, mode, m, t.median_s * 1e3, t.p10_s * 1e3,
                                             t.p90_s * 1e3, t.runs, mb, mb / t.median_s / 1e9, floor,
                                             (mb / (floor * 1e9)) / t.median_s))
                    rows += cell_rows
                    skipped |= cell_skipped
                    append_cell(journal, key, methods, cell_skipped, cell_rows)
                    del steps
                    if device == "cuda":
                        torch.cuda.empty_cache()
                    if progress:
                        progress.advance(task)
    return rows, skipped


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", default=",".join(f"{n}x{d}" for n, d in SHAPES), help="rows x hidden, comma separated")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="comma separated, of float32, bfloat16, float16")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma separated norms, of layer, rms")
    p.add_argument("--modes", default=",".join(MODES), help="comma separated, of fwd, bwd, fwdbwd")
    p.add_argument("--methods", default=",".join(METHODS), help="comma separated, of " + ", ".join(METHODS))
    p.add_argument("--ops", default="add_norm",
                   help="comma separated, of add_norm (default) and the fused forms of addnorm.bench.fused_forms "
                        "(norm_add, parallel, parallel2, dyt, derf, stream_read, stream_write, mhc_pre) and mhc "
                        "(mhc_pre + stream_write); all: every one. The fused forms go to fused_forms_gpu.{json,md} "
                        "(addnorm.bench.gpu_forms)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cuda (default); cpu only checks the script itself, its numbers mean nothing for a GPU")
    p.add_argument("--out", default="benchmarks/results", help="directory for CSV/JSON (default %(default)s)")


def main_from_args(args) -> int:
    """bench_gpu.py: Add & Norm's table (``--ops add_norm``, the default) and the other fused forms' (``gpu_forms``),
    every option checked before either is measured."""
    try:
        ops = gpu_forms.parse_ops(getattr(args, "ops", "add_norm"))
        opts = parse_options(argparse.Namespace(**{**vars(args), "ops": "add_norm"}), METHODS)
    except ValueError as e:
        print(f"bench_gpu: error: {e}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: the GPU benchmark measures nothing (GPU numbers are not measured, never "
              "estimated). Run it on a machine with an NVIDIA GPU and `pip install 'addnorm[gpu]'`.", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if "add_norm" in ops:
        _add_norm_table(opts, args.device, out_dir)
    forms = [o for o in ops if o != "add_norm"]
    if forms:
        gpu_forms.measure_and_write(forms, opts, args.device, out_dir)
    return 0


def _add_norm_table(opts: dict, device: str, out_dir: Path) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    shapes, dtypes, kinds, modes, methods = (opts[k] for k in ("shapes", "dtypes", "kinds", "modes", "methods"))
    tag = "gpu" if device == "cuda" else "gpu_cpu"
    journal = out_dir / f"add_norm_{tag}.partial.jsonl"  # resumable: finished cells survive a cut-short run
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as pr:
        rows, skipped = run(shapes, dtypes, kinds, modes, methods, device, pr, journal=journal)
    cond = conditions(device, skipped)
    csv_path, json_path = write_results(rows, cond, out_dir, tag=tag)
    journal.unlink(missing_ok=True)
    _print_summary(rows)
    print(f"results: {csv_path}  {json_path}")
    for k, v in skipped.items():
        print(f"skipped {k}: {v}")


def _print_summary(rows: list[Row]) -> None:
    """addnorm's time against each other method, and its fraction of the copy bandwidth, per cell."""
    cells: dict = {}
    for r in rows:
        cells.setdefault((r.kind, r.dtype, r.rows, r.hidden, r.mode), {})[r.method] = r
    print(f"{'cell':34} {'addnorm ms':>10} {'of copy bw':>10}  speedup vs " + ", ".join(METHODS[1:]))
    for key, c in cells.items():
        if "addnorm" not in c:
            continue
        a = c["addnorm"]
        ratios = ", ".join(f"{m} {c[m].median_ms / a.median_ms:.2f}x" for m in METHODS[1:] if m in c)
        print(f"{' '.join(map(str, key)):34} {a.median_ms:10.3f} {a.frac_of_floor:10.2f}  {ratios}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m addnorm.bench.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(main_from_args(parser.parse_args()))
