"""The command line that ``claims`` and ``method`` share (``result_files.parse_results_and_out``): the same options,
defaults under the committed results root, and a --results that is not a directory refused by name."""

import json
from pathlib import Path

import pytest

from addnorm.experiments.study import claims as C
from addnorm.experiments.study import method as M
from addnorm.experiments.study.result_files import RESULTS, parse_results_and_out


def test_the_defaults_are_the_committed_results_and_a_file_in_them(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    RESULTS.mkdir(parents=True)
    args = parse_results_and_out("claims", "d", "claims.json", [])
    assert (args.results, args.out) == (Path("benchmarks/results/study"), Path("benchmarks/results/study/claims.json"))
    args = parse_results_and_out("method", "d", "method.json", ["--results", str(tmp_path), "--out", "x.json"])
    assert (args.results, args.out) == (tmp_path, Path("x.json"))


@pytest.mark.parametrize("module", [C, M])
def test_a_results_root_that_is_not_a_directory_is_refused_naming_it(module, tmp_path, capsys):
    name = module.__name__.rsplit(".", 1)[-1]
    with pytest.raises(SystemExit) as e:
        module.main(["--results", str(tmp_path / "missing")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"python -m addnorm.experiments.study.{name}: error: --results {tmp_path / 'missing'}: not a directory" in err


@pytest.mark.parametrize("module, out_name", [(C, "claims.json"), (M, "method.json")])
def test_each_help_names_its_module_and_its_default_file(module, out_name, capsys):
    with pytest.raises(SystemExit):
        module.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    name = module.__name__.rsplit(".", 1)[-1]
    assert out.startswith(f"usage: python -m addnorm.experiments.study.{name} [-h] [--results RESULTS] [--out OUT]")
    assert f"--out OUT where to write (default: benchmarks/results/study/{out_name})" in out


def test_the_method_command_writes_the_facts_of_the_results_it_is_given(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(M, "facts", lambda results: {"results": str(results)})  # the facts themselves: their own test
    out = tmp_path / "method.json"
    assert M.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == {"results": str(tmp_path)}
    assert capsys.readouterr().out == f"{out} written\n"
