"""The benchmark resumes from its journal instead of re-measuring finished rows (tiny shapes only)."""

import json

from addnorm.benchmark import add_norm


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
