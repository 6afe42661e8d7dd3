"""index.html for a study, generated from its summary (the dict ``experiments.study.grid`` writes as
summary.json); every number shown is registered, and written beside the page in report.json, as the tour's
report does. Tables come from study_tables, figures from study_figures: this module only lays them out."""

from __future__ import annotations

import html
import json
from pathlib import Path

from ..harness.store import atomic_write_text
from .html import Page
from .study_figures import CAPTIONS, FIGURES
from .study_tables import (INTERVAL_NOTE, axis_text, budget_text, cell_text, group_columns, lr_range, p_text,
                           too_short_note, too_short_text)


def _interval(p: Page, key: str, mean, low, high, fmt: str = "{:.3f}") -> str:
    """The mean and its interval, each registered: '2.540 [2.494, 2.575]'."""
    if mean is None:
        return "—"
    text = p.num(f"{key}.mean", mean, fmt)
    if low is None:
        return text
    return f"{text} [{p.num(f'{key}.low', low, fmt)}, {p.num(f'{key}.high', high, fmt)}]"


def _outcomes(p: Page, study: dict) -> None:
    cols = group_columns(study["groups"])
    rows = []
    for i, g in enumerate(study["groups"]):
        fails = p.num(f"g{i}.failures", g["failures"], "{}")
        kinds = f" <span class='bad'>{html.escape(', '.join(g['failure_kinds']))}</span>" if g["failure_kinds"] else ""
        kinds += f"; {html.escape(too_short_text(g))}" if g.get("too_short") else ""
        tokens, per_param = budget_text(g)
        rows.append([html.escape(axis_text(c, g[c])) for c in cols] + [
            f"{fails} / {g['seeds']}{kinds}",
            _interval(p, f"g{i}.val", g["val_loss_mean"], g["val_loss_low"], g["val_loss_high"]),
            _interval(p, f"g{i}.gap", g["gap_mean"], g["gap_low"], g["gap_high"], "{:+.3f}"),
            p.num(f"g{i}.tokens", tokens), p.num(f"g{i}.tokens_per_param", per_param)])
    p.add("<h2>Outcomes</h2><p>Seeds pooled. Failures: <code>nan</code> (a non-finite loss), <code>spike</code> (a "
          "loss above 1.5× the mean of the previous 20 steps: the run is stopped), <code>plateau</code> (final "
          "validation loss at or above the unigram plateau). <em>val − train</em>: the final validation loss minus the "
          "training split's, both in evaluation mode on fixed batches — the generalization gap. Tokens seen: steps "
          "done × batch × sequence length; tokens / parameter: that over the model's parameter count.</p>"
          f"<p class='note'>{html.escape(INTERVAL_NOTE)}</p>"
          + (f"<p class='note'>{html.escape(too_short_note(study))}</p>"
             if any(g.get("too_short") for g in study["groups"]) else ""))
    p.table([*cols, "failed / seeds", "final validation loss, mean [95 % interval] of runs that trained",
             "val − train", "tokens seen", "tokens / parameter"], rows)


def _pairwise(p: Page, study: dict) -> None:
    pairs = study.get("pairwise") or []
    if not pairs:
        return
    shown = [c for c in group_columns(study["groups"]) if c != "placement"]
    body = []
    for i, d in enumerate(pairs):
        verdict = d["call"]
        cls = {"better": "ok", "worse": "bad"}.get(verdict, "note")
        fcls = {"fails less": "ok", "fails more": "bad"}.get(d["fail_call"], "note")
        body.append([html.escape(d["placement"]), *(html.escape(axis_text(c, d[c])) for c in shown),
                     f"{d['failures']}/{d['seeds']} vs {d['pre_failures']}/{d['pre_seeds']}",
                     f"{p.num(f'pair{i}.fail', d['fail_diff_mean'], '{:+.2f}')} "
                     f"({p.num(f'pair{i}.fail_p', p_text(d['fail_p']))})",
                     f"<span class='{fcls}'>{p.num(f'pair{i}.fail_call', d['fail_call'])}</span>",
                     _interval(p, f"pair{i}.diff", d["diff_mean"], d["diff_low"], d["diff_high"], "{:+.3f}"),
                     "—" if d["paired"] is None else ("paired" if d["paired"] else "unpaired"),
                     f"<span class='{cls}'>{p.num(f'pair{i}.call', verdict)}</span>",
                     _interval(p, f"pair{i}.gap", d.get("gap_diff_mean"), d.get("gap_diff_low"),
                               d.get("gap_diff_high"), "{:+.3f}"),
                     html.escape(d.get("gap_call", "—"))])
    p.add("<h2>Against pre-LN at the same setting</h2><p>The final validation loss of each setting minus that of "
          "pre-norm with LayerNorm at the same depth, width, learning rate, warmup and step budget, over the runs "
          "that trained — paired by seed where both sides trained on the same seeds (a seed fixes the initial "
          "weights' stream and the batch order), else unpaired. A difference is called <em>better</em> or "
          "<em>worse</em> only where its bootstrap interval (nominal 95 %; with 3 seeds the min–max range, so every "
          "seed agreeing in sign) excludes 0. The failure counts are compared by "
          "Fisher's exact test (two-sided) and called <em>fails more</em> or <em>fails less</em> only at p &lt; "
          "0.05: a bootstrap of 0/1 outcomes gives 3 of 3 failed against 0 of 3 a zero-width interval, while "
          "Fisher's p is 0.1.</p>")
    p.table(["placement", *shown, "failed (setting vs pre)", "share failed, difference (Fisher p)", "failures",
             "loss difference [95 % interval]", "seeds", "loss", "gap (val − train) difference [95 %]", "gap"], body)


def _lr_table(p: Page, study: dict) -> None:
    table = lr_range(study["runs"])
    if table is None:
        return
    p.add("<h2>Learning rates at which each setting trains</h2><p>Seeds pooled: the mean final validation loss "
          "of the runs that trained at each learning rate with its 95 % interval, and how many failed.</p>")
    body = []
    for i, st in enumerate(table["settings"]):
        cells = [cell_text(c, _interval(p, f"lr.{i}.{j}", c["mean"], c["low"], c["high"]))
                 if c["mean"] is not None else cell_text(c) for j, c in enumerate(st["cells"])]
        every = ", ".join(f"{lr:g}" for lr in st["trained_every_seed"]) or "none"
        body.append([html.escape(st["setting"]), *cells, every])
    p.table(["setting", *(f"lr {lr:g}" for lr in table["lrs"]), "trained in every seed at"], body)


def build(study: dict, figures: list[str]) -> Page:
    p = Page()
    p.add("<h1>addnorm study: training runs, measured</h1>")
    p.add(f"<p class='lead'>Every run below was trained by <code>addnorm study</code>: "
          f"{html.escape(study['grid'])}. Data: {html.escape(study['corpus'])} (split by file); the unigram "
          f"plateau is {p.num('unigram_nats', study['unigram_nats'], '{:.3f}')} nats/byte — a run that ends at or "
          "above it learned nothing beyond byte frequencies and counts as failed.</p>")
    _outcomes(p, study)
    _pairwise(p, study)
    _lr_table(p, study)
    if study["missing"]:
        p.add(f"<p class='note'>{p.num('missing', len(study['missing']), '{}')} runs of the grid are not finished "
              "(another shard, or interrupted): re-run the same command to finish them.</p>")
    p.add("<h2>Figures</h2>")
    for name, alt in FIGURES:
        if name in figures:
            p.img(name, alt)
            if name in CAPTIONS:
                p.add(f"<p class='note'>{html.escape(CAPTIONS[name])}</p>")
    if study["runs"] and not study.get("curves"):
        p.add("<p class='note'>This directory keeps no validation curves or gradient profiles (it was written before "
              "summary.json kept them, and a committed results directory holds no run directories): the curves and "
              "the gradient figure are drawn when the runs are, by the same command without "
              "<code>--report-only</code>.</p>")
    return p


def write(study: dict, figures: list[str], out_dir: Path) -> Path:
    page = build(study, figures)
    path = Path(out_dir) / "index.html"
    atomic_write_text(path, page.render("addnorm study"))  # shards that share a directory may both write it
    atomic_write_text(Path(out_dir) / "report.json", json.dumps(page.shown, indent=1))
    return path
