"""Regenerate the tables made from committed results (benchmarks/results/): the README's one table of headline
numbers, the full CPU Add & Norm tables in docs/performance-journal.md, the HuggingFace parity table in
docs/exactness.md, the CPU engines' tables in docs/performance.md (one per machine under
benchmarks/results/peers/) and HF's widened-stream decoders' table in docs/hf.md, each between its markers.

    python benchmarks/readme_table.py

tests/test_readme.py fails while either file differs from what this prints, so a table cannot outlive its
numbers. Every figure below is read from a results file, never typed.
"""

import json
import sys
from pathlib import Path

from addnorm.bench import hf_hyper
from addnorm.bench.peers import LABELS
from addnorm.bench.report import bandwidth_table, markdown_table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
JOURNAL = ROOT / "docs" / "performance-journal.md"
README_MARKERS = ("<!-- headline:start -->", "<!-- headline:end -->")
JOURNAL_MARKERS = ("<!-- bench:start -->", "<!-- bench:end -->")
EXACTNESS = ROOT / "docs" / "exactness.md"
PARITY_MARKERS = ("<!-- parity:start -->", "<!-- parity:end -->")
PERFORMANCE = ROOT / "docs" / "performance.md"
PEERS_MARKERS = ("<!-- peers:start -->", "<!-- peers:end -->")
HF = ROOT / "docs" / "hf.md"
HF_HYPER_MARKERS = ("<!-- hf_hyper:start -->", "<!-- hf_hyper:end -->")
PEERS_RESULTS = RESULTS / "peers"  # one folder per machine, each with the tuned allocator's add_norm_tuned.json
HEADLINE_SHAPES = {(8192, 1024), (16384, 768), (2048, 4096), (64, 768)}  # the journal's shapes (4096×768: CSV only)
NORM = {"layer": "LayerNorm", "rms": "RMSNorm"}
DTYPE = {"float32": "float32", "bfloat16": "bf16"}


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _cell(table, **key) -> dict:
    """{method: row} of one cell of a benchmark result."""
    out = {r["method"]: r for r in table if all(r.get(k) == v for k, v in key.items())}
    if "addnorm" not in out:
        raise KeyError(f"no addnorm row for {key}")
    return out


def _vs(cell, peer: str, label: str) -> str:
    return f"{cell[peer]['median_ms'] / cell['addnorm']['median_ms']:.2f}× {label}"


def _cpu_row(res, kind, dtype) -> str:
    c = _cell(res["rows"], kind=kind, dtype=dtype, rows=8192, hidden=1024, mode="fwdbwd")
    a = c["addnorm"]
    return (f"| Add & {NORM[kind]}, {DTYPE[dtype]}, 8192×1024, forward + backward | {a['median_ms']:.2f} ms: "
            f"{_vs(c, 'eager', 'eager')}, {_vs(c, 'compile', '`torch.compile`')}, {a['frac_of_floor']:.2f} of the "
            f"copy floor | {res['conditions']['processor']}, {res['conditions']['cores']} cores | "
            f"`add_norm_tuned.json` |")


def headline_table() -> str:
    """The README's table: one line per thing people ask about, each from its committed results file."""
    cpu, gpu = _load("add_norm_tuned.json"), _load("add_norm_gpu_h200.json")
    lines = ["| what | result | measured on | `benchmarks/results/` |", "|---|---|---|---|"]
    # float32 only: the file's bfloat16 cells come from a later run (its conditions' note), and one line should
    # not mix two runs' copy floors
    lines += [_cpu_row(cpu, kind, "float32") for kind in ("layer", "rms")]
    for kind in ("layer", "rms"):
        c = _cell(gpu["rows"], kind=kind, dtype="float32", rows=16384, hidden=8192, mode="fwd")
        peers = [_vs(c, "eager", "eager"), _vs(c, "compile", "`torch.compile`")]
        if "liger" in c:
            peers.append(_vs(c, "liger", "Liger"))
        lines.append(f"| Add & {NORM[kind]}, float32, 16384×8192, forward (Triton) | {c['addnorm']['median_ms']:.3f} ms: "
                     f"{', '.join(peers)}, {c['addnorm']['frac_of_floor']:.2f} of the copy floor | "
                     f"{gpu['conditions']['gpu']} | `add_norm_gpu_h200.json` |")
    parity = _load("parity.json")
    name, g = next(iter(parity["gpt2_load"].items()))
    lines.append(f"| HF GPT-2 ({name.split('(')[-1].rstrip(')')}) loaded into addnorm's GPT | max \\|logits − HF\\| "
                 f"{g['max_abs_logit_diff']:.1e}; 24 greedy tokens identical: "
                 f"{'yes' if g['greedy_24_tokens_identical'] else 'no'} | CPU, float32 | `parity.json` |")
    for name, p in parity["patch"].items():
        lines.append(f"| HF {name} after `patch_hf_model` | max \\|logits diff\\| {p['max_abs_logit_diff']:.1e}, "
                     f"\\|grad diff\\| {p['max_abs_grad_diff']:.1e}; {p['fused_adds']} adds fused | CPU, float32 | "
                     f"`parity.json` |")
    step = _load("model_step.json")
    e, f = step["eager"], step["fused"]
    lines.append(f"| GPT-2-small training step ({e['params'] / 1e6:.1f} M parameters, {e['tokens']} tokens), fused "
                 f"vs eager Add & Norm | {f['median_s'] * 1e3:.0f} vs {e['median_s'] * 1e3:.0f} ms "
                 f"({step['speedup']:.2f}×; the matmuls dominate a CPU step); same loss: "
                 f"{'yes' if step['same_loss'] else 'no'} | CPU, {e['threads']} threads | `model_step.json` |")
    block = _load("mhc_block.json")
    rows = block["rows"]
    over = {k: rows[f"mhc@{k}"]["median_ms"] / rows[f"pre@{k}"]["median_ms"] - 1 for k in ("auto", "torch")}
    lines.append(f"| An mHC block (n = 4) over a pre-norm block, GPT-2-small width, {block['tokens']} tokens, "
                 f"forward + backward | +{100 * over['auto']:.1f} % with the fused kernels, +{100 * over['torch']:.1f} % as torch ops "
                 f"| {block['conditions']['processor']}, {block['conditions']['cores']} cores | `mhc_block.json` |")
    diag = _load("diagnostics_overhead.json")
    lines.append(f"| Diagnostics recorder on a training step ({diag['model']}) | +{100 * diag['overhead_recording']:.0f} % "
                 f"while recording ({diag['records_per_step']} records a step), +{100 * diag['overhead_after_detach']:.0f} % "
                 f"after detaching | CPU | `diagnostics_overhead.json` |")
    return "\n".join(lines)


def _default_table() -> list[str]:
    """The same cells under glibc's default allocator (fresh outputs page-faulted on every call), if measured."""
    path = RESULTS / "add_norm_default.json"
    if not path.exists():
        return []
    res = json.loads(path.read_text())
    rows = [r for r in res["rows"] if (r["rows"], r["hidden"]) in HEADLINE_SHAPES]
    c = res["conditions"]
    return ["", f"**Under glibc's default allocator** (`--allocator default`, same machine and method, a separate run "
            f"of the same command; start-of-run floor {c['floor_gbps']:.1f} GB/s). Every fresh buffer of ≥ 32 MiB is "
            "mmap'd and page-faulted again on each call: eager and torch.compile pay it for every output, addnorm's "
            "outputs come from its output pool (recycled, already faulted-in memory; `addnorm.output_pool`):",
            "", markdown_table(rows), "", "All of this run's cells are in `benchmarks/results/add_norm_default.csv`."]


def cpu_tables() -> str:
    """The journal's full CPU tables: every headline shape, both norms and dtypes, every mode, both allocators."""
    res = _load("add_norm_tuned.json")
    c = res["conditions"]
    rows = res["rows"]
    head = [r for r in rows if (r["rows"], r["hidden"]) in HEADLINE_SHAPES]
    local = [r["floor_gbps"] for r in rows if r["min_bytes"] >= 32 << 20]
    text = [f"Measured by `make bench` (= `python benchmarks/bench_add_norm.py`) on {c['processor']}, {c['cores']} cores, "
            f"{c['torch_threads']} torch threads, torch {c['torch']}, Python {c['python']}, kernel ISA `{c['addnorm_isa']}`, "
            f"glibc allocator told to keep freed memory (`--allocator {c['allocator']}`, see "
            "[performance.md](performance.md#allocator-settings-page-faults-can-cost-more-than-the-kernel)). "
            f"Floor: torch's copy of a 256 MiB buffer into pre-faulted memory (read + write), {c['floor_gbps']:.1f} GB/s "
            f"at the start of the run and, because this machine's bandwidth drifts, measured again side by side with the "
            f"methods in every cell that moves ≥ 32 MiB ({min(local):.1f}–{max(local):.1f} GB/s over the run; the "
            "“floor GB/s” column). Every time is the median of ≥ 15 runs (± half the p10–p90 spread), the methods of a "
            "cell timed interleaved (rounds of 5 calls of each in turn); GB/s counts the minimum bytes (fwd: read x, r, "
            "write y, s; bwd: read dy, ds, s, write dx); “of floor” = time the floor would need ÷ time taken; "
            "“vs eager” / “vs compile” = their time ÷ addnorm's (above 1: addnorm is faster). "
            "Small shapes fit in cache, so they can beat the DRAM floor or be dominated by per-call overhead.",
            *([f"The results file notes: {c['note']}."] if c.get("note") else []),
            "", markdown_table(head), "",
            "All five measured shapes (also 4096×768) are in `benchmarks/results/add_norm_tuned.csv`.",
            *_default_table()]
    return "\n".join(text)


def parity_table() -> str:
    """docs/exactness.md's HuggingFace table, from `python benchmarks/parity.py`'s results."""
    parity = _load("parity.json")
    lines = ["| model | max \\|logits − HF\\| | also |", "|---|---:|---|"]
    for name, g in parity["gpt2_load"].items():
        lines.append(f"| GPT-2 {name}, loaded with `load_gpt2` | {g['max_abs_logit_diff']:.1e} | 24 greedy tokens "
                     f"identical: {'yes' if g['greedy_24_tokens_identical'] else 'no'} |")
    for name, p in parity["patch"].items():
        lines.append(f"| HF {name} after `patch_hf_model` | {p['max_abs_logit_diff']:.1e} | max \\|grad diff\\| "
                     f"{p['max_abs_grad_diff']:.1e}; {p['fused_adds']} adds fused |")
    return "\n".join(lines)


def peers_tables() -> str:
    """docs/performance.md's tables of addnorm beside the CPU engines: one per machine with a committed run."""
    runs = sorted(PEERS_RESULTS.glob("*/add_norm_tuned.json"))
    if not runs:
        return ("No run is committed yet: the command above writes one into `benchmarks/results/peers/<machine>/`, "
                "and `python benchmarks/readme_table.py` puts its table here.")
    text = []
    for path in runs:
        res = json.loads(path.read_text())
        c = res["conditions"]
        engines = ", ".join(f"{LABELS[e][0]} {v}" for e, v in c.get("peers", {}).items())
        text += [f"**{c['processor']}**, {c['cores']} cores, {c['torch_threads']} threads, addnorm's kernels "
                 f"`{c['addnorm_isa']}`, torch {c['torch']}{', ' + engines if engines else ''}, allocator "
                 f"`{c['allocator']}`, copy floor {c['floor_gbps']:.1f} GB/s at the start "
                 f"(`{path.relative_to(RESULTS).as_posix()}`):",
                 *[f"Not measured: {why}." for why in c.get("peers_skipped", {}).values()],
                 "", bandwidth_table(res["rows"]), ""]
    return "\n".join(text).rstrip("\n")


def hf_hyper_table() -> str:
    """docs/hf.md's table of HF's widened-stream decoders, eager, patched and compiled, from
    `python benchmarks/bench_hf_hyper.py`'s results, once they are committed."""
    path = RESULTS / "hf_hyper.json"
    if not path.exists():
        return ("No run is committed yet: the numbers are filled in here from the results file of a run on a quiet "
                "machine (`benchmarks/results/hf_hyper.json`, written by the command above) by "
                "`python benchmarks/readme_table.py`.")
    res = json.loads(path.read_text())
    m, c = res["machine"], res["config"]
    errors = [f"{r['family']} {name}: {text}" for r in res["results"] for name, text in r["errors"].items()]
    return "\n".join([
        f"Measured on {m['processor']}, {m['cores']} cores, {m['torch_threads']} torch threads, addnorm's kernels "
        f"`{m['addnorm_isa']}`, torch {m['torch']}, transformers {m['transformers']}, {m['date'][:10]}: hidden "
        f"{c['hidden']}, {c['layers']} layers, training {c['batch']} × {c['seq']} tokens, decoding {c['decode_batch']} "
        f"× ({c['prompt']} + {c['new_tokens']}) tokens; the median of {c['repeats']} interleaved rounds "
        f"(p10–p90), the shares the median of {c['share_repeats']} instrumented passes "
        "(`benchmarks/results/hf_hyper.json`).",
        "", *hf_hyper.table(res["results"]),
        *(["", "Failed: " + "; ".join(errors) + "."] if errors else [])])


def regions() -> list[tuple[Path, tuple[str, str], str]]:
    """(file, (start marker, end marker), the text that belongs between them)."""
    return [(README, README_MARKERS, headline_table()), (JOURNAL, JOURNAL_MARKERS, cpu_tables()),
            (EXACTNESS, PARITY_MARKERS, parity_table()), (PERFORMANCE, PEERS_MARKERS, peers_tables()),
            (HF, HF_HYPER_MARKERS, hf_hyper_table())]


def between(text: str, markers: tuple[str, str]) -> str:
    """What a file holds between its markers (without the markers and the newlines beside them)."""
    start, end = markers
    if start not in text or end not in text:
        raise ValueError(f"markers {start} ... {end} not found")
    return text[text.index(start) + len(start):text.index(end)].strip("\n")


def main() -> int:
    for path, (start, end), body in regions():
        text = path.read_text(encoding="utf-8")
        between(text, (start, end))  # both markers must be there
        a, b = text.index(start) + len(start), text.index(end)
        path.write_text(text[:a] + "\n" + body + "\n" + text[b:], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
