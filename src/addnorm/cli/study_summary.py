"""`addnorm study`'s terminal output: the summary as a table that fits the terminal (summary.md keeps the full
Markdown tables: against pre-LN, learning-rate ranges), and one line per finished run for logs."""

from __future__ import annotations

from rich.table import Table

from ..report.study_tables import (BASE_AXES, EXTRA_AXES, axis, axis_text, budget_text, interval_text,
                                   too_short_note, too_short_text)


_UNSAID = {"n_streams": None, "value_residual": False, "dyt_alpha": "0.5", "embed_scale": None}  # the defaults, not said in the title


def summary_table(study: dict) -> Table:
    """One row per setting, seeds pooled: the axes that vary across the study as columns (the others in the
    title), failures, the final validation loss and the generalization gap with their intervals, tokens/parameter.
    Cells wrap rather than being cut: the table is as wide as the console."""
    gs = study["groups"]
    axes = [a for a in (*BASE_AXES, *EXTRA_AXES) if len({axis(g, a) for g in gs}) > 1] or ["placement"]
    fixed = [f"{a} {axis_text(a, axis(gs[0], a))}" for a in (*BASE_AXES, *EXTRA_AXES)
             if a not in axes and gs and axis(gs[0], a) != _UNSAID.get(a)]
    table = Table(title=f"{len(study['runs'])} runs" + (f" at {', '.join(fixed)}" if fixed else ""),
                  header_style="bold", show_lines=False)
    for a in axes:
        table.add_column(a.replace("_", " "), overflow="fold")
    for name in ("failed / seeds", "final val loss [95 %]", "val − train", "tokens / param"):
        table.add_column(name, justify="right", overflow="fold")
    for g in gs:
        failed = f"{g['failures']} / {g['seeds']}" + (f" ({', '.join(g['failure_kinds'])})" if g["failure_kinds"]
                                                      else "")
        if g.get("too_short"):
            failed += f"; {too_short_text(g)}"
        table.add_row(*(axis_text(a, axis(g, a)) for a in axes), failed,
                      interval_text(g["val_loss_mean"], g["val_loss_low"], g["val_loss_high"]),
                      interval_text(g["gap_mean"], g["gap_low"], g["gap_high"], "{:+.3f}"), budget_text(g)[1])
    return table


def print_summary(console, study: dict, out: str) -> None:
    console.print(summary_table(study))
    console.print(f"unigram plateau {study['unigram_nats']:.3f} nats; data: {study['corpus']}", markup=False)
    if any(g.get("too_short") for g in study["groups"]):
        console.print(too_short_note(study), markup=False, style="yellow")
    if study["missing"]:
        console.print(f"not finished yet (another shard, or interrupted): {len(study['missing'])} runs", markup=False)


def run_line(i: int, n: int, row: dict) -> str:
    """One finished run, for a log: 'run 3/8 pre-layer-L6-lr0.003-w0-s0: val loss 2.345 (400 steps)'."""
    head = f"run {i}/{n} {row['name']}: "
    if row.get("too_short"):
        text = f"too short to judge (on the unigram plateau, val loss {row['final_val_loss']:.3f}, after a budget " \
               f"of {row['steps']} steps)"
    elif row["failed"]:
        text = f"failed ({row['failure']}) after {row['steps_done']} of {row['steps']} steps"
    else:
        text = f"val loss {row['final_val_loss']:.3f} ({row['steps_done']} steps)"
    return head + text + (" (reused: finished before)" if row.get("reused") else "")
