"""Tables from benchmark results: a rich table for the terminal and Markdown for the README and the docs."""

from __future__ import annotations

from collections import defaultdict

from rich import box
from rich.table import Table

from .peers import LABELS, PEERS

NORM = {"layer": "LayerNorm", "rms": "RMSNorm"}
DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _index(rows):
    idx = defaultdict(dict)
    for r in rows:
        r = r if isinstance(r, dict) else r.__dict__
        idx[(r["kind"], r["dtype"], r["rows"], r["hidden"], r["mode"])][r["method"]] = r
    return idx


def _engines(rows) -> list[str]:
    """The CPU engines (bench.peers) measured in ``rows``, in their registry's order."""
    seen = {(r if isinstance(r, dict) else r.__dict__)["method"] for r in rows}
    return [p for p in PEERS if p in seen]


def _line(key, by, engines=()):
    kind, dtype, n, d, mode = key
    a = by.get("addnorm")
    others = ["eager", "compile", *engines]
    cells = [NORM[kind], DTYPE.get(dtype, dtype), f"{n}×{d}", mode]
    if a is None:
        return cells + ["-"] * (4 + len(others))
    cells += [f"{a['median_ms']:.3f} ±{(a['p90_ms'] - a['p10_ms']) / 2:.3f}", f"{a['gbps']:.1f}",
              f"{a['floor_gbps']:.1f}", f"{a['frac_of_floor']:.2f}"]
    for peer in others:
        p = by.get(peer)
        cells.append(f"{p['median_ms'] / a['median_ms']:.2f}×" if p else "-")
    return cells


HEADER = ["norm", "dtype", "shape", "mode", "addnorm ms", "GB/s", "floor GB/s", "of floor", "vs eager", "vs compile"]


TERMINAL = ["norm", "dtype", "shape", "mode", "ms", "of floor", "vs eager", "vs compile"]
# with the engines' columns besides, the headers are shorter, so that the table keeps to 80 columns
TERMINAL_WITH_ENGINES = ["norm", "dtype", "shape", "mode", "ms", "floor", "eager", "compile"]


def summary_table(rows, cond, csv_path=None) -> Table:
    """The terminal's table: the columns that fit 80 characters (median ms, fraction of the copy floor, the
    ratios); the spread, GB/s and the per-cell floor are in the CSV and the README's Markdown table. An engine
    measured (bench.peers) adds its "vs" column, "-" where it does not run (backward, a dtype it lacks)."""
    engines = _engines(rows)
    short = [LABELS[e][1] for e in engines]
    head = TERMINAL_WITH_ENGINES + short if engines else TERMINAL
    ratios = " / ".join(head[6:])
    versions = cond.get("peers", {})
    t = Table(title=f"Add & Norm: {cond['torch_threads']} threads, allocator {cond['allocator']}, "
                    f"copy floor {cond.get('floor_gbps', 0):.1f} GB/s at start",
              caption=f"ms: median; {head[5]}: the copy bandwidth's time ÷ addnorm's; {ratios}: their time ÷ "
                      "addnorm's (>1: addnorm is faster; - where one does not run)"
                      + "".join(f"; {s}: {LABELS[e][0]} {versions.get(e, '')}".rstrip() for e, s in zip(engines, short))
                      + "".join(f"; skipped {why}" for why in cond.get("peers_skipped", {}).values())
                      + (f"; every column: {csv_path}" if csv_path else ""),
              box=box.SIMPLE_HEAD, pad_edge=False,
              # the engines' columns besides: one space of padding between columns, not two, and no edges
              collapse_padding=bool(engines), show_edge=not engines)
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i < 4 else "right", no_wrap=True)
    for key, by in sorted(_index(rows).items()):
        full = _line(key, by, engines)
        ms = full[4].split(" ±")[0]
        t.add_row(key[0], full[1], full[2], full[3], ms, *full[7:])
    return t


def markdown_table(rows) -> str:
    engines = _engines(rows)
    head = HEADER + [f"vs {LABELS[e][0]}" for e in engines]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, by in sorted(_index(rows).items()):
        lines.append("| " + " | ".join(_line(key, by, engines)) + " |")
    return "\n".join(lines)


def bandwidth_table(rows) -> str:
    """Every method side by side, forward cells: GB/s on the minimum bytes and, in brackets, the fraction of the
    copy floor measured beside the cell; then the fastest other method's time ÷ addnorm's (above 1: addnorm is
    ahead of every one)."""
    methods = [m for m in ("addnorm", "eager", "compile", *PEERS)
               if any((r if isinstance(r, dict) else r.__dict__)["method"] == m for r in rows)]
    names = {"addnorm": "addnorm", "eager": "eager", "compile": "compile", **{e: LABELS[e][0] for e in PEERS}}
    head = ["norm", "dtype", "shape", "floor GB/s", *(names[m] for m in methods), "addnorm vs the fastest other"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (kind, dtype, n, d, mode), by in sorted(_index(rows).items()):
        if mode != "fwd" or "addnorm" not in by:
            continue
        a = by["addnorm"]
        cells = [NORM[kind], DTYPE.get(dtype, dtype), f"{n}×{d}", f"{a['floor_gbps']:.1f}"]
        cells += [f"{by[m]['gbps']:.1f} ({by[m]['frac_of_floor']:.2f})" if m in by else "-" for m in methods]
        rivals = [m for m in methods if m != "addnorm" and m in by]
        if rivals:
            best = min(rivals, key=lambda m: by[m]["median_ms"])
            cells.append(f"{by[best]['median_ms'] / a['median_ms']:.2f}× ({names[best]})")
        else:
            cells.append("-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
