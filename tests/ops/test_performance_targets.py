"""docs/performance.md's targets table ("The targets") is the committed benchmark results read against the
targets set when the fused forms were added, regenerated here from the JSON: a claim of "met" in the docs cannot
outlive the numbers.

The targets, on the 2-core machine the results come from:

- each new op (norm_add, parallel, parallel2, dyt, derf, stream_read, stream_write, mhc_pre) at 8192×1024, every dtype:
  forward ≥ 0.85 of the copy floor, forward+backward ≥ 0.75, ≥ 1.5× eager both ways, faster than compile both
  ways (a ratio that rounds to 1.00× is a tie, not faster);
- bfloat16, the existing Add & Norm ops too, on every instruction-set path (AVX-512 native, AVX2 via
  ``ADDNORM_CPU_ISA=avx2``): forward ≥ 0.85 of the floor, forward+backward ≥ 0.75;
- 64×768, every op: forward and forward+backward no slower than eager (≥ 1.00× as rounded); these cells come
  from ``benchmarks/results/small_calls/`` (one run per instruction-set path, every op).

Numbers are compared as the tables print them (two decimals). ``python tests/ops/test_performance_targets.py``
prints the table to paste between the markers.
"""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
NEW_OPS = ("norm_add", "parallel", "parallel2", "dyt", "derf", "stream_read", "stream_write", "mhc_pre")
BIG, SMALL = (8192, 1024), (64, 768)


def _cells(path: Path, isa: str) -> dict:
    """(isa, op, kind, dtype, rows, hidden) -> {mode: {method: median_ms, "floor": frac_of_floor}}."""
    out = {}
    for r in json.loads(path.read_text())["rows"]:
        key = (isa, r.get("op", "add_norm"), r["kind"], r["dtype"], r["rows"], r["hidden"])
        cell = out.setdefault(key, {}).setdefault(r["mode"], {})
        cell[r["method"]] = r["median_ms"]
        if r["method"] == "addnorm":
            cell["floor"] = r["frac_of_floor"]
    return out


def _mark(value, target, strict=False):
    if value is None:
        return "-", None
    v = round(value, 2)
    ok = v > target if strict else v >= target
    return f"{v:.2f} {'✓' if ok else '✗'}", ok


def _plain(value):
    return "-" if value is None else f"{round(value, 2):.2f}"


def targets_markdown() -> str:
    # every cell from one machine, one run per instruction-set path: 8192×1024 in intel/, 64×768 (measured after
    # the C++ autograd nodes) in small_calls/
    cells = {}
    for root in ("intel", "small_calls"):
        for sub, isa in (("", "AVX-512"), ("avx2", "AVX2")):
            for name in ("fused_forms_tuned.json", "add_norm_tuned.json"):
                cells.update(_cells(RESULTS / root / sub / name, isa))
    head = ["ISA", "op", "norm", "dtype", "shape", "fwd floor", "fwdbwd floor", "fwd vs eager", "fwdbwd vs eager",
            "fwd vs compile", "fwdbwd vs compile", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = {op: i for i, op in enumerate(NEW_OPS + ("add_norm",))}
    keys = [k for k in cells if (k[4], k[5]) in (BIG, SMALL)]
    keys.sort(key=lambda k: ((k[4], k[5]) != BIG, k[0] != "AVX-512", order[k[1]], k[2], k[3] != "float32"))
    for key in keys:
        isa, op, kind, dtype, n, d = key
        new, big = op in NEW_OPS, (n, d) == BIG
        if big and not new and dtype != "bfloat16":
            continue  # no target for the existing ops in float32 at this size
        modes = cells[key]
        floor = {m: modes.get(m, {}).get("floor") for m in ("fwd", "fwdbwd")}
        ratio = {(m, k): (modes[m][k] / modes[m]["addnorm"] if m in modes and k in modes[m] else None)
                 for m in ("fwd", "fwdbwd") for k in ("eager", "compile")}
        cols, missed, unmeasured = [], [], []

        def target(label, value, goal, strict=False):
            text, ok = _mark(value, goal, strict)
            if ok is None:
                unmeasured.append(label)
            elif not ok:
                missed.append(label)
            return text

        if big:
            cols += [target("fwd floor", floor["fwd"], 0.85), target("fwdbwd floor", floor["fwdbwd"], 0.75)]
        else:
            cols += [_plain(floor["fwd"]), _plain(floor["fwdbwd"])]
        for m in ("fwd", "fwdbwd"):
            goal = 1.5 if big and new else 1.0 if not big else None
            cols.append(_plain(ratio[m, "eager"]) if goal is None else target(f"{m} vs eager", ratio[m, "eager"], goal))
        for m in ("fwd", "fwdbwd"):
            if big and new:
                cols.append(target(f"{m} vs compile", ratio[m, "compile"], 1.0, strict=True))
            else:
                cols.append(_plain(ratio[m, "compile"]))
        verdict = "met" if not missed else "not met: " + ", ".join(missed)
        if unmeasured:
            what = "compile" if all("compile" in u for u in unmeasured) else ", ".join(unmeasured)
            verdict = (f"met where measured ({what} not measured)" if not missed
                       else f"{verdict}; {what} not measured")
        shape = f"{n}×{d}"
        lines.append(f"| {isa} | {op} | {kind} | {dtype} | {shape} | " + " | ".join(cols) + f" | {verdict} |")
    return "\n".join(lines)


def test_docs_show_the_targets_as_the_committed_results_have_them():
    docs = (ROOT / "docs" / "performance.md").read_text()
    start, end = "<!-- targets:start -->\n", "\n<!-- targets:end -->"
    assert start in docs and end in docs, "docs/performance.md has no targets table"
    shown = docs[docs.index(start) + len(start):docs.index(end)]
    assert shown == targets_markdown(), "docs/performance.md's targets table is not the committed results'"


def test_the_docs_claim_no_target_met_that_the_table_misses():
    """The prose once said float32 at 8192×1024 "meets them" beside a 1.43× (< 1.5×) and a tie with compile."""
    docs = (ROOT / "docs" / "performance.md").read_text()
    table = targets_markdown()
    assert "meets them" not in docs
    if "not met" in table:
        assert "every target is met" not in docs.lower()


if __name__ == "__main__":
    print(targets_markdown())
