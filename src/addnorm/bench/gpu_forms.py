"""The fused forms beyond Add & Norm on a GPU: addnorm's kernels vs eager vs torch.compile vs Liger-Kernel (where
importable) vs the device's copy bandwidth (``python benchmarks/bench_gpu.py --ops all``).

The ops, their inputs, eager forms and minimum bytes are ``fused_forms``' (the CPU benchmark's), moved to the
device; timed as ``gpu`` times Add & Norm (CUDA events around blocks of calls, methods interleaved, the copy of
512 MiB timed among them), one row per op x norm x dtype x shape x mode x method, written to
``fused_forms_gpu.{json,md}``. One op more, here only:

  * mhc -- mHC's whole connection around an identity layer: ``mhc_pre`` then ``stream_write(X, h, H_post, H_res)``,
    what LigerMHC's forward computes (its minimum bytes: the two ops' own, as the two passes that a real layer
    between them makes)

Liger-Kernel's counterparts (the best a Liger user can write: Liger's kernels where it has one, eager torch for
the rest; ``liger`` rows only where it has a kernel for the op):

  * parallel, parallel2 (rms) -- ``x + x2`` in torch, then LigerFusedAddRMSNormFunction (its fused residual add +
    RMSNorm, returning (y, s) as ours); parallel2's second norm of s is LigerRMSNormFunction. Liger has neither a
    fused add + LayerNorm nor a two-output norm
  * norm_add (rms) -- LigerRMSNormFunction of x, then ``r + y`` in torch (Liger has no norm-then-add)
  * dyt -- ``s = x + r`` in torch, then LigerDyTFunction (tanh; Liger has no Derf)
  * stream_read -- ``liger_mhc_pre``'s Function, ``h = sum_i H_pre[i] X_i``: the same op
  * stream_write -- ``liger_mhc_post_res``'s Function, ``X'_o = sum_i H_res[o, i] X_i + H_post[o] y``: the same op
    (ours also writes q, the per-token sum of squares of X' that the next read's RMS needs: n floats a token)
  * mhc_pre -- ``liger_mhc_coeffs`` (the RMS of vec(X), the projection phi, the sigmoids, Sinkhorn-Knopp) then
    ``liger_mhc_pre`` (h): two passes over the stream where ours makes one
  * mhc -- coeffs, pre, post_res: LigerMHC(nn.Identity())'s forward

Liger's mHC conventions (liger_kernel/ops/mhc.py, Liger-Kernel >= 0.8.0) and how ours are given to it: X (..., n, C)
flattened to vec(X) row-major as ours; phi (nC, n^2 + 2n) with the columns [pre | post | res, (out, in) row-major]
as ours; one bias b = cat(b_pre, b_post, vec(b_res)) in float32; alpha_pre/post/res 0-dim tensors; H_pre =
sigmoid(.) + pre_eps (0, as ours), H_post = post_mult (2, as ours) * sigmoid(.); rms_eps 1e-6 as ours; H_res by
tmax = 20 rounds of a row then a column normalization (the first row one a softmax; sinkhorn_eps 1e-6, Liger's
default) where ours makes 20 rounds of column then row (the same count of normalizations); H_res[o, i] mixes
stream i into stream o, as ours. Its coefficients are float32 as ours; phi is given in X's dtype when X is
bfloat16/float16 (Liger's recommended set-up: tensor-core matmuls, as LigerMHC's phi_dtype), float32 otherwise,
with allow_fp32=True for float32 X. These conversions are made once, outside the timed calls.

    python benchmarks/bench_gpu.py --ops all [--shapes 8192x4096] [--dtypes bfloat16] [--methods ...]

Every cell compiles torch.compile afresh (so no cell falls back to eager under compile's name): the whole default
grid takes long; a run that is cut short resumes from ``fused_forms_gpu.partial.jsonl`` in --out when run again.
Without a CUDA device it says so and measures nothing (exit 2); ``--device cpu`` only checks the script itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..harness.store import atomic_write_text
from . import fused_forms, gpu_cells
from .fused_forms import NORM_OPS, OpRow, SINKHORN_ITERS
from .gpu_cells import append_cell, launch_label, read_cells

GPU_OPS = [*fused_forms.OPS, "mhc"]  # mhc: mhc_pre + stream_write, LigerMHC's whole forward
METHODS = ["addnorm", "eager", "compile", "liger"]
RMS_EPS = 1e-6  # Liger's norms' eps (the eager norms keep torch's default: the time does not depend on it)


def min_bytes(op: str, mode: str, n: int, d: int, es: int) -> int:
    if op == "mhc":
        return sum(fused_forms.min_bytes(o, mode, n, d, es) for o in ("mhc_pre", "stream_write"))
    return fused_forms.min_bytes(op, mode, n, d, es)


def _source_op(op: str) -> str:
    """The fused_forms op whose inputs (and used inputs) an op takes."""
    return "mhc_pre" if op == "mhc" else op


def _form(forms, op: str, kind: str):
    """op's function from ``forms`` (fused_forms.eager or .fused); "mhc" is mhc_pre, then stream_write around an
    identity layer (what LigerMHC's forward computes)."""
    if op != "mhc":
        return forms(op, kind)
    pre, write = forms("mhc_pre", "-"), forms("stream_write", "-")

    def mhc(*a):
        h, hpo, hr = pre(*a)
        return write(a[0], h, None, hpo, hr)

    return mhc


def eager(op: str, kind: str):
    return _form(fused_forms.eager, op, kind)


def fused(op: str, kind: str):
    return _form(fused_forms.fused, op, kind)


def _liger_mhc_args(args, grad):
    """Our mhc_pre inputs (X, phi, a_pre, a_post, a_res, b_pre, b_post, b_res) as Liger takes them: (X, phi, b,
    a_pre, a_post, a_res), new leaves made once (phi in X's dtype when that is half precision; one float32 b)."""
    x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res = (a.detach() for a in args)
    half = x.dtype in (torch.float16, torch.bfloat16)
    b = torch.cat([b_pre.reshape(-1), b_post.reshape(-1), b_res.reshape(-1)]).float()
    new = (x, phi.to(x.dtype if half else torch.float32).contiguous(), b, a_pre.float(), a_post.float(), a_res.float())
    new = tuple(t.requires_grad_(grad) for t in new)  # detached: leaves of their own (X shares our X's memory)
    return new, list(new)


def liger(op: str, kind: str):
    """(fn, prepare) for Liger's counterpart of ``op`` (module docstring), or None where Liger is not importable or
    has no kernel for it. ``prepare(args, grad) -> (args, params)`` converts the inputs once; None: ours as they are.
    """
    try:
        if op in ("mhc_pre", "mhc", "stream_read", "stream_write"):
            from liger_kernel.ops.mhc import LigerMHCCoeffsFunction, LigerMHCPostResFunction, LigerMHCPreFunction
        elif op in ("parallel", "parallel2", "norm_add"):
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        elif op == "dyt":
            from liger_kernel.ops.dyt import LigerDyTFunction
        else:
            return None
    except ImportError:
        return None

    def coeffs(x, phi, b, a_pre, a_post, a_res):
        # (x, phi, b, alpha_pre, alpha_post, alpha_res, allow_fp32, tmax, rms_eps, pre_eps, sinkhorn_eps, post_mult)
        return LigerMHCCoeffsFunction.apply(x, phi, b, a_pre, a_post, a_res, True, SINKHORN_ITERS, 1e-6, 0.0, 1e-6,
                                            2.0)

    if op == "stream_read":
        return (lambda X, y, hp, hpo, hr: (LigerMHCPreFunction.apply(X, hp),)), None
    if op == "stream_write":
        return (lambda X, y, hp, hpo, hr: (LigerMHCPostResFunction.apply(X, y, hpo, hr),)), None
    if op == "mhc_pre":
        def pre(x, phi, b, a_pre, a_post, a_res):
            h_pre, h_post, h_res = coeffs(x, phi, b, a_pre, a_post, a_res)
            return LigerMHCPreFunction.apply(x, h_pre), h_post, h_res

        return pre, _liger_mhc_args
    if op == "mhc":
        def mhc(x, phi, b, a_pre, a_post, a_res):
            h_pre, h_post, h_res = coeffs(x, phi, b, a_pre, a_post, a_res)
            return (LigerMHCPostResFunction.apply(x, LigerMHCPreFunction.apply(x, h_pre), h_post, h_res),)

        return mhc, _liger_mhc_args
    if op == "dyt":
        def dyt(x, x2, r, w, b, w2, b2, a, sh):  # Liger's alpha has one element (LigerDyT's parameter), ours none
            s = x + r
            return LigerDyTFunction.apply(s, a.reshape(1), w, b), s

        return dyt, None
    if kind != "rms":
        return None
    # (X, R, W, eps, offset, casting_mode, in_place) / (X, W, eps, offset, casting_mode, in_place): in_place=False,
    # as the timed backward reuses its upstream gradients (in place, Liger would write dX over them)
    def norm_add(x, x2, r, w, b, w2, b2):
        return (r + LigerRMSNormFunction.apply(x, w, RMS_EPS, 0.0, "llama", False),)

    def par(x, x2, r, w, b, w2, b2):
        y, s = LigerFusedAddRMSNormFunction.apply(x + x2, r, w, RMS_EPS, 0.0, "llama", False)
        if op == "parallel":
            return y, s
        return y, LigerRMSNormFunction.apply(s, w2, RMS_EPS, 0.0, "llama", False), s

    return (norm_add if op == "norm_add" else par), None


def make_step(fn, op, mode, n, d, dtype, kind, device, prepare=None):
    """One timed call of ``mode``: fused_forms' make_step on the device, or, with ``prepare``, the same over the
    converted inputs (the gradients taken with respect to every converted input)."""
    src = _source_op(op)
    if prepare is None:
        return fused_forms.make_step(fn, src, mode, n, d, dtype, kind, device=device)
    grad = mode != "fwd"
    args, params = prepare(fused_forms.make_inputs(src, n, d, dtype, kind, grad, device), grad)
    if not grad:
        return lambda: fn(*args)
    ups = [torch.randn(o.shape).to(device=o.device, dtype=o.dtype) for o in fn(*args)]
    if mode == "bwd":
        outs = fn(*args)
        return lambda: torch.autograd.grad(outs, params, ups, retain_graph=True)
    return lambda: torch.autograd.grad(fn(*args), params, ups)


def _method(method, op, kind):
    """(fn, prepare) or None (no such method for this op, or not importable here)."""
    if method == "addnorm":
        return fused(op, kind), None
    if method == "eager":
        return eager(op, kind), None
    if method == "compile":
        torch._dynamo.reset()  # one compilation per cell: past dynamo's recompile limit it would time eager
        return torch.compile(eager(op, kind), dynamic=False), None
    if method == "liger":
        return liger(op, kind)
    return None  # flash_attn: Add & Norm only (gpu.py)


def _cell_key(op, kind, dt, n, d, mode) -> str:
    return f"{op}|{kind}|{dt}|{n}|{d}|{mode}|{launch_label()}"  # other launch parameters: measured again


def run(ops, shapes, dtypes, kinds, modes, methods=METHODS, device="cuda", progress=None, *, timer=None,
        floor_bytes: int | None = None, journal: Path | None = None) -> tuple[list[OpRow], dict]:
    """Every op x norm x dtype x shape x mode, its methods timed side by side with the copy floor. Returns the rows
    and {what: why} for each method not timed (not importable, no such op, or its call failed). ``timer(steps,
    device) -> {name: Timing}`` defaults to ``gpu_cells.timed`` (CUDA events; a short CPU timing for --device cpu)."""
    timer = timer or gpu_cells.timed
    floor_bytes = floor_bytes or gpu_cells.FLOOR_BYTES
    done = read_cells(journal, OpRow)
    rows, skipped = [], {}
    src = torch.ones(floor_bytes // 4, device=device)
    dst = torch.empty_like(src)
    floor_step = lambda: dst.copy_(src)  # noqa: E731
    total = sum(len(kinds) if op in NORM_OPS else 1 for op in ops) * len(shapes) * len(dtypes) * len(modes)
    task = progress.add_task("gpu fused forms", total=total) if progress else None
    for op in ops:
        for n, d in shapes:
            for dt_name in dtypes:
                dtype = getattr(torch, dt_name)
                es = torch.tensor([], dtype=dtype).element_size()
                for kind in (kinds if op in NORM_OPS else ["-"]):  # DyT, Derf, the stream ops: no norm kind
                    for mode in modes:
                        key = _cell_key(op, kind, dt_name, n, d, mode)
                        hit = done.get((key, tuple(methods)))  # measured before, with the same methods
                        if hit is not None:
                            rows += hit[0]
                            skipped |= hit[1]
                        else:
                            if progress:
                                progress.update(task, description=f"{op} {kind} {dt_name} {n}x{d} {mode}")
                            cell_rows, cell_skipped = _cell(op, kind, dt_name, dtype, es, n, d, mode, methods,
                                                            device, timer, floor_step, floor_bytes)
                            rows += cell_rows
                            skipped |= cell_skipped
                            append_cell(journal, key, methods, cell_skipped, cell_rows)
                        if progress:
                            progress.advance(task)
    return rows, skipped


def _cell(op, kind, dt_name, dtype, es, n, d, mode, methods, device, timer, floor_step, floor_bytes):
    skipped, steps = {}, {}
    with torch.set_grad_enabled(mode != "fwd"):
        for m in methods:
            spec = _method(m, op, kind)
            if spec is None:
                skipped[f"{m}/{op}/{kind}"] = "not importable here, or no such fused op"
                continue
            fn, prepare = spec
            try:
                steps[m] = make_step(fn, op, mode, n, d, dtype, kind, device, prepare)
                steps[m]()
            except Exception as e:  # noqa: BLE001  (a peer's API we could not call, or out of memory: say so)
                steps.pop(m, None)
                skipped[f"{m}/{op}/{kind}/{dt_name}/{n}x{d}/{mode}"] = f"{type(e).__name__}: {e}"[:200]
        rows = []
        if steps:
            steps["floor"] = floor_step
            timings = timer(steps, device)
            floor = 2 * floor_bytes / timings["floor"].median_s / 1e9
            mb = min_bytes(op, mode, n, d, es)
            for m in methods:
                if m in steps:
                    t = timings[m]
                    rows.append(OpRow(op, kind, dt_name, n, d, mode, m, t.median_s * 1e3, t.p10_s * 1e3, t.p90_s * 1e3,
                                      t.runs, mb, mb / t.median_s / 1e9, floor, (mb / (floor * 1e9)) / t.median_s))
    del steps
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows, skipped


def markdown(rows: list[OpRow]) -> str:
    """One line per cell: addnorm's time, GB/s and fraction of the copy bandwidth; each other method's time over
    addnorm's (above 1: addnorm is faster)."""
    by: dict = {}
    for r in rows:
        by.setdefault((r.op, r.kind, r.dtype, r.rows, r.hidden, r.mode), {})[r.method] = r
    others = [m for m in METHODS if m != "addnorm"]
    head = ["op", "norm", "dtype", "shape", "mode", "addnorm ms", "GB/s", "of copy bw", *(f"vs {m}" for m in others)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (op, kind, dt, n, d, mode), c in by.items():
        a = c.get("addnorm")
        if a is None:
            continue
        ratios = " | ".join(f"{c[m].median_ms / a.median_ms:.2f}×" if m in c else "—" for m in others)
        out.append(f"| {op} | {kind} | {dt} | {n}×{d} | {mode} | {a.median_ms:.3f} | {a.gbps:.0f} | "
                   f"{a.frac_of_floor:.2f} | {ratios} |")
    return "\n".join(out)


def conditions(device: str, skipped: dict) -> dict:
    from importlib import metadata

    try:
        liger_version = metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        liger_version = None
    return gpu_cells.conditions(device, skipped) | {
        "liger_kernel": liger_version, "n_streams": fused_forms.N_STREAMS, "sinkhorn_iters": SINKHORN_ITERS,
        "compile": "torch.compile(eager, dynamic=False), compiled afresh per cell",
        "min_bytes": "fused_forms.TRAFFIC (mhc: mhc_pre's plus stream_write's)",
        "liger_mhc": "phi in X's dtype when half precision, one float32 b = cat(b_pre, b_post, vec(b_res)), tmax 20, "
                     "rms_eps 1e-6, pre_eps 0, sinkhorn_eps 1e-6, post_mult 2, allow_fp32"}


def write(rows: list[OpRow], cond: dict, out_dir: Path, tag: str = "gpu") -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"fused_forms_{tag}.json"
    atomic_write_text(path, json.dumps({"conditions": cond, "rows": [asdict(r) for r in rows]}, indent=1))
    atomic_write_text(out_dir / f"fused_forms_{tag}.md", markdown(rows) + "\n")
    return path


def parse_ops(s: str) -> list[str]:
    """--ops: comma separated, of add_norm and GPU_OPS; ``all`` is add_norm and every one of them."""
    valid = ["add_norm", *GPU_OPS]
    items = list(dict.fromkeys(t for t in s.split(",") if t))
    if "all" in items:
        return valid
    if not items:
        raise ValueError("--ops: empty")
    bad = [t for t in items if t not in valid]
    if bad:
        raise ValueError(f"--ops: unknown value(s) {', '.join(bad)}; valid: all, {', '.join(valid)}")
    return items


def measure_and_write(forms: list[str], opts: dict, device: str, out_dir: Path) -> Path:
    """bench_gpu.py's fused forms (``gpu.main_from_args`` checked the options and the device): measured, written
    to ``fused_forms_<tag>.{json,md}`` in ``out_dir``, printed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    tag = "gpu" if device == "cuda" else "gpu_cpu"
    journal = out_dir / f"fused_forms_{tag}.partial.jsonl"  # resumable: finished cells survive a cut-short run
    t0 = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as pr:
        rows, skipped = run(forms, opts["shapes"], opts["dtypes"], opts["kinds"], opts["modes"], opts["methods"],
                            device, pr, journal=journal)
    path = write(rows, conditions(device, skipped) | {"ops": forms}, out_dir, tag)
    journal.unlink(missing_ok=True)
    print(markdown(rows))
    print(f"results: {path}  {path.with_suffix('.md')}  ({time.perf_counter() - t0:.0f} s)")
    for k, v in skipped.items():
        print(f"skipped {k}: {v}")
    return path
