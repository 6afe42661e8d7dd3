"""The claims file: one record per claim of the seeds and of the papers that the study tests, recomputed from the
committed runs (``benchmarks/results/study/<preset>/``), never written by hand.

Each claim is a contrast between an arm and its baseline in one results directory: the claims preset that makes
its runs (``claims_seeds``, ``claims_frontier``, ...: every final loss on the held-out test split, 5 seeds, three
learning rates, GPT-2 init), or while that directory is not committed, the ``legacy`` directory measured before the
test split existed (its records are shown, never judged):

- a loss or gap claim pairs the arm's runs with the baseline's by seed (and, where the claim spans the grid, by
  learning rate and seed) and tests the paired differences of their final (test) losses with the exact sign-flip
  permutation test; its interval is the paired-t 95 % interval, its mde the paired-t test's at 80 % power
  (``harness/statistics.py``);
- a failure claim compares the failure rates with Fisher's exact test (two-sided), its interval Newcombe's;
- where a claim is "tuned", each side runs at its own best learning rate (and warmup) of the grid: the setting
  with the lowest mean final *dev* loss over seeds (the dev split, data.py: never the bytes the test reads). A best
  value at an end of the grid, or a grid of fewer than 3 learning rates, does not bracket that side's optimum:
  ``lr_bracketed`` is false and the notes say so;
- a claim is judged only where its final losses were measured on at least ``MIN_VAL_BYTES`` held-out bytes (loss,
  gap and failure claims), with ``MIN_SEEDS`` seeds or more, on one data split, and a tuned side chose its learning
  rate on the dev split; otherwise its record keeps its numbers, ``judged`` is false, the notes say why, and the
  verdict is ``inconclusive``;
- Holm's correction runs over every judged record, and the verdict follows ``statistics.verdict``.

A claim whose runs do not exist yet keeps its record, with no effect and the verdict ``inconclusive``.

Run: ``python -m addnorm.experiments.study.claims --out benchmarks/results/study/claims.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .budget import BUDGET_CPU_HOURS, CLAIM_SET, load_costs, preset_cost
from .config import CLAIM_SEEDS, CONFIRM_SEEDS, PRESETS, RunConfig, as_study
from .data import TEST_BYTES
from .result_files import RESULTS, parse_results_and_out
from ...harness.statistics import (ALPHA, HIGHER, INCONCLUSIVE, LOWER, POWER, SAME, differences, fisher_exact, holm, mde_paired,
                         mde_rate, min_sign_flip_p, paired_t_interval, pairs_to_reach, rate_difference_interval,
                         sign_flip_p, verdict)

# The study's corpus (the Python 3.11 standard library) split by file: the training split is capped at 4 MiB
# (data.load_split's default; before the test split too), so an epoch is 4,194,304 bytes (one token per byte).
TRAIN_BYTES = 4 << 20
MIN_VAL_BYTES = TEST_BYTES  # a final loss measured on fewer held-out bytes decides nothing
MIN_SEEDS = 5
_DEFAULT = RunConfig()
_SELF = "python benchmarks/study_claims.py"  # claims.json and docs/study.md's claims table
_STUDY = {  # how each results directory is made from nothing
    "study": "addnorm study --preset default --out benchmarks/results/study/study",
    "paper24": "addnorm study --preset paper --out benchmarks/results/study/paper24",
    "study_residual": ("addnorm study --preset quick --placements no_residual,pre --depths 12 --lrs 1e-3 --warmups 100 "
                       "--seeds 0,1,2 --steps 400 --out benchmarks/results/study/study_residual"),
    "study_norms": ("addnorm study --preset quick --placements pre --norms layer,rms,batch --depths 6 --lrs 1e-3 "
                    "--warmups 100 --seeds 0,1,2 --steps 400 --out benchmarks/results/study/study_norms"),
    **{p: f"addnorm study --preset {p} --out benchmarks/results/study/{p}"
       for p in ("frontier", "depth", "long", "wide", "mixing", "dyt", "claims_seeds", "claims_frontier",
                 "claims_dyt_budget", "claims_dyt_cause", "claims_depth", "claims_mixing", "claims_long",
                 "claims_wide")},
}
LOSS, GAP, FAILURE = "final_val_loss", "generalization_gap", "failure_rate"
GAIN_FWD, GAIN_BWD = "peak_composite_gain_fwd", "peak_composite_gain_bwd"  # the largest over training
# BatchNorm's: the validation loss in evaluation mode (running statistics) minus in training mode (the batch's
# statistics, future included), and the future leak (the largest change of a first-half logit when the second half
# of the sequence changes; runner.train_eval_gap): both exactly 0 for a norm that does not mix positions
MODE_GAP, LEAK = "eval_mode_gap", "future_leak"
MEASURES = (LOSS, GAP, FAILURE, GAIN_FWD, GAIN_BWD, MODE_GAP, LEAK)


@dataclass(frozen=True)
class Published:
    """A paper's own number for the claim, and the setting it was measured in."""

    result: str
    setting: str
    arxiv: str


@dataclass(frozen=True)
class Spec:
    """What a claim compares: the runs of ``preset`` whose axes match ``arm`` against those matching ``baseline``
    (pairs of (axis, value); a tuple value matches any of its members)."""

    id: str
    source: str  # a seed document's file name, or an arXiv id
    statement: str
    preset: str  # the results directory its runs are in, made by the preset of that name
    measure: str  # one of MEASURES
    direction: str  # LOWER / HIGHER: the arm's value against the baseline's; SAME: no difference
    arm: tuple[tuple[str, object], ...]
    baseline: tuple[tuple[str, object], ...]
    tune: tuple[str, ...] = ()  # axes each side takes at its own best (lowest mean loss) value: ("lr",), ...
    pair_by: tuple[str, ...] = ("seed",)  # what makes a pair; ("lr", "seed") spans the learning-rate grid
    published: Published | None = None
    needs: str = ""  # the runs the claim needs that do not exist yet ("" where the committed runs answer it)
    remarks: tuple[str, ...] = ()  # what a reader must know to compare it (kept in the record's notes)
    legacy: str = ""  # the directory measured before the test split, read (never judged) while ``preset``'s is absent

    @property
    def confirmed(self) -> bool:
        """Paired by seed alone (not pooled, not paired over the grid): the settings each side runs at -- a tuned
        side's chosen on the selection seeds -- are run again at the confirmation seeds (confirm.py), and the claim
        is tested on every seed run there."""
        return self.measure != FAILURE and self.pair_by == ("seed",) and not self.needs

    def __post_init__(self):
        for name, value, valid in (("preset", self.preset, tuple(_STUDY)),
                                   *((("legacy", self.legacy, tuple(_STUDY)),) if self.legacy else ()),
                                   ("measure", self.measure, MEASURES),
                                   ("direction", self.direction, (LOWER, HIGHER, SAME))):
            if value not in valid:
                raise ValueError(f"claim {self.id!r}: {name} must be one of {', '.join(valid)}, got {value!r}")
        if self.measure == FAILURE and (self.tune or self.pair_by != ("seed",)):
            raise ValueError(f"claim {self.id!r}: a failure rate pools every run of each side; tune and pair_by "
                             "apply to paired measures only")


@dataclass(frozen=True)
class Claim:
    """One record of claims.json."""

    id: str
    source: str
    statement: str
    preset: str  # the preset (and results directory) that makes the claim's runs: ``command``
    results: str  # the results directory read: ``preset``, or the legacy one while ``preset``'s is not committed
    arm: dict
    baseline: dict
    measure: str
    direction: str
    test: str
    n_seeds: int  # pairs (loss, gap, gain) or the smaller side's runs (failure rate)
    tokens: int | None  # training tokens per run (steps x batch x sequence length; one token per byte)
    tokens_per_param: float | None
    epochs: float | None  # passes over the 4 MiB training split
    val_bytes: int | None  # the held-out bytes each final loss is measured on (the fewest of any run read)
    lr_bracketed: bool | None  # every tuned side's best learning rate inside its grid (None: not tuned by lr)
    judged: bool  # measured as a verdict needs (see the module's docstring); the notes say why not
    effect: float | None  # mean(arm - baseline) over pairs, or rate(arm) - rate(baseline)
    ci: list | None  # [low, high], 95 %
    p: float | None
    p_holm: float | None
    verdict: str
    mde: float | None  # the smallest |effect| detected with 80 % power at alpha 0.05 (None: none is)
    min_p: float | None  # the smallest p the test can give with these runs: below alpha or nothing is decidable
    published: dict | None
    command: str
    notes: list = field(default_factory=list)


def _alpha_text(a) -> str:
    return "/".join(f"{v:g}" for v in a) if isinstance(a, list | tuple) else f"{a:g}"


def setting_row(c: dict) -> dict:
    """A run's setting as a claim selects it (``matches``), from its configuration: a ``RunConfig.__dict__`` or the
    ``config`` of its config.json."""
    placement = c["placement"] if isinstance(c["placement"], str) else "+".join(c["placement"])
    return {"placement": placement, "norm": c["norm"], "init": c["init"], "depth": c["depth"], "d_model": c["d_model"],
            "lr": c["lr"], "warmup": c["warmup"], "seed": c["seed"], "steps": c["steps"], "batch": c["batch"],
            "seq_len": c["seq_len"], "eval_batches": c["eval_batches"],
            "value_residual": c.get("value_residual", False), "dyt_alpha": _alpha_text(c.get("dyt_alpha", 0.5)),
            "embed_scale": c.get("embed_scale")}


def _row_from_run(config: dict, summary: dict) -> dict:
    """A run's line, from runs/<name>-<key>/config.json and summary.json."""
    c = config["config"]
    return {"name": summary["name"], **setting_row(c),
            "n_params": summary.get("n_params"), "final_val_loss": summary["final_val_loss"],
            "final_dev_loss": summary.get("final_dev_loss"),
            # before the test split: the final loss read the fixed validation batches
            "val_bytes": summary.get("val_bytes") or c["eval_batches"] * c["batch"] * c["seq_len"],
            "data_digest": config.get("data_digest") or summary.get("data_digest"),
            "generalization_gap": summary.get("generalization_gap"), "failed": summary["failed"],
            "steps_done": summary.get("steps_done"), "seconds": summary.get("seconds_this_session"),
            "future_leak": summary.get("future_leak"), "train_mode_val_loss": summary.get("train_mode_val_loss"),
            GAIN_FWD: summary.get(GAIN_FWD), GAIN_BWD: summary.get(GAIN_BWD)}


def _row_from_summary(r: dict, data_digest: str | None) -> dict:
    """A run's line from a results directory's summary.json (where its runs/ is not committed): batch, sequence
    length and evaluation batches are not recorded there and were RunConfig's defaults for every preset, and the
    held-out bytes, where not recorded, those of its fixed validation batches."""
    keep = ("name", "placement", "norm", "init", "depth", "d_model", "lr", "warmup", "seed", "steps",
            "value_residual", "dyt_alpha", "embed_scale", "n_params", "final_val_loss", "final_dev_loss", "generalization_gap",
            "failed", "steps_done", "future_leak", "train_mode_val_loss")
    fixed = _DEFAULT.eval_batches * _DEFAULT.batch * _DEFAULT.seq_len
    return {**{k: r.get(k) for k in keep}, "batch": _DEFAULT.batch, "seq_len": _DEFAULT.seq_len,
            "eval_batches": _DEFAULT.eval_batches, "val_bytes": r.get("val_bytes") or fixed,
            "data_digest": data_digest, "seconds": None}


def run_rows(results_dir: Path) -> list[dict]:
    """One dict per finished run under ``results_dir/runs/`` (its config.json and summary.json; a run without
    summary.json is not finished), whether or not the directory's summary.json has been written."""
    run_dirs = sorted(p.parent for p in (Path(results_dir) / "runs").glob("*/summary.json"))
    return [_row_from_run(json.loads((p / "config.json").read_text()), json.loads((p / "summary.json").read_text()))
            for p in run_dirs]


def load_rows(results: Path, preset: str) -> list[dict] | None:
    """The committed runs of one results directory, one dict per run: from runs/*/ where they are committed
    (``run_rows``), else from the directory's summary.json; the peak composite gains of a widened run from its own
    summary, else from summary.json's ``mixing`` series. None where the directory is not committed."""
    d = Path(results) / preset
    if not (d / "summary.json").exists():
        return None
    study = json.loads((d / "summary.json").read_text())
    rows = run_rows(d) if (d / "runs").is_dir() else []
    if not rows:
        rows = [_row_from_summary(r, study.get("data_digest")) for r in study["runs"]]
    peaks = {}
    for m in study.get("mixing", []):
        if m.get("series"):
            key = m.get("name") or (m["placement"], m["depth"], m["seed"], m["lr"])
            peaks[key] = (max(s[1] for s in m["series"]), max(s[2] for s in m["series"]))
    for r in rows:
        peak = peaks.get(r["name"]) or peaks.get((r["placement"], r["depth"], r["seed"], r["lr"]))
        if r.get(GAIN_FWD) is None and r.get(GAIN_BWD) is None:  # a run summarised before it kept its peaks
            r[GAIN_FWD], r[GAIN_BWD] = peak if peak else (None, None)
        r[MODE_GAP] = _mode_gap(r)
    return rows


def _mode_gap(r: dict) -> float | None:
    """Evaluation-mode minus training-mode validation loss, where the run recorded both."""
    train_mode = r.get("train_mode_val_loss")
    return None if train_mode is None or r.get("final_val_loss") is None else r["final_val_loss"] - train_mode


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def matches(row: dict, select) -> bool:
    return all(row.get(k) in v if isinstance(v, tuple) else row.get(k) == v for k, v in select)


_SETTING_KEYS = tuple(setting_row({**RunConfig().__dict__}))


def _setting(row: dict, axes: tuple[str, ...]) -> tuple:
    return tuple(row[a] for a in axes)


def _mean(values: list[float]) -> float:
    """The mean, or infinity where a run diverged (NaN): such a setting is never the best."""
    return sum(values) / len(values) if all(math.isfinite(v) for v in values) else math.inf


def _setting_of_run(row: dict) -> tuple:
    """Everything that tells a run's setting from another's but its seed."""
    return tuple((k, row.get(k)) for k in _SETTING_KEYS if k != "seed")


def selection_seeds(rows: list[dict]) -> list[int]:
    """The seeds run at every setting of ``rows`` (the claims presets': 0-4). Seeds run at only some settings -- the
    confirmation runs (confirm.py) of the setting one claim chose -- cannot choose a setting or enter a pool: a
    setting with more seeds would be judged on a different sample."""
    by: dict[tuple, set] = {}
    for r in rows:
        by.setdefault(_setting_of_run(r), set()).add(r["seed"])
    return sorted(set.intersection(*by.values())) if by else []


def tuned(rows: list[dict], axes: tuple[str, ...]) -> tuple[list[dict], dict]:
    """The runs a side reads, and what was chosen.

    Untuned (``axes`` empty): the runs at the selection seeds (``selection_seeds``; for a side of one setting, every
    run of it). Tuned: the setting of ``axes`` with the lowest mean final dev loss over the selection seeds (ties: the
    first in sorted order), and every run at that setting -- the selection seeds' and any confirmation seeds' run
    there. The info: {axis: value, axis_grid: every value, lr_bracketed: the best learning rate lies strictly inside
    a grid of 3 or more, chosen_on: "dev", chosen_with_seeds: the selection seeds}, and where runs were left out
    (seeds run only at settings not read), ``left_out``: how many and ``left_out_seeds``. Runs finished before the
    dev split recorded no dev loss: their setting is chosen on the final (test) loss, and ``chosen_on`` says
    "test"."""
    seeds = set(selection_seeds(rows))
    chosen_from = [r for r in rows if r["seed"] in seeds]
    info: dict = {}
    if not axes or not chosen_from:
        kept = chosen_from
    else:
        on = "final_dev_loss" if all(r.get("final_dev_loss") is not None for r in chosen_from) else "final_val_loss"
        by: dict[tuple, list] = {}
        for r in chosen_from:
            by.setdefault(_setting(r, axes), []).append(r[on])
        best = min(sorted(by), key=lambda s: _mean(by[s]))
        for i, a in enumerate(axes):
            grid = sorted({s[i] for s in by})
            info[a], info[f"{a}_grid"] = best[i], grid
            if a == "lr":  # a best value at the grid's edge may not be the side's optimum
                info["lr_bracketed"] = len(grid) >= 3 and grid[0] < best[i] < grid[-1]
        info["chosen_on"] = "dev" if on == "final_dev_loss" else "test"
        info["chosen_with_seeds"] = sorted(seeds)
        kept = [r for r in rows if _setting(r, axes) == best]
    read = {id(r) for r in kept}
    left = [r for r in rows if id(r) not in read and r["seed"] not in seeds]
    if left:
        info["left_out"], info["left_out_seeds"] = len(left), sorted({r["seed"] for r in left})
    return kept, info


def _side(spec_select, rows: list[dict], info: dict, mean: float | None = None) -> dict:
    """What a side is, as the record states it: its selection, the setting that was run or chosen, and the mean
    of the measure over the runs the test read (the failure rate for a failure claim)."""
    out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec_select}
    first = rows[0] if rows else {}
    for k in ("placement", "norm", "init", "depth", "d_model", "warmup", "steps", "dyt_alpha", "value_residual",
              "embed_scale"):
        if k == "dyt_alpha" and not any(r["norm"] in ("dyt", "derf") for r in rows):
            continue  # alpha0 means nothing without a DyT or Derf norm
        if k == "embed_scale" and all(r.get(k) is None for r in rows):
            continue  # no embedding scale: every run before the DyT/Derf audit's cause
        vals = sorted({r.get(k) for r in rows}, key=str)
        if k not in out and vals:
            out[k] = vals[0] if len(vals) == 1 else vals
    lrs = sorted({r["lr"] for r in rows})
    out["lr"] = lrs[0] if len(lrs) == 1 else lrs
    out.update(info)
    out["runs"] = len(rows)
    if mean is not None:
        out["mean"] = _round(mean)
    if first.get("n_params"):
        out["n_params"] = int(_median([r["n_params"] for r in rows if r.get("n_params")]))
    return out


def _budget(rows: list[dict], read: list[dict]) -> dict:
    """Tokens per run of the arm's ``rows`` (the planned budget: a run stopped early by a failure saw fewer), per
    parameter, epochs, and the held-out bytes of the fewest of every run ``read`` (both sides')."""
    r = rows[0]
    tokens = r["steps"] * r["batch"] * r["seq_len"]
    params = [x["n_params"] for x in rows if x.get("n_params")]
    return {"tokens": tokens, "tokens_per_param": round(tokens / _median(params), 4) if params else None,
            "epochs": round(tokens / TRAIN_BYTES, 4), "val_bytes": min(x["val_bytes"] for x in read)}


def _unjudged(spec: Spec, read: list[dict], val_bytes: int, seeds: int, infos: tuple[dict, dict]) -> list[str]:
    """Why a measured claim cannot be judged ([] where it can): too few held-out bytes for a loss, gap or failure
    claim, too few seeds, runs of more than one data split, or a learning rate chosen on the test bytes."""
    why = []
    if spec.measure in (LOSS, GAP, FAILURE) and val_bytes < MIN_VAL_BYTES:
        why.append(f"val_bytes {val_bytes:,} < {MIN_VAL_BYTES:,}: the final losses were measured on {val_bytes:,} "
                   "held-out bytes")
    if seeds < MIN_SEEDS:
        why.append(f"{seeds} seeds < {MIN_SEEDS}")
    digests = {r.get("data_digest") for r in read} - {None}
    if len(digests) > 1:
        why.append(f"the runs read {len(digests)} different data splits ({', '.join(sorted(digests))})")
    if any(info.get("chosen_on") == "test" for info in infos):
        why.append("the learning rate was chosen on the bytes the test reads (no dev loss recorded)")
    return why


def _published(spec: Spec) -> dict | None:
    return asdict(spec.published) if spec.published else None


def _empty(spec: Spec, why: str, results: str) -> dict:
    return dict(id=spec.id, source=spec.source, statement=spec.statement, preset=spec.preset, results=results,
                arm={k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.arm},
                baseline={k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.baseline},
                measure=spec.measure, direction=spec.direction, test=_test_name(spec, 0), n_seeds=0, tokens=None,
                tokens_per_param=None, epochs=None, val_bytes=None, lr_bracketed=None, judged=False, effect=None,
                ci=None, p=None, mde=None, min_p=None, published=_published(spec), command=_command(spec),
                notes=[why])


def _test_name(spec: Spec, n: int) -> str:
    if spec.measure == FAILURE:
        return "Fisher's exact test, two-sided; interval: Newcombe (Wilson score)"
    how = "exact, every sign vector" if n <= 20 else "Monte Carlo, 200,000 sign vectors"
    return f"paired sign-flip permutation test, two-sided ({how}); interval: paired t"


def confirm_command(preset: str) -> str:
    """The command that trains a claims preset's confirmation runs (confirm.py) into its results directory."""
    return f"addnorm study --preset {preset} --confirm --out benchmarks/results/study/{preset}"


def unconfirmable(spec: Spec) -> list[str]:
    """Why the confirmation runs cannot serve a claim paired by seed alone ([] where they can): a side its preset
    has no run of, or an untuned side of several settings (paired by seed alone, it would pair runs of different
    settings: there is no one setting to run again)."""
    runs = [setting_row(r.__dict__) for r in as_study(PRESETS[spec.preset]).runs()] if spec.preset in PRESETS else []
    why = []
    for role, select in (("arm", spec.arm), ("baseline", spec.baseline)):
        side = [r for r in runs if matches(r, select)]
        settings = len({_setting_of_run(r) for r in side})
        if not side:
            why.append(f"the preset has no run of its {role}")
        elif not spec.tune and settings > 1:
            why.append(f"its {role} spans {settings} settings, untuned and paired by seed alone: there is no one "
                       "setting to confirm")
    return why


def _command(spec: Spec) -> str:
    """The claim from nothing: its preset's runs, then (a claim paired by seed) the confirmation runs of the settings
    they choose, then this file."""
    again = spec.confirmed and spec.preset in PRESETS and not unconfirmable(spec)
    return " && ".join([_STUDY[spec.preset], *([confirm_command(spec.preset)] if again else []), _SELF])


def _by_pair(spec: Spec, side: str, rows: list[dict], key: str) -> dict:
    """{pair key: the run's measure}; a side holding two runs at one pair key (it spans a setting the pairing does
    not name, e.g. a learning-rate grid paired by seed alone) is an error, not a silent choice of one of them."""
    out, names = {}, {}
    for r in rows:
        k = _setting(r, spec.pair_by)
        if k in names:
            raise ValueError(f"claim {spec.id!r}: the {side} has two runs at {dict(zip(spec.pair_by, k))} "
                             f"({names[k]}, {r.get('name', '?')}): pair_by {spec.pair_by} does not tell them apart "
                             "(add the axis they differ in to pair_by, or tune it)")
        names[k] = r.get("name", "?")
        if r.get(key) is not None:
            out[k] = r[key]
    return out


def measure(spec: Spec, rows: list[dict] | None, results: str | None = None) -> dict:
    """The record of one claim before Holm's correction (p_holm and verdict are set by ``build``); ``rows`` are the
    runs of the results directory ``results`` (default: the spec's preset's)."""
    results = results or spec.preset
    if spec.needs:
        return _empty(spec, f"not measured: {spec.needs}", results)
    if rows is None:
        where = f"{spec.preset}/" + (f" nor {spec.legacy}/" if spec.legacy else "")
        return _empty(spec, f"not measured: benchmarks/results/study/{where} is not committed", results)
    arm_all = [r for r in rows if matches(r, spec.arm)]
    base_all = [r for r in rows if matches(r, spec.baseline)]
    if not arm_all or not base_all:
        return _empty(spec, f"not measured: {results}/ holds {len(arm_all)} runs of the arm and "
                            f"{len(base_all)} of the baseline", results)
    arm, arm_info = tuned(arm_all, spec.tune)
    base, base_info = tuned(base_all, spec.tune)
    for side, kept, every in (("arm", arm, arm_all), ("baseline", base, base_all)):
        if not kept:
            return _empty(spec, f"not measured: no seed of the {side}'s {len(every)} runs in {results}/ was run at "
                                "every one of its settings", results)
    notes = []
    if spec.measure == FAILURE:
        ka, na = sum(r["failed"] for r in arm), len(arm)
        kb, nb = sum(r["failed"] for r in base), len(base)
        means = (ka / na, kb / nb)
        effect = ka / na - kb / nb
        low, high = rate_difference_interval(ka, na, kb, nb)
        p = fisher_exact(ka, na, kb, nb)
        mde = mde_rate(kb / nb, na, nb, direction=spec.direction)
        min_p = fisher_exact(na, na, 0, nb)  # every arm run failed, no baseline run did
        n = seeds = min(len({r["seed"] for r in arm}), len({r["seed"] for r in base}))
        notes.append(f"failed {ka} of {na} runs against {kb} of {nb}")
        if not min_p < ALPHA:
            notes.append(f"Fisher's test cannot reach p < {ALPHA:g} with {na} runs against {nb}, whatever the rates")
        elif mde is None:
            way = {LOWER: "fewer", HIGHER: "more", SAME: "more or fewer"}[spec.direction]
            notes.append(f"no rate of {way} failures than the baseline's {kb}/{nb} is detected with "
                         f"{POWER:.0%} power at {na} runs against {nb}")
    else:
        key = spec.measure
        a, b = _by_pair(spec, "arm", arm, key), _by_pair(spec, "baseline", base, key)
        both = sorted(set(a) & set(b))
        pairs = [k for k in both if math.isfinite(a[k]) and math.isfinite(b[k])]
        if not pairs:
            return _empty(spec, f"not measured: no finite {key} recorded for both sides at the same "
                                f"{' and '.join(spec.pair_by)}", results)
        if len(pairs) < len(both):
            notes.append(f"{len(both) - len(pairs)} pairs left out: a run of the pair diverged (no finite {key})")
        d = differences([a[k] for k in pairs], [b[k] for k in pairs])
        means = (sum(a[k] for k in pairs) / len(pairs), sum(b[k] for k in pairs) / len(pairs))
        iv = paired_t_interval(d)
        effect, low, high, n = iv.mean, iv.low, iv.high, len(pairs)
        seeds = len({k[-1] for k in pairs})
        p = sign_flip_p(d)
        mde = mde_paired(iv.sd, n) if iv.sd is not None else None
        min_p = min_sign_flip_p(n)
        if spec.pair_by != ("seed",):
            notes.append(f"paired by {' and '.join(spec.pair_by)}: {n} pairs over {seeds} seeds")
        if any(r["failed"] for r in arm + base):
            notes.append(f"failed runs keep their final loss: {sum(r['failed'] for r in arm)} of the arm's "
                         f"{len(arm)}, {sum(r['failed'] for r in base)} of the baseline's {len(base)}")
    if min_p >= ALPHA:
        notes.append(f"the test's smallest possible p with these runs is {min_p:.3g} >= {ALPHA:g}: no verdict but "
                     "inconclusive is possible")
    notes += _tuning_notes(spec, arm_info, base_info)
    for side, info in (("arm", arm_info), ("baseline", base_info)):
        if info.get("left_out"):
            where = "a setting not chosen here" if spec.tune else "only some of its settings"
            notes.append(f"the {side}'s {info['left_out']} runs at seeds {_seeds_text(info['left_out_seeds'])}, run "
                         f"at {where} (confirmation runs of another claim's setting), are left out")
    inits = ({r["init"] for r in arm}, {r["init"] for r in base})
    if inits[0] != inits[1] and "init" not in dict(spec.arm):
        notes.append(f"the arm ran only at {'/'.join(sorted(inits[0]))} init, the baseline at "
                     f"{'/'.join(sorted(inits[1]))}: the effect includes the init's")
    if spec.measure == GAP and any(r["norm"] == "batch" and r.get("future_leak") is None for r in arm):
        notes.append("future_leak and train_mode_val_loss were not recorded for these BatchNorm runs (null): the "
                     "claim is judged on the generalization gap alone")
    elif spec.measure == GAP and any(r["norm"] == "batch" for r in arm):
        notes.append(f"BatchNorm's mean future leak {_mean_of(arm, LEAK):.3g} and evaluation-minus-training-mode "
                     f"validation loss {_mean_of(arm, MODE_GAP):+.3g} against {_mean_of(base, LEAK):.3g} and "
                     f"{_mean_of(base, MODE_GAP):+.3g} (records batchnorm_leak and batchnorm_mode_gap)")
    notes += spec.remarks
    budget = _budget(arm, arm + base)
    unjudged = _unjudged(spec, arm_all + base_all, budget["val_bytes"], seeds, (arm_info, base_info))
    notes = [f"not judged: {why}" for why in unjudged] + notes
    bracketed = [info["lr_bracketed"] for info in (arm_info, base_info) if "lr_bracketed" in info]
    return dict(id=spec.id, source=spec.source, statement=spec.statement, preset=spec.preset, results=results,
                arm=_side(spec.arm, arm, arm_info, means[0]),
                baseline=_side(spec.baseline, base, base_info, means[1]),
                measure=spec.measure, direction=spec.direction, test=_test_name(spec, n), n_seeds=n, **budget,
                lr_bracketed=all(bracketed) if bracketed else None, judged=not unjudged,
                effect=_round(effect), ci=[_round(low), _round(high)] if low is not None else None, p=_round(p),
                mde=_round(mde), min_p=_round(min_p), published=_published(spec), command=_command(spec), notes=notes)


def _tuning_notes(spec: Spec, arm_info: dict, base_info: dict) -> list[str]:
    """How each side's setting was chosen, and where a best learning rate is not bracketed by its grid."""
    if not spec.tune:
        return []
    grids = (arm_info.get("lr_grid", ()), base_info.get("lr_grid", ()))
    if len(grids[0]) == 1 and len(grids[1]) == 1:
        return [f"one learning rate ({arm_info['lr']:g}) for both sides: neither is tuned"]
    seeds = {_seeds_text(info["chosen_with_seeds"]) for info in (arm_info, base_info)}
    over = (f"seeds {seeds.pop()}" if len(seeds) == 1 else
            f"seeds {_seeds_text(arm_info['chosen_with_seeds'])} (arm) and "
            f"{_seeds_text(base_info['chosen_with_seeds'])} (baseline)")
    over += ", those run at every setting"
    on = (f"the lowest mean final dev loss over {over}, on the dev split; the test split's bytes decide the effect, "
          "over every seed run at the chosen settings"
          if "test" not in (arm_info["chosen_on"], base_info["chosen_on"]) else
          f"the lowest mean final loss over {over}, on the same held-out bytes the test reads: no dev split")
    notes = [f"each side at its own best {' and '.join(spec.tune)} ({on})"]
    for side, info in (("arm", arm_info), ("baseline", base_info)):
        if not info.get("lr_bracketed", True):
            grid = "/".join(f"{v:g}" for v in info["lr_grid"])
            notes.append(f"the {side}'s best learning rate {info['lr']:g} is not inside its grid ({grid}): the grid "
                         "does not bracket its optimum")
    return notes


def _seeds_text(seeds) -> str:
    """'0-4' for a run of consecutive seeds, else '0, 2, 3'."""
    seeds = sorted(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def _mean_of(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else float("nan")


def _round(x: float | None) -> float | None:
    """12 significant digits: the file is byte-stable across platforms whose last bits differ."""
    return None if x is None else float(f"{x:.12g}")


def _rows(spec: Spec, results: Path, cache: dict) -> tuple[list[dict] | None, str]:
    """The runs a claim reads and their directory: its preset's, else (not committed yet) its legacy one's."""
    for name in (spec.preset, spec.legacy):
        if name and name not in cache:
            cache[name] = load_rows(results, name)
        if name and cache[name] is not None:
            return cache[name], name
    return None, spec.preset


def _outside(spec: Spec, times: Path) -> list[str]:
    """A note for a claim whose runs are outside the claim set that re-runs within ``BUDGET_CPU_HOURS``: what its
    preset costs, computed from the measured times in ``times`` (where that file is)."""
    if spec.needs or spec.preset in CLAIM_SET:
        return []
    cost = ""
    if times.exists():
        cost = (f": `{spec.preset}` takes {preset_cost(PRESETS[spec.preset], load_costs(times)).cpu_hours:.1f} "
                "CPU-hours, computed from measured per-step times")
    return [f"outside the {BUDGET_CPU_HOURS:g}-CPU-hour claim set ({', '.join(CLAIM_SET)}){cost}; its command "
            "makes its runs"]


def build(specs: tuple[Spec, ...] | None = None, results: Path = RESULTS) -> list[Claim]:
    """Every claim's record from the committed runs under ``results``, Holm-corrected across the judged ones."""
    specs = SPECS if specs is None else specs
    cache: dict[str, list[dict] | None] = {}
    times = Path(results).parent / "study_presets.json"  # the measured times budget.py prices a preset by
    records = [measure(s, *_rows(s, results, cache)) for s in specs]
    for s, r in zip(specs, records):
        r["notes"] = r["notes"] + _outside(s, times)
    tested = [i for i, r in enumerate(records) if r["p"] is not None and r["judged"]]
    adjusted = dict(zip(tested, holm([records[i]["p"] for i in tested])))
    out = []
    for i, r in enumerate(records):
        p_holm = _round(adjusted.get(i))
        v = verdict(r["effect"], p_holm, r["direction"]) if p_holm is not None else INCONCLUSIVE
        out.append(Claim(**{**r, "p_holm": p_holm, "verdict": v, "notes": r["notes"] + _interval_note(r, v)}))
    return out


def _interval_note(r: dict, v: str) -> list[str]:
    """A decided paired claim whose paired-t interval still holds 0: the two do not measure the same thing, and a
    reader seeing both must be told why (the sign-flip test counts signs of the differences; the t interval is
    widened by their spread, as a few failed runs' large differences widen it)."""
    if v == INCONCLUSIVE or r["measure"] == FAILURE or not r.get("ci") or not r["ci"][0] <= 0 <= r["ci"][1]:
        return []
    return ["the paired-t interval holds 0 while the sign-flip test rejects: the differences are heavy-tailed "
            "(a few large ones, such as failed runs' losses, widen the t interval; the permutation test, which the "
            "verdict rests on, does not assume normal differences)"]


def to_json(claims: list[Claim]) -> str:
    m = sum(c.p_holm is not None for c in claims)
    head = {"method": METHOD, "alpha": ALPHA, "power": POWER, "min_val_bytes": MIN_VAL_BYTES, "min_seeds": MIN_SEEDS,
            "holm_family": m,
            # the fewest seeds with which a loss claim can be decided at all once every claim of the file is judged:
            # its sign-flip p, with every seed of one sign, below Holm's first threshold alpha / len(claims)
            "seeds_to_decide": pairs_to_reach(ALPHA / len(claims)) if claims else None,
            # the seeds a tuned side's setting is chosen on, and those its claim's settings are run again at
            "selection_seeds": list(CLAIM_SEEDS), "confirmation_seeds": list(CONFIRM_SEEDS),
            "claims": [asdict(c) for c in claims]}
    return json.dumps(head, indent=1, ensure_ascii=False) + "\n"


_SEL, _CONF = f"{CLAIM_SEEDS[0]}-{CLAIM_SEEDS[-1]}", f"{CONFIRM_SEEDS[0]}-{CONFIRM_SEEDS[-1]}"
_ALL = len(CLAIM_SEEDS) + len(CONFIRM_SEEDS)
METHOD = ("Each claim compares an arm with its baseline in one results directory. Every final loss is measured on "
          "the held-out test split (at least 262,144 bytes, the same for every run, read whole), and a tuned side "
          "runs at its own best learning rate (and warmup) of the grid, chosen on the separate dev split by the "
          f"lowest mean final loss over seeds {_SEL}, the seeds run at every setting. Loss, gap and gain claims pair "
          "runs by seed (by learning rate and seed where a claim spans the grid) and test the mean paired "
          "difference with the exact two-sided sign-flip permutation test (every one of the 2^n sign vectors; "
          f"p >= 2/2^n, so {len(CLAIM_SEEDS)} seeds can never give p < 0.05); so the chosen settings, and the one "
          f"setting of each untuned side of a claim paired by seed, are run again at seeds {_CONF} (addnorm study "
          f"--confirm), and every claim paired by seed is tested on all {_ALL} seeds at those settings (p down to "
          f"2/2^{_ALL}). A claim pooled or paired over the grid reads only the seeds run at every one of its "
          "settings: the extra seeds neither change a choice nor weigh one setting more. The interval is the "
          "paired-t 95 % interval. Failure claims compare failure rates with Fisher's exact test (two-sided); the "
          "interval is Newcombe's. A claim is judged only where its final losses were measured on at least 262,144 "
          "held-out bytes, with 5 seeds or more, on one data split and with its learning rates chosen on the dev "
          "split; p_holm is Holm's step-down adjustment across the judged records. A judged claim is 'supported' or "
          "'contradicted' only where p_holm < 0.05 with the effect in (or against) its direction; a claim of no "
          "difference can only be contradicted; everything else is 'inconclusive'. mde is the smallest |effect| the "
          "paired t-test (noncentral t, the seeds' sd taken as the truth) or Fisher's test (exact binomial power) "
          "detects with 80 % power at alpha 0.05, before Holm: a lower bound on what this file could decide. "
          "effect = arm minus baseline.")


# ---- the claims ----------------------------------------------------------------------------------------------

_PRE = (("placement", "pre"), ("norm", "layer"), ("value_residual", False))
_PRE_GPT2 = (*_PRE, ("init", "gpt2"))  # the tuned baseline of the frontier claims: GPT-2 init (residual / sqrt(2L))
_POST_DIVERGES = Published("Post-LN diverges from the 250M model up (LLaMA-style models on C4)",
                           "LLaMA-style models of 71M to 1B parameters trained on C4", "2412.13795")
_MIXLN = Published("Mix-LN (Post-LN in the first layers, Pre-LN after) reaches a lower perplexity than Pre-LN",
                   "LLaMA-style models of 71M to 1B parameters trained on C4", "2412.13795")
_LNS = Published("LayerNorm Scaling reaches a 5-8 % lower perplexity than Pre-LN",
                 "models of 130M to 7B parameters", "2502.05795")
_DYT_SMALL = Published("DyT in place of the norm lowers the loss by 27 % at 1M training tokens",
                       "a 64M-parameter language model at 1M tokens", "2604.23434")
_DYT_LARGE = Published("DyT in place of the norm raises the loss by 19 % at 118M training tokens",
                       "small language models at 118M tokens", "2604.23434")
_MHC = Published("composite mixing gain (Amax gain magnitude of the product of H_res over depth): about 1.6 "
                 "(backward) for mHC, about 3000 for HC", "a 27B model (mHC's Sinkhorn with 20 rounds)", "2512.24880")
_SEED_000, _SEED_002, _SEED_003 = "000_3284b066540def01.txt", "002_1b45541e9a6140b9.txt", "003_5111ddd830dec81a.txt"


_DYT_PAPER = Published("Transformers with DyT match or exceed their normalized counterparts; the LLaMA code multiplies "
                       "the token embedding by a learnable scalar initialised to sqrt(d)", "LLaMA 7B-70B and others",
                       "2503.10622")
_SCALES = ((8.0, "sqrt(d_model) = 8", "sqrt_d"), (50.0, "1/0.02 = 50 (embeddings at RMS 1)", "unit_rms"))
_DYT_ALPHAS = ("0.5", "0.8/0.2/0.2")  # the cause arms' alpha0: DyT's default and the DyT paper's LLaMA values


def _embedding_scale_claims() -> tuple[Spec, ...]:
    """The dyt preset's cause arms, at each scale: for DyT and Derf, fewer failures with the scale than without
    (Fisher's test over every run of each side: both alpha0, both learning rates, 5 seeds); and DyT with the scale
    (the DyT paper's alpha0) against LayerNorm without one, each at its best learning rate, paired by seed."""
    out = []
    for scale, said, tag in _SCALES:
        for norm, name in (("dyt", "DyT"), ("derf", "Derf")):
            side = (("placement", "pre"), ("norm", norm), ("dyt_alpha", _DYT_ALPHAS))
            out.append(Spec(f"{norm}_cause_{tag}", "2503.10622", f"{name} fails (plateaus at the unigram loss) because "
                            f"the stream starts far below the norm's linear range: with the token embedding scaled by a "
                            f"learnable scalar starting at {said}, {name} fails less often than without it (alpha0 0.5 "
                            f"and 0.8/0.2/0.2, 6 layers).", "claims_dyt_cause", FAILURE, LOWER, (*side, ("embed_scale", scale)),
                            (*side, ("embed_scale", None)), published=_DYT_PAPER if tag == "sqrt_d" else None))
        out.append(Spec("dyt_embedding_scale" if tag == "sqrt_d" else "dyt_unit_rms", "2503.10622",
                        f"DyT (the DyT paper's alpha0 0.8/0.2/0.2) trains as LayerNorm does once the token embedding "
                        f"is scaled by a learnable scalar starting at {said}: it ends at the same validation loss as "
                        f"pre-LN without a scale.", "claims_dyt_cause", LOSS, SAME,
                        (("placement", "pre"), ("norm", "dyt"), ("dyt_alpha", "0.8/0.2/0.2"), ("embed_scale", scale)),
                        (*_PRE, ("embed_scale", None)), ("lr",), published=_DYT_PAPER if tag == "sqrt_d" else None))
    return tuple(out)


def _frontier(id_: str, source: str, statement: str, arm, published: Published | None, direction: str = LOWER,
              preset: str = "claims_frontier", baseline=_PRE_GPT2, tune=("lr",), legacy: str = "frontier") -> Spec:
    return Spec(id_, source, statement, preset, LOSS, direction, arm, baseline, tune, ("seed",), published,
                legacy=legacy)


_D6, _D12, _D48, _W100 = ("depth", 6), ("depth", 12), ("depth", 48), ("warmup", 100)

SPECS: tuple[Spec, ...] = (
    # the seeds' claims
    Spec("post_unstable", _SEED_003, "Pre-norm trains more stably than post-norm in a deep network: post-LN fails "
         "(a plateau at the unigram loss or a loss spike) more often at 24 layers, over the learning-rate grid.",
         "claims_frontier", FAILURE, HIGHER, (("placement", "post"),), _PRE, legacy="paper24"),
    Spec("post_warmup", _SEED_000, "Post-norm needs learning-rate warmup: without it, post-LN ends at a higher "
         "validation loss than with 100 warmup steps (the deciding contrast: post-LN without against with warmup, "
         "at each learning rate of the grid).", "claims_seeds", LOSS, HIGHER,
         (("placement", "post"), _D6, ("warmup", 0)), (("placement", "post"), _D6, _W100), (), ("lr", "seed"),
         legacy="study"),
    Spec("pre_warmup", _SEED_003, "Pre-norm does not need learning-rate warmup: pre-LN ends at the same validation "
         "loss without warmup as with 100 warmup steps, at each learning rate of the grid.", "claims_seeds", LOSS,
         SAME, (*_PRE, _D6, ("warmup", 0)), (*_PRE, _D6, _W100), (), ("lr", "seed"), legacy="study"),
    Spec("post_tuned", _SEED_003, "Post-norm can end slightly better than pre-norm with careful tuning: each at its "
         "own best learning rate and warmup, post-LN ends at a lower validation loss.", "claims_seeds", LOSS, LOWER,
         (("placement", "post"), _D6), (*_PRE, _D6), ("lr", "warmup"), legacy="study"),
    Spec("no_residual", _SEED_002, "Without the residual connection a deep network (12 layers) does not train: it "
         "fails more often than pre-LN.", "claims_seeds", FAILURE, HIGHER, (("placement", "no_residual"), _D12),
         (*_PRE, _D12), legacy="study_residual"),
    Spec("batchnorm", _SEED_002, "BatchNorm in place of LayerNorm trains but generalizes poorly: its generalization "
         "gap (validation minus training-split loss) is larger than LayerNorm's.", "claims_seeds", GAP, HIGHER,
         (("placement", "pre"), ("norm", "batch"), _D6, _W100), (*_PRE, _D6, _W100), ("lr",),
         legacy="study_norms"),
    Spec("batchnorm_mode_gap", _SEED_002, "BatchNorm generalizes poorly from training to evaluation: its model "
         "scores worse on validation bytes in evaluation mode (running statistics) than in training mode (the batch's "
         "statistics, the future included), a difference LayerNorm does not have (exactly 0).", "claims_seeds",
         MODE_GAP, HIGHER, (("placement", "pre"), ("norm", "batch"), _D6, _W100), (*_PRE, _D6, _W100),
         pair_by=("lr", "seed"), remarks=("effect = BatchNorm's evaluation-mode minus training-mode validation loss, LayerNorm's being 0",),
         legacy="study_norms"),
    Spec("batchnorm_leak", _SEED_002, "BatchNorm in a causal language model reads the future in training mode: "
         "changing the second half of a sequence changes the logits of its first half (future_leak > 0), where "
         "LayerNorm's are unchanged (exactly 0).", "claims_seeds", LEAK, HIGHER,
         (("placement", "pre"), ("norm", "batch"), _D6, _W100), (*_PRE, _D6, _W100), pair_by=("lr", "seed"),
         remarks=("future_leak: the largest change of any first-half logit, in training mode, when the bytes of the "
                  "second half are replaced",), legacy="study_norms"),
    Spec("rmsnorm", _SEED_003, "RMSNorm provides the same stabilization as LayerNorm: pre-norm with RMSNorm ends at "
         "the same validation loss as with LayerNorm.", "claims_seeds", LOSS, SAME,
         (("placement", "pre"), ("norm", "rms"), _D6, _W100), (*_PRE, _D6, _W100), ("lr",), legacy="study_norms"),
    # the frontier's: each form at its best learning rate against GPT-2-init pre-LN at its own, 24 layers
    _frontier("mixln", "2412.13795", "Mix-LN (post-norm in the first quarter of the layers) ends below pre-LN.",
              (("placement", "mix"),), _MIXLN),
    _frontier("lns", "2502.05795", "LayerNorm Scaling ends below pre-LN.", (("placement", "lns"),), _LNS),
    _frontier("denseformer", "2402.02622", "DenseFormer ends below pre-LN at the same depth.",
              (("placement", "denseformer"),),
              Published("DenseFormer reaches a lower perplexity than a standard transformer of the same depth and "
                        "size", "language models on OpenWebText2 and PG-19", "2402.02622")),
    _frontier("hybridnorm", "2503.04598", "HybridNorm (QKV norm in attention, post-norm in the FFN) ends below "
              "pre-LN, both at GPT-2 (Megatron) init.", (("placement", "hybrid"), ("init", "gpt2")),
              Published("HybridNorm outperforms both Pre-Norm and Post-Norm", "a 1.2B dense model (1T tokens) and "
                        "a 6.9B Mixture-of-Experts model (500B tokens)", "2503.04598")),
    _frontier("hybridnorm_star", "2503.04598", "HybridNorm* (HybridNorm with a post-norm first block) ends below "
              "pre-LN, both at GPT-2 (Megatron) init.", (("placement", "hybrid_star"), ("init", "gpt2")),
              Published("HybridNorm* outperforms both Pre-Norm and Post-Norm", "a 1.2B dense model (1T tokens) and "
                        "a 6.9B Mixture-of-Experts model (500B tokens)", "2503.04598")),
    _frontier("ngpt", "2410.01131", "nGPT ends below pre-LN at the same step budget (it trains faster).",
              (("placement", "ngpt"),),
              Published("nGPT reaches the same accuracy in 4 to 20 times fewer training steps than GPT",
                        "0.5B and 1B models on OpenWebText, contexts of 1k to 8k tokens", "2410.01131")),
    _frontier("value_residual", "2410.17897", "A value residual (every layer's values mixed with layer 1's) ends "
              "below pre-LN without one.", (("placement", "pre"), ("norm", "layer"), ("value_residual", True)),
              Published("ResFormer reaches the same validation loss with 16.11 % fewer parameters and 20.3 % less "
                        "training data", "language models (the paper's v5)", "2410.17897")),
    _frontier("derf", "2512.10938", "Derf in place of LayerNorm ends below pre-LN.",
              (("placement", "pre"), ("norm", "derf")),
              Published("Derf reaches 82.8 % ImageNet top-1 against LayerNorm's 82.3 %", "ViT on ImageNet",
                        "2512.10938")),
    _frontier("dyt", "2503.10622", "DyT (the DyT paper's per-slot alpha0 0.8/0.2/0.2) in place of LayerNorm ends at "
              "the same loss as pre-LN.", (("placement", "pre"), ("norm", "dyt"), ("dyt_alpha", "0.8/0.2/0.2")),
              Published("Transformers with DyT match or exceed their normalized counterparts, mostly without tuning",
                        "ViT, DiT, LLaMA 7B-70B and others", "2503.10622"), SAME),
    # the DyT/Derf audit's cause: the stream starts at RMS 0.03 (N(0, 0.02) embeddings), where tanh(alpha x) is
    # linear and far below LayerNorm's unit output; the DyT paper's LLaMA code scales the embedding by sqrt(d)
    *_embedding_scale_claims(),
    # depth: where each form stops training (48 layers, both learning rates pooled)
    Spec("post_depth", "2412.13795", "Post-LN stops training at 48 layers, where pre-LN keeps training: it fails more "
         "often.", "claims_depth", FAILURE, HIGHER, (("placement", "post"), _D48), (*_PRE, _D48),
         published=_POST_DIVERGES, legacy="depth"),
    *(Spec(f"{form}_depth", arxiv, f"{name} keeps training at 48 layers as pre-LN does: it fails as often.",
           "claims_depth", FAILURE, SAME, (("placement", form), _D48), (*_PRE, _D48), legacy="depth")
      for form, name, arxiv in (("deepnorm", "DeepNorm", "2203.00555"), ("mix", "Mix-LN", "2412.13795"),
                                ("lns", "LayerNorm Scaling", "2502.05795"))),
    # the mixing gains
    Spec("hc_gain_depth", "2512.24880", "HC's composite mixing gain grows with depth: its peak forward gain over "
         "training is larger at 24 layers than at 6.", "claims_mixing", GAIN_FWD, HIGHER,
         (("placement", "hc"), ("depth", 24)), (("placement", "hc"), _D6), published=_MHC, legacy="mixing",
         remarks=("the peak over training, not the last evaluation (HC's gain falls again late in training); the "
                  "paper's 3000 is at 27B parameters (these runs' counts are in arm and baseline)",)),
    Spec("mhc_gain", "2512.24880", "mHC keeps the composite mixing gain near 1 where HC's grows: at 24 layers mHC's "
         "peak backward gain over training is below HC's.", "claims_mixing", GAIN_BWD, LOWER,
         (("placement", "mhc"), ("depth", 24)), (("placement", "hc"), ("depth", 24)), published=_MHC,
         legacy="mixing",
         remarks=("backward (column sums) because mHC's forward gain is 1 by construction: Sinkhorn's last step "
                  "normalizes rows, and a product of row-stochastic matrices has every row sum 1; the backward gain "
                  "is what the paper's 1.6 measures (finite Sinkhorn rounds leave the columns off 1)",)),
    # budgets and widths: DyT's sign flip, and the frontier forms 20 times longer (long) and 4 times wider (wide)
    _frontier("dyt_budget", "2604.23434", "DyT in place of LayerNorm ends below pre-LN at a small token budget "
              "(512k tokens, 24 layers).", (("placement", "pre"), ("norm", "dyt"), ("dyt_alpha", "0.5")),
              _DYT_SMALL, LOWER, "claims_dyt_budget", _PRE, legacy="paper24"),
    _frontier("dyt_long", "2604.23434", "DyT in place of LayerNorm ends above pre-LN at a larger token budget (up to "
              "10M tokens, 6 layers, trained until flat).", (("placement", "pre"), ("norm", "dyt")), _DYT_LARGE,
              HIGHER, "claims_long", _PRE, legacy="long"),
    *(_frontier(f"{form}_{where}", arxiv, f"{name} ends below pre-LN {text}.", (("placement", form),), pub,
                LOWER, f"claims_{where}", _PRE, legacy=where)
      for where, text in (("long", "at a 20 times longer token budget (6 layers, trained until flat)"),
                          ("wide", "at four times the width (d_model 256, 12 layers)"))
      for form, name, arxiv, pub in (("mix", "Mix-LN", "2412.13795", _MIXLN),
                                     ("lns", "LayerNorm Scaling", "2502.05795", _LNS),
                                     ("mhc", "mHC (4 streams)", "2512.24880", None))),
    Spec("post_wide", "2412.13795", "Post-LN stops training at d_model 256 (12 layers), where pre-LN trains: it fails "
         "more often.", "claims_wide", FAILURE, HIGHER, (("placement", "post"),), _PRE, published=_POST_DIVERGES,
         legacy="wide"),
)


def main(argv: list[str] | None = None) -> int:
    args = parse_results_and_out("claims", "Write the study's claims file from the committed runs.", "claims.json",
                                 argv)
    claims = build(results=args.results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(to_json(claims), encoding="utf-8")
    counts = {v: sum(c.verdict == v for c in claims) for v in dict.fromkeys(c.verdict for c in claims)}
    print(f"{args.out}: {len(claims)} claims ({', '.join(f'{n} {v}' for v, n in counts.items())})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
