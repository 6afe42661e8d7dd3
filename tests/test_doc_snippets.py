"""Every Python snippet of README.md and docs/*.md runs, as written, so that the documentation cannot drift from
the API (a snippet that once called addnorm's GPT with HF's `labels=` keyword is why).

Each ```python block runs in a fresh namespace, in a temporary working directory, with the Hub switched offline.
A block's first lines may carry directives, ``# doc-test: <directive>; <directive>``:

- ``needs MODULE (why)``: skipped where MODULE is not installed (an optional extra), run where it is (CI);
- ``own process (why)``: run in a new interpreter, for a block that changes process-wide state;
- ``skip (why)``: not run at all. None today: OPT_OUTS below lists the allowed ones, so that adding one is a
  visible decision.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
DIRECTIVE = re.compile(r"^#\s*doc-test:\s*(.+)$")
OPT_OUTS: set[str] = set()  # "file:line" of the blocks allowed to say `skip`


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    code: str
    needs: tuple[str, ...] = ()
    own_process: bool = False
    skip: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _parse(path: Path, line: int, code: str) -> Snippet:
    needs, own, skip = [], False, None
    for first in code.splitlines():
        m = DIRECTIVE.match(first.strip())
        if not m:
            break
        for part in (p.strip() for p in m.group(1).split(";")):
            word = part.split("(")[0].strip()
            if word.startswith("needs "):
                needs.append(word.split()[1])
            elif word == "own process":
                own = True
            elif word == "skip":
                if "(" not in part:
                    raise ValueError(f"{path.name}:{line}: `skip` must say why, in parentheses")
                skip = part
            else:
                raise ValueError(f"{path.name}:{line}: unknown doc-test directive {part!r}")
    return Snippet(path, line, code, tuple(needs), own, skip)


def snippets(paths=DOCS) -> list[Snippet]:
    out = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 2  # the block's first line of code
            indent = m.group("indent")
            code = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln
                             for ln in m.group("body").splitlines())
            out.append(_parse(path, line, code + "\n"))
    return out


ALL = snippets()


def _installed(module: str) -> bool:
    """Importable as a real package: `kernels` without the package resolves to the tests/kernels folder, a
    namespace package with no file."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    return getattr(mod, "__file__", None) is not None


@pytest.fixture
def offline(monkeypatch, tmp_path):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.chdir(tmp_path)  # whatever a snippet writes lands here, not in the repository
    return tmp_path


@pytest.mark.parametrize("snippet", ALL, ids=[s.where for s in ALL])
def test_snippet_runs(snippet: Snippet, offline):
    if snippet.skip:
        assert snippet.where in OPT_OUTS, f"{snippet.where} opts out ({snippet.skip}) but is not in OPT_OUTS"
        pytest.skip(snippet.skip)
    missing = [m for m in snippet.needs if not _installed(m)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (an optional extra)")
    if snippet.own_process:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-c", snippet.code], cwd=offline, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"{snippet.where} failed:\n{done.stderr[-3000:]}"
        return
    torch.manual_seed(0)
    exec(compile(snippet.code, snippet.where, "exec"), {"__name__": "__doc_snippet__"})  # noqa: S102 - our docs


def test_every_doc_has_its_snippets_found():
    """The fence pattern finds every ```python opening (an unclosed or oddly indented block would be silently
    left out otherwise), and the README's five tasks are among them."""
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        openings = len(re.findall(r"^[ \t]*```python[ \t]*$", text, re.M))
        assert openings == len([s for s in ALL if s.path == path]), path.name
    readme = [s.code for s in ALL if s.path.name == "README.md"]
    assert len(readme) >= 4
    assert any("add_rms_norm" in c or "add_layer_norm" in c for c in readme)
    assert any("patch_hf_model" in c for c in readme)
    assert any("diagnostics.record" in c and "logits, loss = model(idx, idx)" in c for c in readme)
    assert any('n_streams=' in c for c in readme)  # the widened stream's field, by its real name


def test_opt_outs_are_the_listed_ones():
    assert {s.where for s in ALL if s.skip} == OPT_OUTS


def test_directives_are_parsed_and_refused_when_unknown(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("a\n```python\n# doc-test: needs kernels (extra); own process (global state)\nx = 1\n```\n"
                   "  ```python\n  y = 2\n  ```\n")
    got = snippets([doc])
    assert [(s.line, s.needs, s.own_process) for s in got] == [(3, ("kernels",), True), (7, (), False)]
    assert got[1].code == "y = 2\n"
    doc.write_text("```python\n# doc-test: sometimes\n```\n")
    with pytest.raises(ValueError, match="unknown doc-test directive"):
        snippets([doc])
    doc.write_text("```python\n# doc-test: skip\n```\n")
    with pytest.raises(ValueError, match="must say why"):
        snippets([doc])
