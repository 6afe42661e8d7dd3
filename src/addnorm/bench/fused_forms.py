"""The fused forms beyond Add & Norm vs eager vs torch.compile vs the copy floor (``addnorm bench --ops``).

Ops (each with LayerNorm and RMSNorm):
  * norm_add   -- ``residual + Norm(x)``            (OLMo 2's post-branch norms, sandwich's output norm)
  * parallel   -- ``s = x + x2 + residual; Norm(s)``  (GPT-J, Falcon: one norm of the new stream)
  * parallel2  -- the same with two norms of s       (GPT-NeoX: ln_1 and ln_2 of the next block)
  * dyt, derf  -- ``s = x + r; w f(alpha s + shift) + b`` (DyT, Derf fused with the add; "kind" is unused)
  * stream_read, stream_write -- the widened stream (n = 4): ``h = H_pre X``; ``X' = H_res X + H_post^T y``
    ("rows" are tokens, "hidden" is C; eager is the broadcast / batched-matmul form of ``model.streams``)
  * mhc_pre    -- mHC's pre step (n = 4): the RMS of vec(X), the projection phi (4C x 24), the sigmoids,
    20 Sinkhorn-Knopp rounds and h = H_pre X; eager is the same math in torch ops (``ops.mhc.formulas``), the
    minimum bytes the stream and h (the per-token coefficients, 49 float32 values a token, are not counted)
Timed as ``addnorm.bench.add_norm`` times Add & Norm: interleaved, medians with the p10-p90 spread, the
floor copied beside every cell that moves >= 32 MiB; GB/s on each op's minimum bytes (every input read
once, every output written once; a gradient that autograd passes on unchanged costs nothing).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..functional import fused as FF
from ..functional import mhc as MF
from ..functional import pointwise as PF
from ..functional import stream as SF
from ..harness.timing import measure_interleaved
from ..ops.mhc import formulas as mhc_formulas
from .cpu_cells import FLOOR_BYTES, LOCAL_FLOOR_BYTES, conditions, copy_floor_gbps, copy_step

OPS = ["norm_add", "parallel", "parallel2", "dyt", "derf", "stream_read", "stream_write", "mhc_pre"]
NORM_OPS = ("norm_add", "parallel", "parallel2")  # the ops with a LayerNorm / RMSNorm kind
N_STREAMS = 4  # the widened stream's width in the stream_* cells (mHC's and DeepSeek V4's n)
# tensors of N x D moved: (forward reads + writes, backward reads + writes); the stream ops' X is n of them
TRAFFIC = {"norm_add": (3, 3), "parallel": (5, 4), "parallel2": (6, 5), "dyt": (4, 4), "derf": (4, 4),
           "stream_read": (N_STREAMS + 1, 2 * N_STREAMS + 1), "stream_write": (2 * N_STREAMS + 1, 3 * N_STREAMS + 2),
           "mhc_pre": (N_STREAMS + 1, 2 * N_STREAMS + 1)}
SINKHORN_ITERS = 20


@dataclass(frozen=True)
class OpRow:
    op: str
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
    gbps: float
    floor_gbps: float
    frac_of_floor: float


def min_bytes(op: str, mode: str, n: int, d: int, es: int) -> int:
    f, b = TRAFFIC[op]
    return {"fwd": f, "bwd": b, "fwdbwd": f + b}[mode] * n * d * es


def _norm(kind, s, w, b):
    return F.layer_norm(s, (s.shape[-1],), w, b) if kind == "layer" else F.rms_norm(s, (s.shape[-1],), w)


def eager(op: str, kind: str):
    """The eager composite, as HF's modelling code writes it."""
    if op in ("dyt", "derf"):
        f = torch.tanh if op == "dyt" else torch.erf

        def pw(x, x2, r, w, b, w2, b2, a, sh):
            s = x + r
            return w * f(a * s + sh) + b, s

        return pw
    if op == "mhc_pre":
        def pre(*a):
            h, _, hpo, hr, _, _ = mhc_formulas.pre(*a, None, 1e-6, SINKHORN_ITERS)
            return h, hpo, hr

        return pre
    if op == "stream_read":
        return lambda X, y, hp, hpo, hr: ((hp.to(X.dtype).unsqueeze(-1) * X).sum(-2),)
    if op == "stream_write":
        return lambda X, y, hp, hpo, hr: (torch.matmul(hr.to(X.dtype), X)
                                          + hpo.to(X.dtype).unsqueeze(-1) * y.unsqueeze(-2),)
    if op == "norm_add":
        return lambda x, x2, r, w, b, w2, b2: (r + _norm(kind, x, w, b),)

    def par(x, x2, r, w, b, w2, b2):
        s = x2 + x + r
        return (_norm(kind, s, w, b), s) if op == "parallel" else (_norm(kind, s, w, b), _norm(kind, s, w2, b2), s)

    return par


def fused(op: str, kind: str):
    if op == "dyt":
        return lambda x, x2, r, w, b, w2, b2, a, sh: PF.add_dyt(x, r, a, w, b)
    if op == "derf":
        return lambda x, x2, r, w, b, w2, b2, a, sh: PF.add_derf(x, r, a, sh, w, b)
    if op == "stream_read":
        return lambda X, y, hp, hpo, hr: (SF.stream_read(X, hp),)
    if op == "stream_write":
        return lambda X, y, hp, hpo, hr: (SF.stream_write(X, y, hpo, hr)[0],)
    if op == "mhc_pre":
        def pre(*a):
            h, _, hpo, hr = MF.mhc_pre(*a, iters=SINKHORN_ITERS)
            return h, hpo, hr

        return pre
    if op == "norm_add":
        if kind == "layer":
            return lambda x, x2, r, w, b, w2, b2: (FF.layer_norm_add(x, r, x.shape[-1], w, b),)
        return lambda x, x2, r, w, b, w2, b2: (FF.rms_norm_add(x, r, x.shape[-1], w),)

    def par(x, x2, r, w, b, w2, b2):
        two = op == "parallel2"
        if kind == "layer":
            y, y2, s = FF.parallel_add_layer_norm(x, x2, r, x.shape[-1], w, b, w2 if two else None,
                                                  b2 if two else None)
        else:
            y, y2, s = FF.parallel_add_rms_norm(x, x2, r, x.shape[-1], w, w2 if two else None)
        return (y, s) if not two else (y, y2, s)

    return par


def make_inputs(op, n, d, dtype, kind, grad, device="cpu"):
    g = torch.Generator().manual_seed(0)  # drawn on the CPU, then moved: the same values on every device
    mk = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype).requires_grad_(grad)  # noqa: E731
    if op == "mhc_pre":  # mHC's parameters at their init scale (alpha 0.01, phi ~ N(0, 1/(nC)))
        K, m = N_STREAMS * d, 2 * N_STREAMS + N_STREAMS ** 2
        p = lambda t: t.to(device).requires_grad_(grad)  # noqa: E731
        return (mk(n, N_STREAMS, d), p(torch.randn(K, m, generator=g) / K ** 0.5),
                *(p(torch.tensor(0.01)) for _ in range(3)), p(torch.zeros(N_STREAMS)), p(torch.zeros(N_STREAMS)),
                p(torch.zeros(N_STREAMS, N_STREAMS)))
    if op.startswith("stream_"):
        c = lambda *s: torch.rand(*s, generator=g).to(device).requires_grad_(grad)  # noqa: E731  (float32 coefficients)
        return (mk(n, N_STREAMS, d), mk(n, d), c(n, N_STREAMS), c(n, N_STREAMS), c(n, N_STREAMS, N_STREAMS))
    base = (mk(n, d), mk(n, d), mk(n, d), mk(d), mk(d) if kind == "layer" else None, mk(d),
            mk(d) if kind == "layer" else None)
    if op in ("dyt", "derf"):
        return base[:4] + (mk(d),) + base[5:] + (torch.tensor(0.5, device=device, requires_grad=grad),
                                                 torch.tensor(0.1, device=device, requires_grad=grad))
    return base


_USED = {"norm_add": (0, 2, 3, 4), "parallel": (0, 1, 2, 3, 4), "parallel2": (0, 1, 2, 3, 4, 5, 6),
         "dyt": (0, 2, 3, 4, 7), "derf": (0, 2, 3, 4, 7, 8), "stream_read": (0, 2), "stream_write": (0, 1, 3, 4), "mhc_pre": tuple(range(8))}


def make_step(fn, op, mode, n, d, dtype, kind, device="cpu"):
    if mode == "fwd":
        args = make_inputs(op, n, d, dtype, kind, False, device)
        return lambda: fn(*args)
    args = make_inputs(op, n, d, dtype, kind, True, device)
    params = [args[i] for i in _USED[op] if args[i] is not None]
    # one upstream gradient per output
    ups = [torch.randn(o.shape).to(device=o.device, dtype=o.dtype) for o in fn(*args)]
    if mode == "bwd":
        outs = fn(*args)
        return lambda: torch.autograd.grad(outs, params, ups, retain_graph=True)
    return lambda: torch.autograd.grad(fn(*args), params, ups)


def run(ops, shapes, dtypes, kinds, modes, methods=("addnorm", "eager", "compile"), progress=None,
        journal: Path | None = None) -> list[OpRow]:
    from ..harness.store import read_journal

    done = {(r.op, r.kind, r.dtype, r.rows, r.hidden, r.mode, r.method): r
            for r in read_journal(journal, lambda rec: OpRow(**rec))}
    floor = copy_floor_gbps()
    floor_step = None
    rows = []
    total = sum(len(kinds) if op in NORM_OPS else 1 for op in ops) * len(shapes) * len(dtypes) * len(modes)
    task = progress.add_task("fused forms", total=total) if progress else None
    for op in ops:
        for n, d in shapes:
            for dt_name in dtypes:
                dtype = getattr(torch, dt_name)
                es = torch.tensor([], dtype=dtype).element_size()
                # DyT, Derf and the stream ops have no norm kind: one cell each, labelled "-"
                for kind in (kinds if op in NORM_OPS else ["-"]):
                    for mode in modes:
                        keys = {m: (op, kind, dt_name, n, d, mode, m) for m in methods}
                        if all(k in done for k in keys.values()):
                            rows += [done[k] for k in keys.values()]
                            if progress:
                                progress.advance(task)
                            continue
                        if progress:
                            progress.update(task, description=f"{op} {kind} {dt_name} {n}x{d} {mode}")
                        fns = {}
                        for m in methods:
                            if m == "addnorm":
                                fns[m] = fused(op, kind)
                            elif m == "eager":
                                fns[m] = eager(op, kind)
                            else:
                                torch._dynamo.reset()  # one compilation per cell: no silent eager fallback
                                fns[m] = torch.compile(eager(op, kind), dynamic=False)
                        mb = min_bytes(op, mode, n, d, es)
                        local = mb >= LOCAL_FLOOR_BYTES
                        if local and floor_step is None:
                            floor_step = copy_step()
                        with torch.set_grad_enabled(mode != "fwd"):
                            steps = {m: make_step(f, op, mode, n, d, dtype, kind) for m, f in fns.items()}
                            if local:
                                steps["floor"] = floor_step
                            t = measure_interleaved(steps)
                        cell_floor = 2 * FLOOR_BYTES / t["floor"].median_s / 1e9 if local else floor
                        for m in methods:
                            tm = t[m]
                            row = OpRow(op, kind, dt_name, n, d, mode, m, tm.median_s * 1e3, tm.p10_s * 1e3,
                                        tm.p90_s * 1e3, tm.runs, mb, mb / tm.median_s / 1e9, cell_floor,
                                        (mb / (cell_floor * 1e9)) / tm.median_s)
                            rows.append(row)
                            if journal is not None:
                                with journal.open("a") as f:
                                    f.write(json.dumps(asdict(row)) + "\n")
                        if progress:
                            progress.advance(task)
    return rows


def markdown(rows: list[OpRow]) -> str:
    """One line per cell: addnorm's time, its fraction of the floor, and eager's and compile's time over it."""
    by = {}
    for r in rows:
        by.setdefault((r.op, r.kind, r.dtype, r.rows, r.hidden, r.mode), {})[r.method] = r
    head = ["op", "norm", "dtype", "shape", "mode", "addnorm ms", "of floor", "vs eager", "vs compile"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (op, kind, dt, n, d, mode), m in by.items():
        a = m.get("addnorm")
        if a is None:
            continue
        ratio = lambda k: f"{m[k].median_ms / a.median_ms:.2f}×" if k in m else "-"  # noqa: E731
        out.append(f"| {op} | {kind} | {dt} | {n}×{d} | {mode} | {a.median_ms:.3f} | {a.frac_of_floor:.2f} | "
                   f"{ratio('eager')} | {ratio('compile')} |")
    return "\n".join(out)


def write(rows: list[OpRow], out_dir: Path, allocator: str) -> Path:
    from ..harness.store import atomic_write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"fused_forms_{allocator}.json"
    atomic_write_text(path, json.dumps({"conditions": conditions(allocator), "rows": [asdict(r) for r in rows]},
                                       indent=1))
    atomic_write_text(out_dir / f"fused_forms_{allocator}.md", markdown(rows) + "\n")
    return path
