"""The benchmark resumes from its journal instead of re-measuring finished rows (tiny shapes only), and refuses
bad options before any work."""

import json

import pytest

from addnorm.bench import add_norm, cpu_cells
from addnorm.cli.main import main


def test_journal_is_reused(tmp_path, monkeypatch):
    journal = tmp_path / "j.jsonl"
    rows = add_norm.run_benchmark([(8, 16)], ["float32"], ["rms"], ["fwd"], ["addnorm", "eager"], floor=10.0,
                                  journal=journal)
    assert len(journal.read_text().splitlines()) == 2
    calls = []
    monkeypatch.setattr(add_norm, "time_cell", lambda *a: calls.append(a))
    again = add_norm.run_benchmark([(8, 16)], ["float32"], ["rms"], ["fwd"], ["addnorm", "eager"], floor=10.0,
                                   journal=journal)
    assert calls == [] and again == rows
    journal.write_text(journal.read_text() + '{"kind": "rms", "dty')  # an interrupted write is ignored
    assert add_norm.run_benchmark([(8, 16)], ["float32"], ["rms"], ["fwd"], ["addnorm"], floor=10.0, journal=journal)
    assert json.loads(journal.read_text().splitlines()[0])["method"] == "addnorm"


@pytest.mark.parametrize("args, message", [
    (["--kinds", "foo"], "--kinds: unknown value(s) foo; valid: layer, rms"),
    (["--shapes", "12xab"], "--shapes: '12xab' is not ROWSxHIDDEN"),
    (["--shapes", "0x768"], "--shapes: '0x768' is not ROWSxHIDDEN with both >= 1"),
    (["--shapes", "64"], "--shapes: '64' is not ROWSxHIDDEN"),
    (["--dtypes", "float8"], "--dtypes: unknown value(s) float8"),
    (["--modes", ","], "--modes: empty"),
    (["--out", "/proc/addnorm-cannot-write"], "--out: /proc/addnorm-cannot-write is not a writable directory"),
    (["--shapes", "1000000x100000"], "--shapes: 1000000x100000 needs about"),  # raised from the allocator before
])
def test_bench_options_are_refused_before_any_work(args, message, tmp_path, capsys):
    """Checked in the parent, before a child process or a measurement starts (and before results are written)."""
    assert main(["bench", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_one_journal_reader_skips_the_line_an_interruption_cut_short(tmp_path):
    """store.read_journal, which the Add & Norm, fused-forms (CPU and GPU) and launch-sweep benchmarks resume from:
    records in order, a cut-short or refused line skipped, a missing journal empty."""
    from addnorm.harness.store import read_journal

    j = tmp_path / "x.partial.jsonl"
    assert read_journal(j, dict) == [] and read_journal(None, dict) == []
    j.write_text('{"cell": "a", "v": 1}\n[1, 2]\n{"v": 2}\n{"cell": "b", "v": 3}\n{"cell": "c", "v"')
    assert read_journal(j, lambda rec: (rec["cell"], rec["v"])) == [("a", 1), ("b", 3)]


def test_the_fused_forms_benchmark_resumes_from_its_journal(tmp_path, monkeypatch):
    """The CPU fused-forms benchmark reads its journal with store.read_journal too: finished rows are not
    measured again, and a line an interruption cut short is skipped."""
    from addnorm.bench import fused_forms

    monkeypatch.setattr(fused_forms, "copy_floor_gbps", lambda: 10.0)
    journal = tmp_path / "f.partial.jsonl"
    args = (["stream_read"], [(8, 16)], ["float32"], ["rms"], ["fwd"], ("addnorm", "eager"))
    rows = fused_forms.run(*args, journal=journal)
    assert [r.method for r in rows] == ["addnorm", "eager"] and len(journal.read_text().splitlines()) == 2
    journal.write_text(journal.read_text() + '{"op": "stream_read", "ki')

    def never(*a, **k):
        raise AssertionError("a journalled cell was measured again")

    monkeypatch.setattr(fused_forms, "measure_interleaved", never)
    assert fused_forms.run(*args, journal=journal) == rows


def test_a_journal_of_other_conditions_is_not_reused(tmp_path, capsys):
    """Resuming kept an interrupted run's rows whatever they were measured under: 46 of 64 rows of a 1-thread run
    went into a table saying 2 threads. The journal now starts with its conditions (threads, instruction set,
    allocator, torch, the kernels' build), and rows of others are measured again."""
    from rich.console import Console

    console = Console(file=None, emoji=False)
    journal = tmp_path / "add_norm_current.partial.jsonl"
    cond = cpu_cells.journal_conditions("current")
    assert {"torch_threads", "addnorm_isa", "addnorm_build", "allocator"} <= set(cond)
    cpu_cells.open_journal(journal, cond, console)
    rows = add_norm.run_benchmark([(8, 16)], ["float32"], ["rms"], ["fwd"], ["addnorm"], floor=10.0, journal=journal)
    kept = journal.read_text()
    cpu_cells.open_journal(journal, dict(cond), console)  # the same conditions: resumed
    assert journal.read_text() == kept and rows
    cpu_cells.open_journal(journal, dict(cond, torch_threads=cond["torch_threads"] + 1), console)
    assert len(journal.read_text().splitlines()) == 1  # only the new conditions: the rows are measured again
    assert "torch_threads" in capsys.readouterr().out


def test_allocator_both_fails_when_a_run_is_killed(monkeypatch, tmp_path):
    """A child killed by a signal returns -signal; max(-9, 0) reported success."""
    import subprocess

    codes = iter([-9, 0])
    monkeypatch.setattr(subprocess, "call", lambda *a, **k: next(codes))
    assert main(["bench", "--allocator", "both", "--shapes", "8x16", "--out", str(tmp_path)]) == 137
