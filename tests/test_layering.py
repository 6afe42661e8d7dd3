"""The import rules of docs' architecture: imports point down only (checked by parsing every module)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "addnorm"


def _addnorm_imports(path: Path) -> set[str]:
    """Top-level addnorm packages a module imports (relative imports resolved)."""
    pkg = path.relative_to(SRC).parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(pkg[: len(pkg) - node.level + 1])
                parts = base + (node.module.split(".") if node.module else [])
                names = [parts[0]] if parts else [a.name for a in node.names]
                out.update(names)
            elif node.module and node.module.startswith("addnorm."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("addnorm."))
    return out


@pytest.mark.parametrize("layer, forbidden", [
    ("reference", {"kernels", "ops", "functional", "nn", "model", "check", "max", "cli", "experiments",
                   "diagnostics", "interop", "report", "bench"}),
    ("kernels", {"ops", "functional", "nn", "model", "check", "max", "cli", "experiments", "diagnostics",
                 "interop", "report", "bench"}),
    ("ops", {"functional", "nn", "model", "check", "max", "cli", "experiments", "diagnostics", "interop",
             "report", "bench"}),
    ("check", {"max", "cli", "experiments", "report", "bench"}),
    ("bench", {"cli", "report"}),
    ("experiments", {"cli"}),
    ("report", {"cli", "experiments"}),  # report/ draws from results files and the rows handed to it
])
def test_imports_point_down(layer, forbidden):
    for path in (SRC / layer).rglob("*.py"):
        bad = _addnorm_imports(path) & forbidden
        assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}"


def test_the_harness_imports_nothing_of_addnorm():
    """harness/ (result files, timing, the corpus) sits under every layer that runs or writes something."""
    for path in (SRC / "harness").rglob("*.py"):
        assert _addnorm_imports(path) == set(), f"{path.relative_to(SRC)} imports {sorted(_addnorm_imports(path))}"


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(path: Path, known: set[str]) -> set[str]:
    """The addnorm modules (dotted, without 'addnorm.') that a module imports, relative imports resolved;
    'from package import module' counts as the module."""
    pkg = _module(path).split(".") if path.name == "__init__.py" else _module(path).split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("addnorm."):
                target = node.module.removeprefix("addnorm.")
            else:
                continue
            out.update(f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.removeprefix("addnorm.") for a in node.names if a.name.startswith("addnorm."))
    return out & known


def test_no_import_circle_between_experiments_and_report():
    """Issue 24: grid.py imported report/study_html.py, which imported grid.py back. No module of experiments/
    or report/ may reach itself again through imports (a depth-first search for a cycle)."""
    paths = [p for layer in ("experiments", "report") for p in (SRC / layer).rglob("*.py")]
    known = {_module(p) for p in SRC.rglob("*.py")}
    graph = {_module(p): _module_imports(p, known) for p in paths}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            assert state.get(d) != 1, "import circle: " + " -> ".join(path[path.index(d):] + [d])
            if d in graph and d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
