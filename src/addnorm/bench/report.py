"""Tables from benchmark results: a rich table for the terminal and Markdown for the README."""

from __future__ import annotations

from collections import defaultdict

from rich import box
from rich.table import Table


def _index(rows):
    idx = defaultdict(dict)
    for r in rows:
        r = r if isinstance(r, dict) else r.__dict__
        idx[(r["kind"], r["dtype"], r["rows"], r["hidden"], r["mode"])][r["method"]] = r
    return idx


def _line(key, by):
    kind, dtype, n, d, mode = key
    a = by.get("addnorm")
    cells = [("LayerNorm" if kind == "layer" else "RMSNorm"), {"float32": "fp32", "bfloat16": "bf16"}.get(dtype, dtype),
             f"{n}×{d}", mode]
    if a is None:
        return cells + ["-"] * 7
    cells += [f"{a['median_ms']:.3f} ±{(a['p90_ms'] - a['p10_ms']) / 2:.3f}", f"{a['gbps']:.1f}",
              f"{a['floor_gbps']:.1f}", f"{a['frac_of_floor']:.2f}"]
    for peer in ("eager", "compile"):
        p = by.get(peer)
        cells.append(f"{p['median_ms'] / a['median_ms']:.2f}×" if p else "-")
    return cells


HEADER = ["norm", "dtype", "shape", "mode", "addnorm ms", "GB/s", "floor GB/s", "of floor", "vs eager", "vs compile"]


TERMINAL = ["norm", "dtype", "shape", "mode", "ms", "of floor", "vs eager", "vs compile"]


def summary_table(rows, cond, csv_path=None) -> Table:
    """The terminal's table: the columns that fit 80 characters (median ms, fraction of the copy floor, the
    two ratios); the spread, GB/s and the per-cell floor are in the CSV and the README's Markdown table."""
    t = Table(title=f"Add & Norm: {cond['torch_threads']} threads, allocator {cond['allocator']}, "
                    f"copy floor {cond.get('floor_gbps', 0):.1f} GB/s at start",
              caption="ms: median; of floor: the copy bandwidth's time ÷ addnorm's; vs eager / vs compile: their "
                      "time ÷ addnorm's (>1: addnorm is faster)"
                      + (f"; every column: {csv_path}" if csv_path else ""),
              box=box.SIMPLE_HEAD, pad_edge=False)
    for i, h in enumerate(TERMINAL):
        t.add_column(h, justify="left" if i < 4 else "right", no_wrap=True)
    for key, by in sorted(_index(rows).items()):
        full = _line(key, by)
        norm = "layer" if full[0] == "LayerNorm" else "rms"
        ms = full[4].split(" ±")[0]
        t.add_row(norm, full[1], full[2], full[3], ms, full[7], full[8], full[9])
    return t


def markdown_table(rows) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for key, by in sorted(_index(rows).items()):
        lines.append("| " + " | ".join(_line(key, by)) + " |")
    return "\n".join(lines)
