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


@pytest.mark.parametrize("name,failing,named,hint", [
    # eps inside or outside the root, or missing, is invisible on rows of variance 100 (they all passed)
    ("EpsOutsideRoot", "matches the float64 oracle and torch.nn.LayerNorm", "eps added outside the square root",
     "put eps inside the square root: / sqrt(var + eps)"),
    ("NoEps", "matches the float64 oracle and torch.nn.LayerNorm", "no eps at all", "add eps inside the square root"),
    # named the tutorial form before, whose hint was the user's own formula
    ("UnbiasedVariance", "matches the float64 oracle", "unbiased variance (divides by D-1)",
     "LayerNorm divides by D, not D-1"),
    # an RMSNorm's "RMS ≈ 1" could not fail, and its failures were told as LayerNorm's
    ("RMSNoSqrt", "normalizes each position (RMS ≈ 1)", "no square root", "divide by the root"),
    ("RMSSumOfSquares", "matches the float64 oracle and torch.nn.RMSNorm", "the sum of squares instead of their mean",
     "take the mean of the squares"),
    ("RMSEpsOutsideRoot", "matches the float64 oracle and torch.nn.RMSNorm", "eps added outside the square root",
     "sqrt(mean(x^2) + eps)"),
])
def test_eps_and_rms_mistakes_are_caught_and_named(name, failing, named, hint, capsys):
    assert main(["check", f"{EX / 'buggy.py'}:{name}"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"❌ {failing}" in out
    assert f"looks like {named}" in out
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


def _file(tmp_path, body: str):
    p = tmp_path / "user_norm.py"
    p.write_text(body)
    return p


def test_says_it_runs_the_users_code(capsys):
    main(["check", f"{EX / 'good.py'}:LayerNorm"])
    out = " ".join(capsys.readouterr().out.split())
    assert "imports" in out and "runs its code" in out and "stopped after 60 s" in out


@pytest.mark.parametrize("body, name, cause, line", [
    ("import torch\nclass N(torch.nn.Module:\n    pass\n", "N", "SyntaxError", 2),
    ("import no_such_module_for_addnorm\n", "N", "ModuleNotFoundError: No module named 'no_such_module_for_addnorm'", 1),
    ("import torch\nclass N(torch.nn.Module):\n    def __init__(self, d):\n        super().__init__()\n"
     "        raise RuntimeError('broken constructor')\n", "N", "broken constructor", 5),
    ("import sys\nsys.exit(3)\n", "N", "sys.exit(3)", 2),
    # the user's text is printed as written: rich markup and emoji codes in it are not interpreted
    ("import torch\nclass N(torch.nn.Module):\n    def __init__(self, d):\n        super().__init__()\n"
     "        raise ValueError('[bold]shape[/bold] [2, 3] :x:')\n", "N", "ValueError: [bold]shape[/bold] [2, 3] :x:", 5),
])
def test_code_that_cannot_be_loaded_or_run_exits_2_with_cause_and_line(tmp_path, capsys, body, name, cause, line):
    p = _file(tmp_path, body)
    assert main(["check", f"{p}:{name}", "--timeout", "120"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert cause in out and f"user_norm.py:{line}" in out, out
    assert "Traceback" not in out


def test_a_forward_that_raises_fails_the_runs_check(tmp_path, capsys):
    p = _file(tmp_path, "import torch\nclass N(torch.nn.Module):\n    def __init__(self, d):\n"
                        "        super().__init__()\n    def forward(self, x):\n        return x.nonexistent()\n")
    assert main(["check", f"{p}:N", "--timeout", "120"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "❌ runs" in out and "AttributeError" in out


def test_a_forward_that_never_returns_is_stopped(tmp_path, capsys):
    p = _file(tmp_path, "import torch\nclass N(torch.nn.Module):\n    def __init__(self, d):\n"
                        "        super().__init__()\n    def forward(self, x):\n        while True:\n            pass\n")
    assert main(["check", f"{p}:N", "--timeout", "8"]) == 2
    assert "did not finish within 8 s" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("args", [["--features", "0"], ["--features", "abc"], ["--features", "1"],
                                  ["--timeout", "0"], ["--timeout", "-1"], ["--timeout", "soon"]])
def test_bad_options_are_refused_naming_them(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", f"{EX / 'good.py'}:LayerNorm", *args])
    assert e.value.code == 2
    assert args[0] in capsys.readouterr().err


def test_paths_with_markup_are_printed_as_written(tmp_path, capsys):
    target = f"{tmp_path / 'w[red]x' / 'missing.py'}:N:x:"
    assert main(["check", target]) == 2
    out = "".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert f"couldnotcheck{target}:" in out and "❌" not in out[1:], out


def test_a_directory_or_a_file_that_is_not_python_is_named(tmp_path, capsys):
    """A directory was reported as 'no such file'; a .txt file died in importlib with an AttributeError."""
    (tmp_path / "d.py").mkdir()
    (tmp_path / "f.txt").write_text("def f(x): return x\n")
    assert main(["check", f"{tmp_path / 'd.py'}:x"]) == 2
    assert "a directory, not a Python file" in " ".join(capsys.readouterr().out.split())
    assert main(["check", f"{tmp_path / 'f.txt'}:f"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "not a .py file" in out and "AttributeError" not in out


def test_ctrl_c_is_a_line_not_a_traceback(monkeypatch, capsys):
    from addnorm.cli import gradflow

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(gradflow, "run", interrupted)
    assert main(["gradflow"]) == 130
    err = capsys.readouterr().err
    assert "interrupted; run the same command again to resume" in err and "Traceback" not in err
