"""index.html for a study, generated from its summary (``experiments.study.grid``); every number shown is
registered, and written beside the page in report.json, as the tour's report does."""

from __future__ import annotations

import html
import json
from pathlib import Path

from ..store import atomic_write_text
from ..experiments.study.grid import cell_text, lr_range
from .html import Page


def build(study: dict, figures: list[str]) -> Page:
    p = Page()
    p.add("<h1>addnorm study: training runs, measured</h1>")
    p.add(f"<p class='lead'>Every run below was trained by <code>addnorm study</code> on this machine: "
          f"{html.escape(study['grid'])}. Data: {html.escape(study['corpus'])} (split by file); the unigram "
          f"plateau is {p.num('unigram_nats', study['unigram_nats'], '{:.3f}')} nats/byte — a run that ends at or "
          "above it learned nothing beyond byte frequencies and counts as failed.</p>")
    rows = []
    for i, g in enumerate(study["groups"]):
        val = "—" if g["val_loss_mean"] is None else (
            f"{p.num(f'g{i}.val_mean', g['val_loss_mean'], '{:.3f}')} "
            f"({p.num(f'g{i}.val_min', g['val_loss_min'], '{:.3f}')}–{p.num(f'g{i}.val_max', g['val_loss_max'], '{:.3f}')})")
        fails = p.num(f"g{i}.failures", g["failures"], "{}")
        kinds = f" <span class='bad'>{html.escape(', '.join(g['failure_kinds']))}</span>" if g["failure_kinds"] else ""
        gap = "—" if g.get("gap_mean") is None else p.num(f"g{i}.gap", g["gap_mean"], "{:+.3f}")
        rows.append([html.escape(str(g["placement"])), g["norm"], str(g["depth"]), f"{g['lr']:g}", str(g["warmup"]),
                     f"{g['clip']:g}", g["init"], f"{fails} / {g['seeds']}{kinds}", val, gap])
    p.add("<h2>Outcomes</h2><p>Seeds pooled. Failures: <code>nan</code> (a non-finite loss), <code>spike</code> (a "
          "loss above 1.5× the mean of the previous 20 steps: the run is stopped), <code>plateau</code> (final "
          "validation loss at or above the unigram plateau). <em>val − train</em>: the final validation loss minus the "
          "training split's, both in evaluation mode on fixed batches — the generalization gap.</p>")
    p.table(["placement", "norm", "depth", "lr", "warmup", "clip", "init", "failed / seeds",
             "final validation loss, mean (min–max) of runs that trained", "val − train"], rows)
    table = lr_range(study["runs"])
    if table is not None:
        p.add("<h2>Learning rates at which each setting trains</h2><p>Seeds pooled: the mean final validation loss "
              "of the runs that trained at each learning rate, and how many failed.</p>")
        body = []
        for i, st in enumerate(table["settings"]):
            cells = [cell_text(c, p.num(f"lr.{i}.{j}", c["mean"], "{:.3f}") if c["mean"] is not None else None)
                     for j, c in enumerate(st["cells"])]
            every = ", ".join(f"{lr:g}" for lr in st["trained_every_seed"]) or "none"
            body.append([html.escape(st["setting"]), *cells, every])
        p.table(["setting", *(f"lr {lr:g}" for lr in table["lrs"]), "trained in every seed at"], body)
    if study["missing"]:
        p.add(f"<p class='note'>{p.num('missing', len(study['missing']), '{}')} runs of the grid are not finished "
              "(another shard, or interrupted): re-run the same command to finish them.</p>")
    for name, alt in (("val_loss_curves.png", "validation loss curves per placement"),
                      ("val_loss_vs_lr.png", "final validation loss against learning rate, failures marked"),
                      ("warmup_lr_failures.png", "share of runs failed, warmup x learning rate, post vs pre"),
                      ("depth_placement_max_lr.png", "largest learning rate that trained, depth x placement"),
                      ("grad_norm_vs_depth.png", "per-block gradient norm against depth at chosen steps")):
        if name in figures:
            p.img(name, alt)
    return p


def write(study: dict, figures: list[str], out_dir: Path) -> Path:
    page = build(study, figures)
    path = Path(out_dir) / "index.html"
    atomic_write_text(path, page.render("addnorm study"))  # shards that share a directory may both write it
    atomic_write_text(Path(out_dir) / "report.json", json.dumps(page.shown, indent=1))
    return path
