"""`addnorm trace` and the tour's terminal walk-through."""

from addnorm.cli.main import main
from addnorm.experiments.seed001 import cross_check, run_seed001


def test_trace_prints_the_seed_calculation(capsys):
    assert main(["trace", "--position", "2", "--check"]) == 0
    out = capsys.readouterr().out
    assert "Detailed calculation for position 2 (like)" in out
    assert "Std (with epsilon):" in out and "Position 4 (<EOS>" in out
    assert "max |pure Python - PyTorch| layer_norm_output" in out


def test_seed001_matches_pytorch_and_normalizes():
    r = run_seed001()
    assert max(cross_check(r).values()) < 1e-12
    for out in r.layer_norm_output:
        m = sum(out) / len(out)
        v = sum((x - m) ** 2 for x in out) / len(out)
        assert abs(m) < 1e-12 and 0.99 < v < 1.0  # eps keeps the variance just below 1


def test_trace_refuses_a_position_as_the_other_commands_refuse_options(capsys):
    assert main(["trace", "--position", "5"]) == 2
    assert "addnorm trace: error: --position: position must be in [0, 4], got 5" in capsys.readouterr().err
