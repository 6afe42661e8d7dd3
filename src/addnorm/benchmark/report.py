"""Tables from benchmark results: a rich table for the terminal and Markdown for the README."""

from __future__ import annotations

from collections import defaultdict

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


def summary_table(rows, cond) -> Table:
    t = Table(title=f"Add & Norm, {cond['processor']}, {cond['torch_threads']} threads, torch {cond['torch']}, "
                    f"allocator: {cond['allocator']}, floor at start {cond.get('floor_gbps', 0):.1f} GB/s",
              caption="ms: median ± half the p10–p90 spread; GB/s on the minimum bytes; floor: the copy "
                      "bandwidth (cells of >= 32 MiB time it beside their methods); "
                      "vs eager / vs compile: their time ÷ addnorm's (>1 means addnorm is faster)")
    for h in HEADER:
        t.add_column(h, justify="right")
    for key, by in sorted(_index(rows).items()):
        t.add_row(*_line(key, by))
    return t


def markdown_table(rows) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for key, by in sorted(_index(rows).items()):
        lines.append("| " + " | ".join(_line(key, by)) + " |")
    return "\n".join(lines)
