"""Every run of a study grid -- reused when finished, resumed when interrupted, skipped when another shard
owns it -- then the study's rows, made from every finished run in the results directory (so shards that share
one directory merge), handed to report/ for the tables (study_tables), figures (study_figures) and page
(study_html). ``report_only`` does the second half alone, from a results directory, training nothing."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path

from rich.markup import escape

from ...report import mixing_figure, study_figures, study_html, study_tables
from ...harness.store import atomic_write_text, read_json
from .config import RunConfig, Study, StudyGrid
from .data import SplitCorpus
from .probe import SLOTS
from .runner import build_model, grad_profile, rank_and_world, read_metrics, train_run
from .verdict import JUDGED_FROM, too_short

# what a run measured beyond its loss, kept in its row (summary.json/csv/md) where the run recorded it: the
# composite mixing gains of a widened stream (last evaluation and peak over training), the flattening of the long
# preset's stopping rule, BatchNorm's train-mode loss and future leak, the stream's RMS after the last block at the
# last step, and the DyT/Derf audit's saturation and learned alpha per slot ({slot: value}; one column per slot in
# summary.csv)
PER_SLOT = ("saturation", "alpha")
MEASURED = ("max_composite_gain_fwd", "max_composite_gain_bwd", "peak_composite_gain_fwd", "peak_composite_gain_bwd",
            "flattened", "flatten_step", "stopped_flat", "train_mode_val_loss", "future_leak", "last_stream_rms",
            *PER_SLOT)
COLUMNS = ["name", "placement", "norm", "depth", "d_model", "lr", "warmup", "seed", "clip", "init", "steps",
           "n_streams", "value_residual", "dyt_alpha", "embed_scale", "steps_done", "tokens_seen", "n_params", "final_train_loss",
           "final_val_loss", "final_train_split_loss", "generalization_gap", "failed", "failure", "too_short",
           *(k for k in MEASURED if k not in PER_SLOT), *(f"{k}_{s}" for k in PER_SLOT for s in SLOTS)]


def run_dir(out_dir: Path, cfg: RunConfig, data: SplitCorpus) -> Path:
    return Path(out_dir) / "runs" / f"{cfg.name()}-{cfg.key(data.digest)}"


def run_study(grid: StudyGrid | Study, data: SplitCorpus, out_dir: Path, progress=None, shard: tuple[int, int] = (0, 1),
              on_step=None, tensorboard: Path | None = None, on_run=None, report: StudyGrid | Study | None = None) -> dict:
    """Every run of this shard, then the outputs. ``on_run(i, n, row)``: after each run (the i-th of this shard's
    n), with its line in the tables (``_row``). ``report``: the grid whose finished runs the outputs hold (default:
    ``grid``) -- a preset's confirmation runs (confirm.py) are reported with the preset's own."""
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
        if on_run is not None:
            on_run(i + 1, len(mine), {**_row(summary, cfg), "reused": summary.get("reused", False)})
    if rank_and_world()[0] != 0:  # under torchrun: rank 0 writes the study's outputs
        return {}
    return write_outputs(grid if report is None else report, data, out_dir)


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


def _alpha_text(a) -> str:
    return "/".join(f"{v:g}" for v in a) if isinstance(a, list | tuple) else f"{a:g}"


_PARAMS: dict[tuple, int] = {}


def _n_params(cfg: RunConfig) -> int:
    """The model's parameter count (built once per architecture, leaving the global RNG as it was)."""
    arch = (cfg.placement, cfg.norm, cfg.depth, cfg.d_model, cfg.heads, cfg.seq_len, cfg.n_streams,
            cfg.value_residual, cfg.embed_scale is not None)
    if arch not in _PARAMS:
        import torch

        with torch.random.fork_rng(devices=[]):
            _PARAMS[arch] = sum(p.numel() for p in build_model(cfg).parameters())
    return _PARAMS[arch]


def _row(s: dict, cfg: RunConfig) -> dict:
    """A run's line in the tables: its setting, budget and outcome (tokens and parameters computed from its
    configuration for a run finished before they were recorded)."""
    tokens = s.get("tokens_seen", s["steps_done"] * cfg.batch * cfg.seq_len)
    if too_short(s["failure"], cfg.steps):  # on the plateau, but so is every setting at this budget (verdict.py)
        s = {**s, "failed": False, "failure": None}
        return {**_row(s, cfg), "too_short": True}
    return {"name": s["name"], "placement": cfg.placement_name, "norm": cfg.norm, "depth": cfg.depth,
            "d_model": cfg.d_model, "lr": cfg.lr, "warmup": cfg.warmup, "seed": cfg.seed, "clip": cfg.clip,
            "init": cfg.init, "steps": cfg.steps, "n_streams": cfg.n_streams, "value_residual": cfg.value_residual,
            "dyt_alpha": _alpha_text(cfg.dyt_alpha), "embed_scale": cfg.embed_scale, "steps_done": s["steps_done"],
            "tokens_seen": tokens,
            "n_params": s.get("n_params") or _n_params(cfg), "final_train_loss": s["final_train_loss"],
            "final_val_loss": s["final_val_loss"], "final_train_split_loss": s.get("final_train_split_loss", math.nan),
            "generalization_gap": s.get("generalization_gap", math.nan), "failed": s["failed"],
            "failure": s["failure"] or "", "too_short": False, **{k: s[k] for k in MEASURED if k in s}}


def _csv_row(r: dict) -> dict:
    """A row as summary.csv holds it: the per-slot measures ({slot: value}) one column per slot."""
    out = {k: v for k, v in r.items() if k in COLUMNS}
    for k in PER_SLOT:
        for slot, v in (r.get(k) or {}).items():
            out[f"{k}_{slot}"] = v
    return out


def _grad_profile(s: dict) -> dict[str, list[float]]:
    """The per-block gradient norms at the first step, step 50 and the last: as the run's summary recorded them,
    else from its metrics (a run finished before the summary kept them); {} when neither is there."""
    return s.get("grad_profile") or grad_profile(read_metrics(Path(s["run_dir"])))


def write_outputs(grid: StudyGrid | Study, data: SplitCorpus, out_dir: Path) -> dict:
    summaries, missing = collect(grid, data, out_dir)
    cfg_of = {c.name(): c for c in grid.runs()}
    rows = [_row(s, cfg_of[s["name"]]) for s in summaries]
    first = min((r["seed"] for r in rows), default=0)
    curves = {s["name"]: s["val_curve"] for s in summaries if s.get("val_curve")}
    saturation = {s["name"]: s["saturation_curve"] for s in summaries if s.get("saturation_curve")}
    profiles = {s["name"]: _grad_profile(s) for s, r in zip(summaries, rows) if r["seed"] == first}
    head = {"grid": grid.describe(), "corpus": data.source, "data_digest": data.digest,
            "unigram_nats": data.unigram_nats}
    mixing = mixing_figure.mixing_data(summaries)  # the widened runs' composite gains, kept in summary.json
    return _write(head, rows, curves, {k: v for k, v in profiles.items() if v}, missing, out_dir, mixing, saturation)


def report_only(grid: StudyGrid | Study, out_dir: Path) -> dict:
    """The tables, figures and report again from what ``out_dir`` holds -- nothing trained, no data loaded.

    * A directory without ``runs/`` (a committed results directory) holds only its summary.json: the report is
      made again from every run recorded there, whatever ``grid`` says (the grid options cannot add a run it
      does not hold, and must never drop one: summary.json is the only copy of the results).
    * A directory with ``runs/``: each run of ``grid`` from its run directory (the data digest in summary.json
      picks among several), else from the previous summary.json, else missing. A grid that would drop runs the
      previous summary.json recorded is refused (``ValueError`` naming ``--preset``): give the preset and axes
      the study was run with."""
    out_dir = Path(out_dir)
    old, why = read_json(out_dir / "summary.json")
    has_runs = (out_dir / "runs").is_dir()
    if old is None and not has_runs:
        raise FileNotFoundError(f"{out_dir} holds neither summary.json nor runs/: nothing to report"
                                + (f" ({why})" if why else ""))
    if not has_runs:
        return _from_summary(old, out_dir)
    old = old or {}
    old_rows = {r["name"]: r for r in old.get("runs", [])}
    rows, curves, profiles, missing, unigram = [], {}, {}, [], old.get("unigram_nats")
    saturation, old_saturation = {}, old.get("saturation_curves") or {}
    fresh = []
    for cfg in grid.runs():
        s = _finished_run(out_dir, cfg, old.get("data_digest"))
        if s is not None:
            rows.append(_row(s, cfg))
            fresh.append(s)
            unigram = unigram if unigram is not None else s.get("unigram_nats")
            if s.get("val_curve"):
                curves[s["name"]] = s["val_curve"]
            if s.get("saturation_curve"):
                saturation[s["name"]] = s["saturation_curve"]
            if cfg.seed == min(c.seed for c in grid.runs()):
                profiles[s["name"]] = _grad_profile(s) or old.get("grad_profiles", {}).get(s["name"], {})
        elif cfg.name() in old_rows:
            rows.append(_row(old_rows[cfg.name()], cfg))
            if cfg.name() in old.get("curves", {}):
                curves[cfg.name()] = old["curves"][cfg.name()]
            if cfg.name() in old.get("grad_profiles", {}):
                profiles[cfg.name()] = old["grad_profiles"][cfg.name()]
            if old_saturation.get(cfg.name()):
                saturation[cfg.name()] = old_saturation[cfg.name()]
        else:
            missing.append(cfg.name())
    dropped = set(old_rows) - {r["name"] for r in rows}
    if dropped:
        raise ValueError(f"summary.json in {out_dir} records {len(old_rows)} runs and this grid "
                         f"({grid.describe()}) keeps {len(old_rows) - len(dropped)} of them: rewriting it would drop "
                         f"{len(dropped)} (e.g. {sorted(dropped)[0]}). Give the --preset (and axes) the study was run "
                         f"with -- summary.json's grid: {old.get('grid', 'unknown')}")
    head = {"grid": grid.describe(), "corpus": old.get("corpus", "unknown (no summary.json)"),
            "data_digest": old.get("data_digest"), "unigram_nats": unigram if unigram is not None else math.nan}
    mixing = {m["name"]: m for m in mixing_figure.mixing_data(fresh)}
    for m in old.get("mixing", []):  # runs known only from the committed summary keep their gains, and their
        name = _mixing_name(m, rows)  # series where the run's files lack it
        if name is not None and (name not in mixing or not mixing[name]["series"]):
            mixing[name] = {**m, "name": name} if name not in mixing else {**mixing[name], "series": m["series"]}
    return _write(head, rows, curves, {k: v for k, v in profiles.items() if v}, missing, out_dir,
                  list(mixing.values()), saturation)


def _mixing_name(m: dict, rows: list[dict]) -> str | None:
    """The run a recorded mixing entry belongs to among ``rows``: by its name, or for an entry written before the
    name was kept, the one row of its placement, depth, seed and learning rate; None when there is none."""
    if "name" in m:
        return m["name"] if any(r["name"] == m["name"] for r in rows) else None
    same = [r["name"] for r in rows
            if (r["placement"], r["depth"], r["seed"], r["lr"]) == (m["placement"], m["depth"], m["seed"], m["lr"])]
    return same[0] if len(same) == 1 else None


def _from_summary(old: dict, out_dir: Path) -> dict:
    """The report again from a summary.json alone: its rows, curves, gradient profiles, mixing gains and saturation
    curves as recorded (the grid it names is the grid reported; a summary.json written before a key existed
    gives it empty)."""
    head = {"grid": old.get("grid", "unknown"), "corpus": old.get("corpus", "unknown"),
            "data_digest": old.get("data_digest"), "unigram_nats": old.get("unigram_nats", math.nan)}
    head["unigram_nats"] = math.nan if head["unigram_nats"] is None else head["unigram_nats"]
    study = _write(head, [dict(r) for r in old.get("runs", [])], old.get("curves", {}), old.get("grad_profiles", {}),
                   list(old.get("missing", [])), out_dir, old.get("mixing", []), old.get("saturation_curves") or {})
    study["source"] = "summary.json"  # not written: says the grid options were not used
    return study


def _finished_run(out_dir: Path, cfg: RunConfig, digest: str | None) -> dict | None:
    """The finished summary in ``runs/<name>-<key>/`` of this configuration (on any data; ``digest`` first)."""
    found = []
    for d in sorted((Path(out_dir) / "runs").glob(f"{cfg.name()}-*")):
        if not re.fullmatch(r"[0-9a-f]{16}", d.name[len(cfg.name()) + 1:]):
            continue  # another run whose name extends this one's ('...-xavier-n2-<key>')
        s, _ = read_json(d / "summary.json")
        if s is not None and "final_val_loss" in s and s.get("key") == cfg.key(s.get("data_digest", "")):
            s["run_dir"] = str(d)
            found.append(s)
    found.sort(key=lambda s: s.get("data_digest") != digest)
    return found[0] if found else None


def _write(head: dict, rows: list[dict], curves: dict, profiles: dict, missing: list[str], out_dir: Path,
           mixing: list[dict] | None = None, saturation: dict | None = None) -> dict:
    """summary.csv/md/json, the figures and index.html. ``saturation``: {run name: [[steps done, {slot: fraction
    saturated}], ...]} of the DyT/Derf runs (runner.py's ``saturation_curve``), kept as ``saturation_curves``."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(_csv_row(r) for r in rows)
    atomic_write_text(out_dir / "summary.csv", buf.getvalue())
    study = {**head, "judged_from": JUDGED_FROM, "runs": rows, "missing": missing, "groups": study_tables.groups(rows),
             "pairwise": study_tables.pairwise(rows), "curves": curves, "saturation_curves": saturation or {},
             "grad_profiles": profiles, "mixing": mixing or []}
    atomic_write_text(out_dir / "summary.md", study_tables.markdown(study))
    study["figures"] = [p.name for p in study_figures.write(rows, curves, profiles, out_dir / "figures",
                                                            saturation or {})]
    gain = mixing_figure.mixing_figure(mixing or [], out_dir / "figures" / "composite_gain.png")
    if gain is not None:  # the mHC claim's figure (HC, mHC, mHC-lite runs only)
        study["figures"].append(gain.name)
    for stale in sorted((out_dir / "figures").glob("*.png")):  # drawn by an earlier report, not by this one
        if stale.name not in study["figures"]:
            stale.unlink(missing_ok=True)
    atomic_write_text(out_dir / "summary.json", json.dumps(study, indent=1))
    study["report"] = str(study_html.write(study, study["figures"], out_dir))
    return study
