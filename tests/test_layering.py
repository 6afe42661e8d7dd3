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
                   "diagnostics", "interop", "report", "benchmark"}),
    ("kernels", {"ops", "functional", "nn", "model", "check", "max", "cli", "experiments", "diagnostics",
                 "interop", "report", "benchmark"}),
    ("ops", {"functional", "nn", "model", "check", "max", "cli", "experiments", "diagnostics", "interop",
             "report", "benchmark"}),
    ("check", {"max", "cli", "experiments", "report", "benchmark"}),
    ("benchmark", {"cli", "report"}),
    ("experiments", {"cli"}),
    ("report", {"cli"}),
])
def test_imports_point_down(layer, forbidden):
    for path in (SRC / layer).rglob("*.py"):
        bad = _addnorm_imports(path) & forbidden
        assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}"


def test_the_result_store_imports_nothing_of_addnorm():
    """store.py (atomic writes, content hashes) sits under every layer that writes results."""
    assert _addnorm_imports(SRC / "store.py") == set()
