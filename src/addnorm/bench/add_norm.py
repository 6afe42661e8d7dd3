"""Fused Add & Norm vs eager PyTorch vs torch.compile vs the memory-bandwidth floor.

For each shape x dtype x norm x mode, in one process and one run:
  * floor   -- torch's copy of a 256 MiB buffer into pre-faulted memory: the DRAM bandwidth a
               streaming op can hope for on this machine (GB/s, bytes read + written); shapes
               whose tensors fit in the caches can beat it. Measured once at the start and, for
               every cell that moves >= 32 MiB, again side by side with that cell's methods
  * addnorm -- addnorm.add_layer_norm / add_rms_norm (the fused CPU kernel, through autograd)
  * eager   -- ``s = x + r; y = F.layer_norm(s)`` (or F.rms_norm)
  * compile -- torch.compile of the eager function
  * the CPU engines' own fused Add & Norm, when named in ``--methods`` and installed (``bench.peers``):
    ``onnxruntime`` (its SkipLayerNormalization / SkipSimplifiedLayerNormalization) and ``openvino``; forward
    only (they are inference engines), each in the dtypes it runs
Modes: ``fwd`` (inference, no graph), ``bwd`` (backward alone, graph retained) and ``fwdbwd``
(one training step of the unit). Every time is a median of many runs with the p10-p90 spread,
the methods of a cell timed interleaved (rounds of a few calls of each in turn) so that this
machine's drifts in speed fall on all of them alike;
GB/s is computed on the *minimum* bytes (fwd: read x, r; write y, s. bwd: read dy, ds, s; write
dx) so methods that move more data score lower. Results go to CSV and JSON.

Fresh output buffers of >= 32 MiB are page-faulted on every call under glibc's default
allocator (it returns them to the OS on free); ``--allocator tuned`` re-runs this benchmark in a
child process with MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ raised, so freed memory is reused;
``--allocator default`` runs it under glibc as it is; ``both`` (the default) writes both tables.
addnorm's own large outputs come from its output pool either way (``addnorm.output_pool``); eager and
compile allocate through torch. The allocator in force is recorded with the results.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import functional as AF
from ..harness.store import atomic_write, atomic_write_text, check_writable_dir, read_journal
from ..harness.timing import measure_interleaved
from . import fused_forms, peers
from .cpu_cells import (FLOOR_BYTES, LOCAL_FLOOR_BYTES, TUNED_MALLOC, conditions, copy_floor_gbps, copy_step,
                        journal_conditions, open_journal)

SHAPES = [(64, 768), (4096, 768), (8192, 1024), (2048, 4096), (16384, 768)]
DTYPES = ["float32", "bfloat16"]
KINDS = ["layer", "rms"]
MODES = ["fwd", "bwd", "fwdbwd"]
METHODS = ["addnorm", "eager", "compile"]
PEERS = list(peers.PEERS)  # optional: measured when named and installed
# the eps every method runs with: torch's defaults, which addnorm's and eager's calls leave in force (RMSNorm: the
# float32 machine epsilon, the type its statistics are computed in)
EPS = {"layer": 1e-5, "rms": torch.finfo(torch.float32).eps}


@dataclass(frozen=True)
class Row:
    kind: str
    dtype: str
    rows: int
    hidden: int
    mode: str
    method: str
    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int
    min_bytes: int
    gbps: float  # min_bytes / median time
    floor_gbps: float  # the copy bandwidth measured for this shape and dtype
    frac_of_floor: float  # (min_bytes / floor) / median time: 1.0 = at the bandwidth limit


def eager_add_norm(kind: str):
    def f(x, r, w, b):
        s = x + r
        y = F.layer_norm(s, (x.shape[-1],), w, b) if kind == "layer" else F.rms_norm(s, (x.shape[-1],), w)
        return y, s

    return f


def addnorm_add_norm(kind: str):
    def f(x, r, w, b):
        if kind == "layer":
            return AF.add_layer_norm(x, r, x.shape[-1], w, b)
        return AF.add_rms_norm(x, r, x.shape[-1], w)

    return f


def min_bytes(mode: str, n: int, d: int, es: int) -> int:
    per = {"fwd": 4, "bwd": 4, "fwdbwd": 8}[mode]
    return per * n * d * es


def _inputs(n, d, dtype, kind, grad, device="cpu"):
    g = torch.Generator().manual_seed(0)  # drawn on the CPU, then moved: the same values on every device
    mk = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype).requires_grad_(grad)  # noqa: E731
    return mk(n, d), mk(n, d), mk(d), (mk(d) if kind == "layer" else None)


def make_step(fn, mode, n, d, dtype, kind, device="cpu"):
    """The zero-argument call that one timed run of ``mode`` makes, its inputs made once (on ``device``)."""
    if mode == "fwd":
        args = _inputs(n, d, dtype, kind, False, device)
        return lambda: fn(*args)  # run under no_grad by time_cell
    args = _inputs(n, d, dtype, kind, True, device)
    params = [a for a in args if a is not None]
    dy = torch.randn(n, d).to(device=device, dtype=dtype)
    ds = torch.randn(n, d).to(device=device, dtype=dtype)
    if mode == "bwd":
        y, s = fn(*args)
        return lambda: torch.autograd.grad([y, s], params, [dy, ds], retain_graph=True)

    def step():
        y, s = fn(*args)
        torch.autograd.grad([y, s], params, [dy, ds])

    return step


def time_cell(fns: dict, mode, n, d, dtype, kind, floor_step=None) -> dict:
    """{method: Timing} for one shape/dtype/norm/mode, the methods timed interleaved (side by side);
    with ``floor_step``, the floor copy is timed among them too (as "floor")."""
    with torch.set_grad_enabled(mode != "fwd"):
        steps = {m: make_step(fn, mode, n, d, dtype, kind) for m, fn in fns.items()}
        if floor_step is not None:
            steps["floor"] = floor_step
        return measure_interleaved(steps)


def _key(kind, dtype, n, d, mode, method) -> str:
    return f"{kind}|{dtype}|{n}|{d}|{mode}|{method}"


def run_benchmark(shapes, dtypes, kinds, modes, methods, progress=None, floor: float | None = None,
                  journal: Path | None = None) -> list[Row]:
    """Measure every combination. With a ``journal`` (a JSON-lines file), each finished row is appended
    as it is measured and rows already in it are reused: an interrupted run resumes where it stopped."""
    done: dict[str, Row] = {_key(r.kind, r.dtype, r.rows, r.hidden, r.mode, r.method): r
                            for r in read_journal(journal, lambda rec: Row(**rec))}
    rows: list[Row] = []
    compiled = {}
    total = len(shapes) * len(kinds) * sum(_runs(m, mode, dt) for m in methods for mode in modes for dt in dtypes)
    task = progress.add_task("benchmark", total=total) if progress else None
    floor = floor or copy_floor_gbps()
    floor_step = None  # made on first use: 512 MiB of buffers
    for n, d in shapes:
        for dt_name in dtypes:
            dtype = getattr(torch, dt_name)
            es = torch.tensor([], dtype=dtype).element_size()
            for kind in kinds:
                for mode in modes:
                    cell, todo = {}, {}
                    for method in (m for m in methods if _runs(m, mode, dt_name)):
                        key = _key(kind, dt_name, n, d, mode, method)
                        if key in done:
                            cell[method] = done[key]
                            if progress:
                                progress.advance(task)
                        else:
                            todo[method] = _method_fn(method, kind, n, d, dt_name, mode, compiled)
                    if not todo:
                        rows.extend(cell[m] for m in methods if m in cell)
                        continue
                    if progress:
                        progress.update(task, description=f"{kind} {dt_name} {n}x{d} {mode}: {', '.join(todo)}")
                    mb = min_bytes(mode, n, d, es)
                    local = mb >= LOCAL_FLOOR_BYTES
                    if local and floor_step is None:
                        floor_step = copy_step()
                    timings = time_cell(todo, mode, n, d, dtype, kind, floor_step if local else None)
                    cell_floor = 2 * FLOOR_BYTES / timings["floor"].median_s / 1e9 if local else floor
                    for method in todo:
                        t = timings[method]
                        row = Row(kind, dt_name, n, d, mode, method, t.median_s * 1e3, t.p10_s * 1e3, t.p90_s * 1e3,
                                  t.runs, mb, mb / t.median_s / 1e9, cell_floor,
                                  (mb / (cell_floor * 1e9)) / t.median_s)
                        cell[method] = row
                        if journal is not None:
                            with journal.open("a") as f:
                                f.write(json.dumps(asdict(row)) + "\n")
                        if progress:
                            progress.advance(task)
                    rows.extend(cell[m] for m in methods if m in cell)
    return rows


def _runs(method: str, mode: str, dtype: str) -> bool:
    """Whether a cell of this mode and dtype times ``method`` (a peer runs forward, in its own dtypes)."""
    return method not in PEERS or peers.runs(method, mode, dtype)


def _method_fn(method, kind, n, d, dt_name, mode, compiled: dict):
    if method in PEERS:  # one graph per cell, built on the first (warm-up) call
        return peers.method(method, peers.PeerCell(kind, n, d, dt_name, EPS[kind], torch.get_num_threads()))
    if method == "addnorm":
        return addnorm_add_norm(kind)
    if method == "eager":
        return eager_add_norm(kind)
    # one fresh compilation per configuration: dynamo's recompile limit would otherwise silently fall
    # back to eager after 8 shapes
    key = (kind, n, d, dt_name, mode)
    if key not in compiled:
        torch._dynamo.reset()
        compiled.clear()
        compiled[key] = torch.compile(eager_add_norm(kind), dynamic=False)
    return compiled[key]


def write_results(rows: list[Row], cond: dict, out_dir: Path, tag: str | None = None) -> tuple[Path, Path]:
    """add_norm_<tag>.{csv,json} (tag: the allocator by default)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = tag or cond["allocator"]
    csv_path = out_dir / f"add_norm_{tag}.csv"
    json_path = out_dir / f"add_norm_{tag}.json"
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=list(asdict(rows[0]).keys()))
    w.writeheader()
    for r in rows:
        w.writerow(asdict(r))
    # whole files or none: an interrupted run leaves the previous results, not half of new ones
    atomic_write(csv_path, lambda tmp: Path(tmp).write_bytes(buf.getvalue().encode()))
    atomic_write_text(json_path, json.dumps({"conditions": cond, "rows": [asdict(r) for r in rows]}, indent=1))
    return csv_path, json_path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", default=",".join(f"{n}x{d}" for n, d in SHAPES), help="rows x hidden, comma separated")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="comma separated, of float32, bfloat16, float16")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma separated norms, of layer, rms")
    p.add_argument("--modes", default=",".join(MODES), help="comma separated, of fwd, bwd, fwdbwd")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma separated, of addnorm, eager, compile and the CPU engines "
                        f"{', '.join(PEERS)} (forward only; {peers.INSTALL}); default %(default)s")
    p.add_argument("--ops", default="add_norm",
                   help="comma separated, of add_norm (x + residual, then Norm), norm_add (residual + Norm(x)), "
                        "parallel (x + x2 + residual, one norm), parallel2 (two norms), dyt and derf (fused with "
                        "the add), stream_read and stream_write (the widened stream, n = 4), mhc_pre (mHC's pre "
                        "step, n = 4); default %(default)s")
    p.add_argument("--allocator", choices=["both", "tuned", "default", "current"], default="both",
                   help="both: the tuned table, then the default one (default); tuned: re-run with glibc told to "
                        "keep freed memory; default: glibc as is; current: run in this process with whatever is "
                        "in force")
    p.add_argument("--out", default="benchmarks/results", help="directory for CSV/JSON (default %(default)s)")


def _parse_list(option: str, s: str, valid=None) -> list[str]:
    items = list(dict.fromkeys(t for t in s.split(",") if t))  # each once, in the order given
    if not items:
        raise ValueError(f"{option}: empty")
    bad = [t for t in items if valid is not None and t not in valid]
    if bad:
        raise ValueError(f"{option}: unknown value(s) {', '.join(bad)}; valid: {', '.join(valid)}")
    return items


def _parse_shape(s: str) -> tuple[int, int]:
    parts = s.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--shapes: {s!r} is not ROWSxHIDDEN with both >= 1 (e.g. 4096x768)")
    return int(parts[0]), int(parts[1])


def parse_options(args, methods=None) -> dict:
    """Every option checked before any work (this benchmark's and the GPU one's, with its own ``methods``); a
    ValueError's message names the option. A peer that is not installed is not an error here: the run skips it
    and says so (``available_methods``)."""
    methods = METHODS + PEERS if methods is None else methods
    opts = {"shapes": list(dict.fromkeys(_parse_shape(t) for t in _parse_list("--shapes", args.shapes))),
            "dtypes": _parse_list("--dtypes", args.dtypes, DTYPES + ["float16"]),
            "kinds": _parse_list("--kinds", args.kinds, KINDS),
            "modes": _parse_list("--modes", args.modes, MODES),
            "methods": _parse_list("--methods", args.methods, methods),
            "ops": _parse_list("--ops", getattr(args, "ops", "add_norm"), ["add_norm", *fused_forms.OPS])}
    try:
        check_writable_dir(Path(args.out))
    except OSError as e:
        raise ValueError(f"--out: {e}") from None
    _check_memory(opts)
    return opts


def _check_memory(opts) -> None:
    """A shape whose tensors cannot fit is refused by name before any work (it raised from the allocator,
    mid-run, as a traceback). The count is a floor: a widened-stream op holds 4 streams per row, and each
    method's inputs, outputs and gradients are live at once (about 16 rows' worth in float32)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    widest = 4 if any(o in ("stream_read", "stream_write", "mhc_pre") for o in opts["ops"]) else 1
    for n, d in opts["shapes"]:
        need = 16 * 4 * n * d * widest
        if need > total:
            raise ValueError(f"--shapes: {n}x{d} needs about {need / 2**30:.0f} GiB of memory at once, more than "
                             f"this machine's {total / 2**30:.0f} GiB")


def available_methods(methods: list[str]) -> tuple[list[str], dict[str, str]]:
    """The methods that can run here, and {peer: why not} for each named peer that cannot (not installed)."""
    skipped = {m: peers.missing(m) for m in methods if m in PEERS and peers.missing(m)}
    return [m for m in methods if m not in skipped], skipped


def peer_conditions(methods: list[str], skipped: dict[str, str]) -> dict:
    """What the results record of the engines: each one's version, and why a named one was not measured."""
    cond = {}
    if any(m in PEERS for m in methods):
        cond["peers"] = {m: peers.version(m) for m in methods if m in PEERS}
    if skipped:
        cond["peers_skipped"] = skipped
    return cond


def main_from_args(args) -> int:
    try:
        opts = parse_options(args)
    except ValueError as e:
        print(f"addnorm bench: error: {e}", file=sys.stderr)
        return 2
    if args.allocator == "both":  # the default allocator's table beside the tuned one
        codes = [main_from_args(argparse.Namespace(**{**vars(args), "allocator": a})) for a in ("tuned", "default")]
        # a run killed by a signal returns -signal, which max() took for success
        return next((c if c > 0 else 128 - c for c in codes if c != 0), 0)
    if args.allocator != "current":
        env = dict(os.environ)
        for k in TUNED_MALLOC:
            env.pop(k, None)
        if args.allocator == "tuned":
            env.update(TUNED_MALLOC)
        env["ADDNORM_BENCH_ALLOCATOR"] = args.allocator
        # compile in-process: no pool of compile workers left running beside the measurements
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        cmd = [sys.executable, "-m", "addnorm.bench.add_norm", "--shapes", args.shapes, "--dtypes", args.dtypes,
               "--kinds", args.kinds, "--modes", args.modes, "--methods", args.methods, "--out", args.out,
               "--allocator", "current", "--ops", ",".join(opts["ops"])]
        return subprocess.call(cmd, env=env)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    shapes, dtypes, kinds, modes, methods = (opts[k] for k in ("shapes", "dtypes", "kinds", "modes", "methods"))
    allocator = os.environ.get("ADDNORM_BENCH_ALLOCATOR", "current")
    console = Console(emoji=False)
    methods, skipped = available_methods(methods)
    for reason in skipped.values():
        console.print(f"skipped: {reason}", markup=False)
    if not methods:
        print("addnorm bench: error: --methods: nothing left to measure", file=sys.stderr)
        return 2
    engines = peer_conditions(methods, skipped)
    fused_ops = [o for o in opts["ops"] if o != "add_norm"]
    core = [m for m in methods if m not in PEERS]  # the engines have no fused forms beyond Add & Norm
    if fused_ops and len(core) < len(methods):
        console.print(f"--ops {','.join(fused_ops)}: the engines ({', '.join(m for m in methods if m in PEERS)}) "
                      "have Add & Norm only; the fused forms are timed without them", markup=False)
    if fused_ops and core:
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        journal = out_dir / f"fused_forms_{allocator}.partial.jsonl"
        open_journal(journal, journal_conditions(allocator), console)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            frows = fused_forms.run(fused_ops, shapes, dtypes, kinds, modes, core, progress, journal)
        path = fused_forms.write(frows, out_dir, allocator)
        journal.unlink(missing_ok=True)
        console.print(fused_forms.markdown(frows), markup=False)
        console.print(f"results: {path}", markup=False)
    if "add_norm" not in opts["ops"]:
        return 0
    if not any(_runs(m, mode, dt) for m in methods for mode in modes for dt in dtypes):
        print(f"addnorm bench: error: --methods: none of {', '.join(methods)} runs in --modes {','.join(modes)} "
              f"with --dtypes {','.join(dtypes)} (the engines run fwd, in their own dtypes)", file=sys.stderr)
        return 2
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        floor = copy_floor_gbps()
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        journal = out_dir / f"add_norm_{allocator}.partial.jsonl"  # resumable: finished rows survive a Ctrl-C
        open_journal(journal, journal_conditions(allocator) | engines, console)
        rows = run_benchmark(shapes, dtypes, kinds, modes, methods, progress, floor, journal)
    cond = conditions(allocator) | {"floor_gbps": floor} | engines
    csv_path, json_path = write_results(rows, cond, out_dir)
    journal.unlink(missing_ok=True)
    from .report import summary_table

    console.print(summary_table(rows, cond, csv_path))
    console.print(f"results: {csv_path}  {json_path}", markup=False)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m addnorm.bench.add_norm")
    add_arguments(parser)
    sys.exit(main_from_args(parser.parse_args()))
