"""`addnorm check`: passes correct implementations, fails each known mistake with the right hint."""

from pathlib import Path

import pytest

from addnorm.cli.main import main

EX = Path(__file__).resolve().parent.parent / "check_examples"


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm", "layer_norm", "ResidualBlock", "apply_residual_connection"])
def test_correct_implementations_pass(name, capsys):
    assert main(["check", f"{EX / 'good.py'}:{name}"]) == 0
    out = capsys.readouterr().out
    assert "All checks passed" in out and "❌" not in out


@pytest.mark.parametrize("name,failing,hint", [
    ("TutorialLayerNorm", "matches the float64 oracle", "use the biased variance and put eps inside the root"),
    ("BatchNormInstead", "each position is normalized on its own", "statistics are being taken across the batch"),
    ("ForgotResidual", "adds the input", "the residual is missing: return x + sublayer_output"),
    ("SwappedGammaBeta", "applies scale then shift", "gamma (weight) and beta (bias) are swapped"),
])
def test_each_mistake_fails_with_its_hint(name, failing, hint, capsys):
    assert main(["check", f"{EX / 'buggy.py'}:{name}"]) == 1
    out = " ".join(capsys.readouterr().out.split())  # undo rich's line wrapping
    assert f"❌ {failing}" in out
    assert hint in out


def test_the_tutorial_form_is_named(capsys):
    main(["check", f"{EX / 'buggy.py'}:TutorialLayerNorm"])
    out = " ".join(capsys.readouterr().out.split())
    assert "looks like unbiased std with eps outside the square root" in out


def test_bad_targets(capsys):
    assert main(["check", f"{EX / 'good.py'}:Missing"]) == 2
    assert "has no 'Missing'" in capsys.readouterr().out
    assert main(["check", "nowhere.py:X"]) == 2
    assert main(["check", "no-colon"]) == 2
