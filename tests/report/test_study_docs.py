"""docs/study.md's presets section against the code and the committed timings: one table holding every preset,
and the two-shard times it gives equal to benchmarks/results/study_presets.json's computed totals."""

import json
import re
from pathlib import Path

from addnorm.experiments.study.config import PRESETS

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "benchmarks" / "results" / "study"
DOC = (ROOT / "docs" / "study.md").read_text(encoding="utf-8")


def test_the_presets_table_is_one_table_with_every_preset():
    """A blank line inside a markdown table ends it: the rows after it render as plain text."""
    lines = DOC.splitlines()
    start = lines.index("| preset | grid | time on 2 cores |")
    table = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        table.append(line)
    names = [re.match(r"\| `([a-z0-9_]+)` \|", row).group(1) for row in table]
    assert set(names) == set(PRESETS), (names, sorted(PRESETS))


def test_the_two_shard_times_match_the_measured_per_step_times_and_say_what_was_not_run():
    presets = json.loads((ROOT / "benchmarks" / "results" / "study_presets.json").read_text())
    text = " ".join(DOC.split())
    for name in ("frontier", "depth", "long", "wide"):
        hours = round(presets[name]["computed_total_s"] / 3600 / 2, 1)  # two one-thread shards on 2 cores
        assert re.search(rf"{hours:g} h for `{name}`", text), (name, hours)
    assert "fits a night on 2 cores when split" in text and "None of `frontier`, `long` or `wide` fits" not in text
    # what was run is said, and what was not: depth's results are committed, the other three not
    assert (ROOT / "benchmarks" / "results" / "study" / "depth" / "summary.json").exists()
    assert "`depth` has since been run whole" in text
    # frontier is finished over several sittings (its run summaries committed as they finish): the docs say how
    # far it is, as its committed summary.json has it; long is partly run (its run summaries committed, its
    # merged summary.json not written until it finishes), wide not at all
    frontier = ROOT / "benchmarks" / "results" / "study" / "frontier" / "summary.json"
    if frontier.exists():
        study = json.loads(frontier.read_text())
        done, total = len(study["runs"]), len(study["runs"]) + len(study["missing"])
        assert (f"{done} of its {total} runs are committed" in text) == bool(study["missing"]), (done, total)
    else:
        assert "**`frontier`, `long` and `wide` have not been run**" in text
    # long is run whole and reported; wide is partly run (its finished runs' summaries committed, no report yet)
    long = json.loads((STUDY / "long" / "summary.json").read_text())
    assert len(long["runs"]) == 27 and not long["missing"] and "`long` has been run whole" in text
    wide_done = len(list((STUDY / "wide" / "runs").glob("*/summary.json")))
    if (STUDY / "wide" / "summary.json").exists():  # finished and reported
        wide = json.loads((STUDY / "wide" / "summary.json").read_text())
        assert len(wide["runs"]) == 24 and not wide["missing"] and "`wide` has been run whole" in text
    elif wide_done:
        assert f"**`wide` is partly run: {wide_done} of its 24 runs are committed**" in text
    else:
        assert "**`wide` has not been run**" in text
    assert "for preset in frontier long wide; do" in DOC  # the exact sharded commands for what is left
    assert "--preset $preset --out benchmarks/results/study/$preset --shard 1/2" in DOC


def test_the_hybridnorm_table_is_what_the_committed_runs_hold():
    """docs/study.md's HybridNorm table, recomputed from the committed frontier run summaries."""
    from addnorm.report.study_stats import bootstrap_mean

    runs_dir = ROOT / "benchmarks" / "results" / "study" / "frontier" / "runs"
    rows: dict = {}
    for f in runs_dir.glob("*/summary.json"):
        s = json.loads(f.read_text())
        c = s["config"]
        if c["placement"] in ("pre", "post", "hybrid", "hybrid_star") and c["norm"] == "layer" \
                and not c.get("value_residual"):
            rows.setdefault((c["init"], c["lr"], c["placement"]), []).append(s)

    def cell(rs):
        ok = [r["final_val_loss"] for r in rs if not r["failed"]]
        if len(ok) >= 2:
            b = bootstrap_mean(ok)
            loss = f"{b.mean:.3f} [{b.low:.3f}, {b.high:.3f}]"
        else:
            loss = f"{ok[0]:.3f} (one run)" if ok else "—"
        return f"{loss}; failed {sum(r['failed'] for r in rs)}/{len(rs)}"

    table = DOC[DOC.index("<!-- hybridnorm-table:start -->"):DOC.index("<!-- hybridnorm-table:end -->")]
    for init in ("xavier", "gpt2"):
        for lr in (0.001, 0.003):
            line = f"| {init} | {lr:g} | " + " | ".join(cell(rows[(init, lr, p)])
                                                        for p in ("pre", "post", "hybrid", "hybrid_star")) + " |"
            assert line in table, line


LONG_ORDER = ("post", "pre", "sandwich", "deepnorm", "mix", "layerscale", "lns", "mhc", "pre dyt")
WIDE_ORDER = ("post", "pre", "sandwich", "deepnorm", "mix", "layerscale", "lns", "mhc")


def long_table(results: Path = STUDY / "long", order: tuple[str, ...] = LONG_ORDER) -> str:
    """docs/study.md's `long` (or `wide`) table, from the committed run summaries (however many there are), with
    the difference from pre-LN and its call from the preset's summary.json once the preset has been reported."""
    rows: dict = {}
    for f in sorted((results / "runs").glob("*/summary.json")):
        s = json.loads(f.read_text())
        c = s["config"]
        name = c["placement"] + (" dyt" if c["norm"] == "dyt" else "")
        rows.setdefault(name, []).append(s)
    report = results / "summary.json"
    pairs = {}
    if report.exists():
        for d in json.loads(report.read_text())["pairwise"]:
            pairs[d["placement"] + (" dyt" if d["norm"] == "dyt" else "")] = d
    lines = ["| placement | runs recorded (of 3) | failed | flattened | steps | tokens seen | tokens / parameter | "
             "final validation loss (runs that trained) | minus pre-LN's [95 % interval] |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in order:
        rs = rows.get(name, [])
        if not rs:
            lines.append(f"| {name} | 0 | — | — | — | — | — | not run yet | — |")
            continue
        ok = [r["final_val_loss"] for r in rs if not r["failed"]]
        loss = (f"{sum(ok) / len(ok):.3f} (min {min(ok):.3f}, max {max(ok):.3f})" if len(ok) > 1
                else f"{ok[0]:.3f}" if ok else "—")
        d = pairs.get(name)
        diff = ("(the baseline)" if name == "pre" else
                f"{d['diff_mean']:+.3f} [{d['diff_low']:+.3f}, {d['diff_high']:+.3f}]: {d['call']}"
                if d is not None and d["diff_low"] is not None else "—")
        steps = sorted({r["steps_done"] for r in rs})
        tokens = sorted({r["tokens_seen"] for r in rs})
        tpp = sorted({float(f'{r["tokens_seen"] / r["n_params"]:.3g}') for r in rs})
        lines.append(f"| {name} | {len(rs)} | {sum(r['failed'] for r in rs)} | {sum(bool(r['flattened']) for r in rs)} | "
                     f"{', '.join(map(str, steps))} | {', '.join(f'{t / 1e6:.2f}M' for t in tokens)} | "
                     f"{', '.join(f'{t:g}' for t in tpp)} | {loss} | {diff} |")
    return "\n".join(lines)


def test_the_long_and_wide_tables_are_what_the_committed_runs_hold():
    start, end = "<!-- long-table:start -->\n", "\n<!-- long-table:end -->"
    assert DOC[DOC.index(start) + len(start):DOC.index(end)] == long_table()
    if list((STUDY / "wide" / "runs").glob("*/summary.json")):
        start, end = "<!-- wide-table:start -->\n", "\n<!-- wide-table:end -->"
        assert DOC[DOC.index(start) + len(start):DOC.index(end)] == long_table(STUDY / "wide", WIDE_ORDER)


if __name__ == "__main__":
    print(long_table())
    print()
    print(long_table(STUDY / "wide", WIDE_ORDER))


def test_the_claims_presets_hours_are_the_budgets_computation():
    """Each claims preset's row and the compute section state the CPU-hours budget.py computes from the committed
    measured times, and the claim set's total."""
    from addnorm.experiments.study.budget import CLAIM_SET, load_costs, preset_cost

    costs = load_costs(ROOT / "benchmarks" / "results" / "study_presets.json")
    hours = {p: preset_cost(PRESETS[p], costs).cpu_hours for p in PRESETS if p.startswith("claims_")}
    rows = {re.match(r"\| `([a-z0-9_]+)` \|", line).group(1): line for line in DOC.splitlines()
            if re.match(r"\| `claims_[a-z_]+` \|", line)}
    assert set(rows) == set(hours)
    for p, h in hours.items():
        assert f"{h:.2f} CPU-hours" in rows[p], (p, h)
    total = sum(hours[p] for p in CLAIM_SET)
    assert f"make **{total:.2f} CPU-hours, {total / 2:.1f} h as two one-thread" in " ".join(DOC.split())


def test_the_confirmation_runs_cost_is_stated_beside_each_claims_preset_and_in_the_claim_sets_total():
    """Each claims preset with a claim paired by seed states what its confirmation runs (`--confirm`) cost at most,
    and the compute section the claim set's total with them."""
    from addnorm.experiments.study import confirm
    from addnorm.experiments.study.budget import CLAIM_SET, load_costs, preset_cost

    costs = load_costs(ROOT / "benchmarks" / "results" / "study_presets.json")
    rows = {re.match(r"\| `([a-z0-9_]+)` \|", line).group(1): line for line in DOC.splitlines()
            if re.match(r"\| `claims_[a-z_]+` \|", line)}
    extra = {}
    for p in rows:
        most = confirm.most(p)
        extra[p] = preset_cost(most, costs) if most is not None else None
        said = f"at most {extra[p].runs} confirmation runs" if extra[p] else "confirmation runs"
        assert (said in rows[p]) == (extra[p] is not None), p
        if extra[p]:
            assert f"{extra[p].cpu_hours:.2f} CPU-hours computed |" in rows[p], p
    total = sum(preset_cost(PRESETS[p], costs).cpu_hours + extra[p].cpu_hours for p in CLAIM_SET)
    text = " ".join(DOC.split())
    assert f"at most **{total:.2f} CPU-hours, {total / 2:.1f} h as two one-thread shards**" in text
    assert "chosen on the dev split with seeds 0–4" in text and "run again at seeds 5–10" in text
