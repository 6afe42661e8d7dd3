"""The study's tables, from its rows (one dict per finished run, as ``experiments.study.grid`` writes them):
seeds pooled per setting with percentile bootstrap intervals (nominal 95 %), token budgets, differences against
pre-LN, and the learning rates at which each setting trains. Pure functions of the rows; summary.md is
``markdown(study)``."""

from __future__ import annotations

from .study_stats import (ALPHA, RESAMPLES, UNDECIDED, Interval, bootstrap_mean, call, failure_call,
                          paired_difference, unpaired_difference)

# a setting: every axis but the seed. The first seven are always columns; the rest only where they vary.
BASE_AXES = ("placement", "norm", "depth", "lr", "warmup", "clip", "init")
EXTRA_AXES = ("d_model", "steps", "n_streams", "value_residual", "dyt_alpha", "embed_scale")
SETTING_AXES = BASE_AXES + EXTRA_AXES
BASELINE = {"placement": "pre", "norm": "layer", "n_streams": None, "value_residual": False, "dyt_alpha": "0.5",
            "embed_scale": None}


def axis(r: dict, name: str):
    """A row's value on an axis (rows written before the frontier axes existed: their defaults)."""
    return r.get(name, {"d_model": 64, "n_streams": None, "value_residual": False, "dyt_alpha": "0.5",
                        "steps": None, "embed_scale": None}.get(name))


def setting(r: dict) -> tuple:
    return tuple(axis(r, a) for a in SETTING_AXES)


def varying(rows: list[dict], axes=EXTRA_AXES) -> list[str]:
    return [a for a in axes if len({axis(r, a) for r in rows}) > 1]


def _ok(rs: list[dict], field: str) -> list[float]:
    """The values of ``field`` of the runs that trained (a failed run has no final loss to average)."""
    return [r[field] for r in rs if not r["failed"] and _finite(r.get(field))]


def _finite(v) -> bool:
    return isinstance(v, int | float) and v == v and abs(v) != float("inf")


def _ci(values: list[float]) -> Interval | None:
    return bootstrap_mean(values) if values else None


def _span(values: list[float]) -> tuple[float | None, float | None]:
    return (min(values), max(values)) if values else (None, None)


def groups(rows: list[dict]) -> list[dict]:
    """Seeds pooled, per setting: failures, the mean final validation loss and generalization gap of the runs
    that trained with their percentile bootstrap intervals (nominal 95 %), and the tokens each run saw (and per
    parameter)."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault(setting(r), []).append(r)
    out = []
    for key, rs in by.items():
        val, gap = _ci(_ok(rs, "final_val_loss")), _ci(_ok(rs, "generalization_gap"))
        trained = [r for r in rs if not r["failed"]] or rs  # the budget of the runs that trained, else of all
        tokens = [r["tokens_seen"] for r in trained if r.get("tokens_seen") is not None]
        per_param = [r["tokens_seen"] / r["n_params"] for r in trained if r.get("tokens_seen") is not None
                     and r.get("n_params")]
        lo, hi = _span(_ok(rs, "final_val_loss"))
        out.append({**dict(zip(SETTING_AXES, key)), "seeds": len(rs), "failures": sum(r["failed"] for r in rs),
                    "failure_kinds": sorted({r["failure"] for r in rs if r["failed"]}),
                    "too_short": sum(bool(r.get("too_short")) for r in rs),  # on the plateau, on a short budget
                    "val_loss_mean": val and val.mean, "val_loss_low": val and val.low,
                    "val_loss_high": val and val.high, "val_loss_min": lo, "val_loss_max": hi,
                    "gap_mean": gap and gap.mean, "gap_low": gap and gap.low, "gap_high": gap and gap.high,
                    "tokens_seen_min": min(tokens) if tokens else None, "tokens_seen_max": max(tokens) if tokens else None,
                    "n_params": rs[0].get("n_params"),
                    "tokens_per_param_min": min(per_param) if per_param else None,
                    "tokens_per_param_max": max(per_param) if per_param else None})
    return out


def _baseline_key(g: dict) -> tuple:
    return tuple(BASELINE.get(a, g[a]) for a in SETTING_AXES)


def _difference(a: dict, b: dict) -> tuple[Interval | None, bool | None]:
    """(mean(a) - mean(b) with its interval, paired?) of {seed: value}: paired by seed where both sides have the
    same seeds (at least 2), else unpaired; None where a side is empty."""
    if set(a) == set(b) and len(a) >= 2:
        seeds = sorted(a)
        return paired_difference([a[s] for s in seeds], [b[s] for s in seeds]), True
    if a and b:
        return unpaired_difference(list(a.values()), list(b.values())), False
    return None, None


def _by_seed(rs: list[dict], field: str) -> dict:
    return {r["seed"]: r[field] for r in rs if not r["failed"] and _finite(r.get(field))}


def pairwise(rows: list[dict]) -> list[dict]:
    """Each setting against pre-LN (pre-norm, LayerNorm, one stream, no value residual) at the same depth,
    width, learning rate, warmup, clipping, init and step budget: the difference of final validation losses
    (setting - pre) of the runs that trained, paired by seed where both trained on the same seeds (a seed fixes
    the initialisation stream and the batch order), else unpaired; its interval, and the call. Likewise the
    difference of generalization gaps (validation minus training split: 'larger gap' / 'smaller gap'). Beside
    them, the failure counts compared by Fisher's exact test (two-sided), called ('fails more' / 'fails less')
    only at p < ALPHA -- a bootstrap of 0/1 outcomes gives 3/3 against 0/3 a zero-width interval."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault(setting(r), []).append(r)
    out = []
    for key, rs in by.items():
        g = dict(zip(SETTING_AXES, key))
        base = by.get(_baseline_key(g))
        if base is None or base is rs:
            continue
        diff, paired = _difference(_by_seed(rs, "final_val_loss"), _by_seed(base, "final_val_loss"))
        gap, gap_paired = _difference(_by_seed(rs, "generalization_gap"), _by_seed(base, "generalization_gap"))
        failures, pre_failures = sum(r["failed"] for r in rs), sum(r["failed"] for r in base)
        p, fail_call = failure_call(failures, len(rs), pre_failures, len(base))
        gap_call = {"better": "smaller gap", "worse": "larger gap"}.get(call(gap), UNDECIDED) if gap else \
            "no gap to compare"
        out.append({**g, "failures": failures, "seeds": len(rs), "pre_failures": pre_failures, "pre_seeds": len(base),
                    "diff_mean": diff and diff.mean, "diff_low": diff and diff.low, "diff_high": diff and diff.high,
                    "paired": paired, "call": call(diff) if diff else "no loss to compare (every run failed)",
                    "gap_diff_mean": gap and gap.mean, "gap_diff_low": gap and gap.low,
                    "gap_diff_high": gap and gap.high, "gap_paired": gap_paired, "gap_call": gap_call,
                    "fail_diff_mean": failures / len(rs) - pre_failures / len(base), "fail_p": p,
                    "fail_call": fail_call})
    return out


def p_text(p: float) -> str:
    """Fisher's p as a report prints it: 'p = 0.100', 'p < 0.001'."""
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


# ---- formatting

def interval_text(mean: float | None, low: float | None, high: float | None, fmt: str = "{:.3f}") -> str:
    """'2.540 [2.494, 2.575]'; the mean alone where there is no interval (one run); '—' where there is no mean."""
    if mean is None:
        return "—"
    text = fmt.format(mean)
    return text if low is None else f"{text} [{fmt.format(low)}, {fmt.format(high)}]"


def tokens_text(n: float) -> str:
    """524288 -> '524k', 1.2e8 -> '120M'."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:g}"


def budget_text(g: dict) -> tuple[str, str]:
    """(tokens seen, tokens per parameter) of a group: one value, or the range where runs stopped apart."""
    if g["tokens_seen_min"] is None:
        return "—", "—"
    t = tokens_text(g["tokens_seen_min"])
    if g["tokens_seen_max"] != g["tokens_seen_min"]:
        t += f"–{tokens_text(g['tokens_seen_max'])}"
    if g["tokens_per_param_min"] is None:
        return t, "—"
    p = f"{g['tokens_per_param_min']:.2g}"
    if g["tokens_per_param_max"] != g["tokens_per_param_min"]:
        p += f"–{g['tokens_per_param_max']:.2g}"
    return t, p


def axis_text(name: str, v) -> str:
    if name == "value_residual":
        return "on" if v else "off"
    if name == "embed_scale" and v is None:
        return "off"
    if v is None:
        return "—"
    return f"{v:g}" if isinstance(v, float) else str(v)


_VARIANT_AXES = (("norm", "{}"), ("depth", "L{}"), ("d_model", "d{}"), ("steps", "{} steps"), ("warmup", "warmup {}"),
                 ("init", "{} init"), ("clip", "clip {:g}"), ("n_streams", "n={}"), ("value_residual", "vr {}"),
                 ("dyt_alpha", "α {}"), ("embed_scale", "embedding ×{}"))


def variants(rows: list[dict], without: tuple[str, ...] = ()) -> dict[int, str]:
    """{id(row): label}: the row's placement, plus every other axis that varies across ``rows`` (except
    ``without``) -- a figure's line or panel, so that runs that differ in norm, depth, warmup, init or clipping
    are never drawn as one. Which axes vary is found once for all the rows."""
    varying_ = [(a, fmt) for a, fmt in _VARIANT_AXES if a not in without and len({axis(r, a) for r in rows}) > 1]
    return {id(r): " ".join([r["placement"], *(fmt.format(axis_text(a, axis(r, a)) if a in ("value_residual",
                                                          "embed_scale") else axis(r, a)) for a, fmt in varying_)])
            for r in rows}


def lr_range(rows: list[dict]) -> dict | None:
    """Seeds pooled, per placement (and every other axis that varies) and learning rate: the mean final
    validation loss of the runs that trained with its interval, how many failed, and the learning rates at which
    every seed trained. None when the grid has one learning rate."""
    lrs = sorted({r["lr"] for r in rows})
    if len(lrs) < 2:
        return None
    line_of = variants(rows, without=("lr",))
    order = list(dict.fromkeys(line_of[id(r)] for r in rows))  # the grid's own order
    settings = []
    for v in order:
        cells, every = [], []
        for lr in lrs:
            rs = [r for r in rows if line_of[id(r)] == v and r["lr"] == lr]
            ci = _ci(_ok(rs, "final_val_loss"))
            cells.append({"lr": lr, "runs": len(rs), "failed": sum(r["failed"] for r in rs),
                          "mean": ci and ci.mean, "low": ci and ci.low, "high": ci and ci.high})
            if rs and not any(r["failed"] for r in rs):
                every.append(lr)
        settings.append({"setting": v, "cells": cells, "trained_every_seed": every})
    return {"lrs": lrs, "settings": settings}


def cell_text(c: dict, mean: str | None = None) -> str:
    """``mean`` (the formatted mean and interval, or markup around them) with the failures: '2.600 [2.5, 2.7]',
    '3.000 (1 of 2 failed)', 'failed (2 of 2)', or '' where the grid has no run."""
    if not c["runs"]:
        return ""
    if c["mean"] is None:
        return f"failed ({c['failed']} of {c['runs']})"
    text = mean if mean is not None else interval_text(c["mean"], c.get("low"), c.get("high"))
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


INTERVAL_NOTE = (f"[low, high]: the percentile bootstrap interval (nominal 95 %) of the mean over seeds "
                 f"(report/study_stats.py: every resample enumerated up to 5 seeds, {RESAMPLES} seeded draws beyond). "
                 "A mean of one run has no interval. With 3 seeds the interval is the min–max range (a 75 % interval; "
                 "at 5 seeds it covers about 83 % for normal losses), so a paired difference is called whenever the 3 "
                 "seeds agree in sign -- which noise alone does 1 time in 4: a call from 3 seeds is a lead, not a "
                 "finding; 5 seeds (the frontier preset) narrow the interval inside the range. Failure counts are "
                 f"compared by Fisher's exact test (two-sided), called only at p < {ALPHA:g}: 3 of 3 failed against 0 "
                 "of 3 gives p = 0.1, not called. The tested verdicts (exact tests, Holm-corrected) are in "
                 "benchmarks/results/study/claims.json.")


def too_short_text(g: dict) -> str:
    """A group's runs too short to judge, with their budget."""
    return f"{g['too_short']} too short to judge ({g['steps']} steps)"


def too_short_note(study: dict) -> str:
    n = sum(bool(r.get("too_short")) for r in study["runs"])
    least = study.get("judged_from")
    return (f"Too short to judge: {n} run{'s' if n != 1 else ''} ended on the unigram plateau on a budget where "
            f"every setting, pre-norm LayerNorm included, is still on it"
            + (f" (under {least} steps)" if least else "") + "; not counted as failed. "
            + (f"Give --steps {least} or more to judge them." if least else ""))


def group_columns(groups_: list[dict]) -> list[str]:
    return list(BASE_AXES) + varying(groups_)


def markdown(study: dict) -> str:
    gs = study["groups"]
    cols = group_columns(gs)
    lines = [f"# Study: {study['grid']}", "", f"Data: {study['corpus']}; unigram plateau "
             f"{study['unigram_nats']:.3f} nats (validation bytes under the training bytes' frequencies).", "",
             "| " + " | ".join(cols) + " | failed / seeds | final val loss (runs that trained) | val − train "
             "| tokens seen | tokens / parameter |", "|---|" + "---|" * (len(cols) + 4)]
    for g in gs:
        kinds = f" ({', '.join(g['failure_kinds'])})" if g["failure_kinds"] else ""
        kinds += f"; {too_short_text(g)}" if g.get("too_short") else ""
        tokens, per_param = budget_text(g)
        lines.append("| " + " | ".join(axis_text(c, g[c]) for c in cols) + f" | {g['failures']} / {g['seeds']}{kinds} "
                     f"| {interval_text(g['val_loss_mean'], g['val_loss_low'], g['val_loss_high'])} "
                     f"| {interval_text(g['gap_mean'], g['gap_low'], g['gap_high'], '{:+.3f}')} | {tokens} | {per_param} |")
    lines += ["", "val − train: the final validation loss minus the training split's, both in evaluation mode on "
              "fixed batches (the generalization gap; mean of the runs that trained). Tokens seen: steps done × "
              "batch × sequence length, per run; tokens / parameter: that over the model's parameter count.",
              "", INTERVAL_NOTE]
    if any(g.get("too_short") for g in gs):
        lines += ["", too_short_note(study)]
    lines += pairwise_table(study.get("pairwise", []), cols)
    lines += lr_range_table(study["runs"])
    if study["missing"]:
        lines += ["", f"Not finished yet (another shard, or interrupted): {len(study['missing'])} runs."]
    return "\n".join(lines) + "\n"


def pairwise_table(pairs: list[dict], cols: list[str]) -> list[str]:
    if not pairs:
        return []
    shown = [c for c in cols if c != "placement"]
    lines = ["", "## Against pre-LN at the same setting", "",
             "Final validation loss of the setting minus pre-norm LayerNorm's at the same depth, learning rate, "
             "warmup and budget, over the runs that trained (paired by seed where both trained on the same seeds). "
             "Called better or worse only where the 95 % interval excludes 0. The failure counts are compared by "
             f"Fisher's exact test (two-sided) and called only at p < {ALPHA:g} (share failed: the setting's minus "
             "pre's; +1.00: every run of the setting failed and none of pre's).", "",
             "| placement | " + " | ".join(shown) + " | failed (setting / pre) | share failed, difference (Fisher) | "
             "failures | loss difference [95 % interval] | paired | loss | gap (val − train) difference | gap |",
             "|---|" + "---|" * (len(shown) + 8)]
    for d in pairs:
        paired = "—" if d["paired"] is None else ("yes" if d["paired"] else "no")
        lines.append(f"| {d['placement']} | " + " | ".join(axis_text(c, d[c]) for c in shown)
                     + f" | {d['failures']}/{d['seeds']} / {d['pre_failures']}/{d['pre_seeds']} "
                     f"| {d['fail_diff_mean']:+.2f} ({p_text(d['fail_p'])}) "
                     f"| {d['fail_call']} "
                     f"| {interval_text(d['diff_mean'], d['diff_low'], d['diff_high'], '{:+.3f}')} | {paired} "
                     f"| {d['call']} "
                     f"| {interval_text(d.get('gap_diff_mean'), d.get('gap_diff_low'), d.get('gap_diff_high'), '{:+.3f}')} "
                     f"| {d.get('gap_call', '—')} |")
    return lines
