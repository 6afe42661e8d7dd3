"""Every option of every command says its default; the bench's terminal table fits 80 columns."""

import argparse
import json
from pathlib import Path

import pytest
from rich.console import Console

from addnorm.bench.report import summary_table
from addnorm.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _subparsers():
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices.items()


@pytest.mark.parametrize("name, parser", list(_subparsers()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_option_help_states_its_default(name, parser):
    text = " ".join(parser.format_help().split())
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or "-h" in action.option_strings:
            continue
        help_text = " ".join(parser._get_formatter()._expand_help(action).split())
        assert "default" in help_text.lower(), f"addnorm {name} {action.option_strings[-1]}: {help_text!r}"
        assert help_text in text


def test_bench_table_fits_80_columns():
    res = json.loads((ROOT / "benchmarks/results/add_norm_tuned.json").read_text())
    console = Console(width=80, record=True)
    console.print(summary_table(res["rows"], res["conditions"], "benchmarks/results/add_norm_tuned.csv"))
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    assert "…" not in text  # nothing truncated
    cells = {(r["kind"], r["dtype"], r["rows"], r["hidden"], r["mode"]) for r in res["rows"]}
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["layer"], ["rms"])]
    assert len(rows) == len(cells) and all(len(r) == 8 for r in rows)  # a full row per cell
