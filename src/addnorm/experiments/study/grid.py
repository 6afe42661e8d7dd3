"""Every run of a study grid -- reused when finished, resumed when interrupted, skipped when another shard
owns it -- then the study's tables and figures, made from every finished run in the results directory (so
shards that share one directory merge)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from rich.markup import escape

from ...store import atomic_write, atomic_write_text, read_json
from .config import RunConfig, Study, StudyGrid
from .data import SplitCorpus
from .runner import _world, train_run

COLUMNS = ["name", "placement", "norm", "depth", "lr", "warmup", "seed", "clip", "init", "steps_done",
           "final_train_loss", "final_val_loss", "final_train_split_loss", "generalization_gap", "failed", "failure"]


def run_dir(out_dir: Path, cfg: RunConfig, data: SplitCorpus) -> Path:
    return Path(out_dir) / "runs" / f"{cfg.name()}-{cfg.key(data.digest)}"


def run_study(grid: StudyGrid | Study, data: SplitCorpus, out_dir: Path, progress=None, shard: tuple[int, int] = (0, 1),
              on_step=None, tensorboard: Path | None = None) -> dict:
    out_dir = Path(out_dir)
    runs = grid.runs()
    mine = [r for i, r in enumerate(runs) if i % shard[1] == shard[0]]
    total = sum(r.steps for r in mine)
    overall = progress.add_task("study", total=total, loss="") if progress else None
    for i, cfg in enumerate(mine):
        task = None
        if progress is not None:
            task = progress.add_task(f"run {i + 1} of {len(mine)}: {cfg.name()}", total=cfg.steps, loss="")
        summary = train_run(cfg, data, run_dir(out_dir, cfg, data), progress, task, on_step, tensorboard)
        for note in summary.get("notes", []):
            if progress is not None:
                progress.console.print(f"[yellow]{escape(note)}[/yellow]")
        if progress is not None:
            progress.update(task, completed=cfg.steps, visible=False)
            progress.update(overall, advance=cfg.steps)
    if _world()[0] != 0:  # under torchrun: rank 0 writes the study's outputs
        return {}
    return write_outputs(grid, data, out_dir)


def collect(grid: StudyGrid | Study, data: SplitCorpus, out_dir: Path) -> tuple[list[dict], list[str]]:
    """The summaries of the grid's finished runs (from any shard), and the names of those not finished."""
    done, missing = [], []
    for cfg in grid.runs():
        d = run_dir(out_dir, cfg, data)
        s, _ = read_json(d / "summary.json")
        if s is not None and s.get("key") == cfg.key(data.digest):
            s["run_dir"] = str(d)  # where it is now (the directory may have moved)
            done.append(s)
        else:
            missing.append(cfg.name())
    return done, missing


def _row(s: dict) -> dict:
    c = s["config"]
    p = c["placement"]
    return {"name": s["name"], "placement": p if isinstance(p, str) else "+".join(p), "norm": c["norm"],
            "depth": c["depth"], "lr": c["lr"], "warmup": c["warmup"], "seed": c["seed"], "clip": c["clip"],
            "init": c["init"], "steps_done": s["steps_done"], "final_train_loss": s["final_train_loss"],
            "final_val_loss": s["final_val_loss"], "final_train_split_loss": s.get("final_train_split_loss", math.nan),
            "generalization_gap": s.get("generalization_gap", math.nan), "failed": s["failed"],
            "failure": s["failure"] or ""}


def write_outputs(grid: StudyGrid | Study, data: SplitCorpus, out_dir: Path) -> dict:
    summaries, missing = collect(grid, data, out_dir)
    rows = [_row(s) for s in summaries]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(out_dir / "summary.csv", buf.getvalue())
    study = {"grid": grid.describe(), "corpus": data.source, "data_digest": data.digest,
             "unigram_nats": data.unigram_nats, "runs": rows, "missing": missing,
             "groups": groups(rows)}
    atomic_write_text(out_dir / "summary.json", json.dumps(study, indent=1))
    atomic_write_text(out_dir / "summary.md", markdown(study))
    study["figures"] = [f.name for f in figures(summaries, rows, out_dir / "figures")]
    from ...report import study_html

    study["report"] = str(study_html.write(study, study["figures"], out_dir))
    return study


def groups(rows: list[dict]) -> list[dict]:
    """Seeds pooled: per (placement, norm, depth, lr, warmup, clip, init), failures and final validation losses."""
    out: dict = {}
    for r in rows:
        k = tuple(r[c] for c in ("placement", "norm", "depth", "lr", "warmup", "clip", "init"))
        out.setdefault(k, []).append(r)
    res = []
    for k, rs in out.items():
        ok = [r["final_val_loss"] for r in rs if not r["failed"] and math.isfinite(r["final_val_loss"])]
        gaps = [r["generalization_gap"] for r in rs if not r["failed"] and math.isfinite(r["generalization_gap"])]
        res.append({**dict(zip(("placement", "norm", "depth", "lr", "warmup", "clip", "init"), k)),
                    "seeds": len(rs), "failures": sum(r["failed"] for r in rs),
                    "failure_kinds": sorted({r["failure"] for r in rs if r["failed"]}),
                    "val_loss_min": min(ok) if ok else None, "val_loss_max": max(ok) if ok else None,
                    "val_loss_mean": sum(ok) / len(ok) if ok else None,
                    "gap_mean": sum(gaps) / len(gaps) if gaps else None})
    return res


def markdown(study: dict) -> str:
    lines = [f"# Study: {study['grid']}", "", f"Data: {study['corpus']}; unigram plateau "
             f"{study['unigram_nats']:.3f} nats (validation bytes under the training bytes' frequencies).", "",
             "| placement | norm | depth | lr | warmup | clip | init | failed / seeds | final val loss (ok runs) "
             "| val − train |", "|---|---|---|---|---|---|---|---|---|---|"]
    for g in study["groups"]:
        v = ("—" if g["val_loss_mean"] is None else
             f"{g['val_loss_mean']:.3f} ({g['val_loss_min']:.3f}–{g['val_loss_max']:.3f})")
        kinds = f" ({', '.join(g['failure_kinds'])})" if g["failure_kinds"] else ""
        gap = "—" if g.get("gap_mean") is None else f"{g['gap_mean']:+.3f}"
        lines.append(f"| {g['placement']} | {g['norm']} | {g['depth']} | {g['lr']:g} | {g['warmup']} | {g['clip']:g} "
                     f"| {g['init']} | {g['failures']} / {g['seeds']}{kinds} | {v} | {gap} |")
    lines += ["", "val − train: the final validation loss minus the training split's, both in evaluation mode on "
              "fixed batches (the generalization gap; mean of the runs that trained)."]
    lines += lr_range_table(study["runs"])
    if study["missing"]:
        lines += ["", f"Not finished yet (another shard, or interrupted): {len(study['missing'])} runs."]
    return "\n".join(lines) + "\n"


def lr_range(rows: list[dict]) -> dict | None:
    """Seeds pooled, per placement (and every other axis that varies) and learning rate: the mean final
    validation loss of the runs that trained, how many failed, and the learning rates at which every seed
    trained. None when the grid has one learning rate."""
    lrs = sorted({r["lr"] for r in rows})
    if len(lrs) < 2:
        return None
    line_of = variants(rows)
    order = list(dict.fromkeys(line_of[id(r)] for r in rows))  # the grid's own order
    settings = []
    for v in order:
        cells, every = [], []
        for lr in lrs:
            rs = [r for r in rows if line_of[id(r)] == v and r["lr"] == lr]
            ok = [r["final_val_loss"] for r in rs if not r["failed"]]
            cells.append({"lr": lr, "runs": len(rs), "failed": len(rs) - len(ok),
                          "mean": sum(ok) / len(ok) if ok else None})
            if rs and len(ok) == len(rs):
                every.append(lr)
        settings.append({"setting": v, "cells": cells, "trained_every_seed": every})
    return {"lrs": lrs, "settings": settings}


def cell_text(c: dict, mean: str | None = None) -> str:
    """``mean`` (the formatted mean, or markup around it) with the failures: '2.600', '3.000 (1 of 2 failed)',
    'failed (2 of 2)', or '' where the grid has no run."""
    if not c["runs"]:
        return ""
    if c["mean"] is None:
        return f"failed ({c['failed']} of {c['runs']})"
    text = mean if mean is not None else f"{c['mean']:.3f}"
    return text + (f" ({c['failed']} of {c['runs']} failed)" if c["failed"] else "")


def lr_range_table(rows: list[dict]) -> list[str]:
    t = lr_range(rows)
    if t is None:
        return []
    lines = ["", "## Learning rates at which each setting trains", "",
             "| setting | " + " | ".join(f"lr {lr:g}" for lr in t["lrs"]) + " | trained in every seed at |",
             "|---|" + "---|" * len(t["lrs"]) + "---|"]
    for s in t["settings"]:
        every = ", ".join(f"{lr:g}" for lr in s["trained_every_seed"]) or "none"
        lines.append(f"| {s['setting']} | " + " | ".join(cell_text(c) for c in s["cells"]) + f" | {every} |")
    return lines


_VARIANT_AXES = (("norm", "{}"), ("depth", "L{}"), ("warmup", "warmup {}"), ("init", "{} init"), ("clip", "clip {:g}"))


def variants(rows: list[dict], without: tuple[str, ...] = ()) -> dict[int, str]:
    """{id(row): label}: the row's placement, plus every other axis that varies across ``rows`` (except
    ``without``) -- a figure's line or panel, so that runs that differ in norm, depth, warmup, init or clipping
    are never drawn as one. Which axes vary is found once for all the rows."""
    varying = [(axis, fmt) for axis, fmt in _VARIANT_AXES
               if axis not in without and len({r[axis] for r in rows}) > 1]
    return {id(r): " ".join([r["placement"], *(fmt.format(r[axis]) for axis, fmt in varying)]) for r in rows}


def figures(summaries: list[dict], rows: list[dict], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    if not rows:
        return paths
    out_dir.mkdir(parents=True, exist_ok=True)
    # 1. validation loss curves, one panel per placement (and norm, depth, init, clipping where they vary)
    panel = variants(rows, without=("warmup",))
    placements = sorted(set(panel.values()))
    fig, axes = plt.subplots(1, len(placements), figsize=(4.5 * len(placements), 3.4), squeeze=False, sharey=True)
    for ax, p in zip(axes[0], placements):
        for s, r in zip(summaries, rows):
            if panel[id(r)] != p or not s["val_curve"]:
                continue
            steps, vals = zip(*s["val_curve"])
            ax.plot(steps, vals, ls="--" if r["failed"] else "-",
                    label=f"lr {r['lr']:g} w{r['warmup']} s{r['seed']}" + (f" ({r['failure']})" if r["failed"] else ""))
        ax.set_title(p)
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    axes[0][0].set_ylabel("validation loss (nats/byte)")
    fig.tight_layout()
    paths.append(out_dir / "val_loss_curves.png")
    _save(fig, paths[-1])
    plt.close(fig)
    # 2. final validation loss against learning rate per placement, failures marked (Wortsman et al. 2023's view)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    line_of = variants(rows)
    for p in sorted(set(line_of.values())):
        ok = [(r["lr"], r["final_val_loss"]) for r in rows if line_of[id(r)] == p and not r["failed"]]
        bad = [(r["lr"], r["final_val_loss"] if math.isfinite(r["final_val_loss"]) else None) for r in rows
               if line_of[id(r)] == p and r["failed"]]
        color = None
        if ok:  # every run that trained, and a line through the mean at each learning rate
            by_lr = {}
            for lr, v in ok:
                by_lr.setdefault(lr, []).append(v)
            xs = sorted(by_lr)
            line = ax.plot(xs, [sum(by_lr[x]) / len(by_lr[x]) for x in xs], "-", label=p)[0]
            color = line.get_color()
            ax.plot(*zip(*ok), "o", color=color, ms=4)
        else:  # every run failed: still a colour and a legend entry
            color = ax.plot([], [], "x", label=f"{p} (every run failed)")[0].get_color()
        for lr, v in bad:
            ax.plot(lr, v if v is not None else ax.get_ylim()[1], "x", color=color, ms=9)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("final validation loss (x: failed)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "val_loss_vs_lr.png")
    _save(fig, paths[-1])
    plt.close(fig)
    paths += _maps(rows, out_dir, plt)
    paths += _grad_vs_depth(summaries, rows, out_dir, plt)
    return paths


def _save(fig, path: Path) -> None:
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format=path.suffix[1:]))


def _heatmap(ax, plt, values, xs, ys, fmt, title, xlabel, ylabel, vmin=None, vmax=None):
    im = ax.imshow(values, cmap="YlOrRd", aspect="auto", vmin=vmin, vmax=vmax)
    ax.set_xticks(range(len(xs)), [f"{x:g}" if isinstance(x, float) else str(x) for x in xs])
    ax.set_yticks(range(len(ys)), [str(y) for y in ys])
    for i in range(len(ys)):
        for j in range(len(xs)):
            ax.text(j, i, fmt(values[i][j]), ha="center", va="center", fontsize=8, color="k")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    plt.colorbar(im, ax=ax, fraction=0.046)


def _maps(rows, out_dir, plt) -> list[Path]:
    """warmup x lr (failures over seeds) for post and pre; depth x placement (the largest lr that trained)."""
    out = []
    lrs = sorted({r["lr"] for r in rows})
    warmups = sorted({r["warmup"] for r in rows})
    panel = variants(rows, without=("warmup",))
    panels = sorted({panel[id(r)] for r in rows if r["placement"] in ("post", "pre")})
    if panels and len(lrs) * len(warmups) > 1:
        fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.2), squeeze=False)
        for ax, p in zip(axes[0], panels):
            cell = {(w, lr): [r["failed"] for r in rows if panel[id(r)] == p and r["warmup"] == w and r["lr"] == lr]
                    for w in warmups for lr in lrs}
            vals = [[sum(cell[w, lr]) / len(cell[w, lr]) if cell[w, lr] else float("nan") for lr in lrs]
                    for w in warmups]
            _heatmap(ax, plt, vals, lrs, warmups, lambda v: "—" if v != v else f"{v:.0%}",
                     f"{p}: share of runs failed", "learning rate", "warmup steps", vmin=0.0, vmax=1.0)
        fig.tight_layout()
        out.append(out_dir / "warmup_lr_failures.png")
        _save(fig, out[-1])
        plt.close(fig)
    depths = sorted({r["depth"] for r in rows})
    column = variants(rows, without=("depth",))
    placements = sorted(set(column.values()))
    if len(lrs) > 1:
        vals = []
        for d in depths:
            row = []
            for p in placements:
                ok = [r["lr"] for r in rows if r["depth"] == d and column[id(r)] == p and not r["failed"]]
                row.append(max(ok) if ok else float("nan"))
            vals.append(row)
        fig, ax = plt.subplots(figsize=(1.2 * len(placements) + 2.5, 0.6 * len(depths) + 2.2))
        _heatmap(ax, plt, [[math.log10(v) if v == v else float("nan") for v in r] for r in vals], placements, depths,
                 lambda v: "—" if v != v else f"{10 ** v:.0e}", "largest learning rate that trained (any seed)",
                 "placement", "depth")
        fig.tight_layout()
        out.append(out_dir / "depth_placement_max_lr.png")
        _save(fig, out[-1])
        plt.close(fig)
    return out


def _grad_vs_depth(summaries, rows, out_dir, plt) -> list[Path]:
    """Per-block gradient norm against depth at a few steps, one line per placement (and varying axis; the first
    seed and the first learning rate of the grid), from the runs' metrics."""
    from .runner import read_metrics

    chosen, label = {}, variants(rows)
    first_seed = min(x["seed"] for x in rows)
    for s, r in zip(summaries, rows):
        if r["seed"] == first_seed and label[id(r)] not in chosen:
            chosen[label[id(r)]] = s
    if not chosen:
        return []
    fig, ax = plt.subplots(figsize=(6.5 + 1.8 * (1 + len(chosen) // 8), 3.6))
    for p, s in chosen.items():
        metrics = read_metrics(Path(s["run_dir"])) if s.get("run_dir") else []
        if not metrics:
            continue
        for step in sorted({0, min(len(metrics) - 1, 50), len(metrics) - 1}):
            g = metrics[step]["layer_grad_norm"]
            ax.semilogy(range(len(g)), g, marker=".", label=f"{p} step {step}")
    ax.set_xlabel("block")
    ax.set_ylabel("gradient norm of the block's weights")
    if ax.get_legend_handles_labels()[0]:  # beside the plot: many lines would cover it
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncols=1 + len(chosen) // 8)
    fig.tight_layout()
    out = out_dir / "grad_norm_vs_depth.png"
    _save(fig, out)
    plt.close(fig)
    return [out]
