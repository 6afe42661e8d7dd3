"""The command line's entry: `addnorm --help` and `--version` load no torch, `python -m addnorm` is the command,
the seeds the help names are explained, and no command writes into the repository by default."""

import argparse
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import addnorm
from addnorm.cli.main import build_parser, main
from addnorm.cli.seeds import SEEDS

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def _python(*args, cwd=None, code=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, *(("-c", code) if code else ()), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


@pytest.mark.parametrize("argv", [["--help"], ["--version"]])
def test_help_and_version_load_no_torch(argv):
    """Parsing first: the top level's help and version import neither torch nor any command's module (the help
    took 3.3 s, almost all of it importing torch and every command's dependencies)."""
    p = _python(code=f"""
import json, sys
from addnorm.cli.main import main
try:
    main({argv!r})
except SystemExit as e:
    assert e.code == 0, e.code
print(json.dumps(sorted(sys.modules)))
""")
    assert p.returncode == 0, p.stderr
    loaded = set(json.loads(p.stdout.splitlines()[-1]))
    assert not {"torch", "numpy", "rich", "matplotlib"} & loaded
    assert not {m for m in loaded if m.startswith("addnorm.") and m not in
                ("addnorm._moved", "addnorm.cli", "addnorm.cli.main", "addnorm.cli.output", "addnorm.cli.seeds")}


def test_python_m_addnorm_is_the_command_and_version_is_the_package_s(tmp_path):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert addnorm.__version__ == version
    p = _python("-m", "addnorm", "--version", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == f"addnorm {version}", p.stderr
    p = _python("-m", "addnorm", "--help", cwd=tmp_path)
    assert p.returncode == 0 and "COMMAND" in p.stdout and all(c in p.stdout for c in ("tour", "study", "bench"))
    p = _python("-m", "addnorm", "trace", "--position", "9", cwd=tmp_path)  # a command runs, and its error is its own
    assert p.returncode == 2 and "addnorm trace: error: --position" in p.stderr


def test_a_command_s_options_are_parsed_after_the_command_is_chosen(capsys):
    assert main(["trace", "--position", "1"]) == 0
    assert "Position 1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["nope"])


def _helps() -> dict[str, str]:
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return {"": p.format_help(), **{name: sp.format_help() for name, sp in sub.choices.items()}}


def test_every_seed_the_help_names_is_explained():
    """'seed 001' appeared in the help with nothing saying what it was: the top level's help lists each seed's
    tutorial, and a command whose help names a seed says it in full."""
    helps = _helps()
    top = " ".join(helps[""].split())
    for n, text in SEEDS.items():
        assert f"seed {n} {' '.join(text.split())}" in top
    for name, text in helps.items():
        for n in SEEDS:
            if f"seed {n}'s" in text:  # named by a command: explained on that command's help too
                assert " ".join(SEEDS[n].split()) in " ".join(text.split()), name
    assert "seed 001" in helps["trace"]


def _out_defaults() -> dict[str, str]:
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return {name: next(a.default for a in sp._actions if a.dest == "out")
            for name, sp in sub.choices.items() if any(a.dest == "out" for a in sp._actions)}


def test_no_command_writes_into_the_repository_by_default(tmp_path, monkeypatch):
    """`addnorm bench` wrote to benchmarks/results (a run in a clone replaced the README's data): every command
    that writes results writes under ./addnorm-results/<command> in the current directory, which the repository
    ignores, and says so in its help."""
    defaults = _out_defaults()
    assert set(defaults) == {"tour", "gradflow", "bench", "study"}
    monkeypatch.chdir(tmp_path)
    for name, out in defaults.items():
        assert out == f"addnorm-results/{name}"
        where = Path(out).resolve()
        assert where.is_relative_to(tmp_path) and not where.is_relative_to(ROOT)
        said = "".join(_helps()[name].split())  # argparse wraps at hyphens: compared without white space
        assert said.count(f"(default:./addnorm-results/{name},inthecurrentdirectory)") == 1
    assert "addnorm-results/" in (ROOT / ".gitignore").read_text().splitlines()  # run from a clone: not committed


def test_gradflow_writes_under_the_current_directory_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["gradflow", "--placements", "pre", "--depth", "3", "--d-model", "16", "--heads", "2",
                 "--seq-len", "16", "--batch", "2"]) == 0
    assert (tmp_path / "addnorm-results" / "gradflow" / "summary.md").is_file()


@pytest.mark.parametrize("order", ["import addnorm\nimport torch", "import torch\nimport addnorm"])
def test_import_order_does_not_decide_whether_the_operators_are_registered(order):
    """isort puts `import addnorm` before `import torch`; the operators must be registered either way (a loaded
    torch.export program, or torch.ops.addnorm.* called directly, touches no addnorm name first)."""
    p = _python(code=f"""
{order}
x = torch.randn(3, 8)
y = torch.ops.addnorm.add_norm
print(type(y).__name__, addnorm.layer_norm(x, 8).shape == x.shape)
""")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["OpOverloadPacket", "True"]
