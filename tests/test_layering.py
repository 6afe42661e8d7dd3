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
    ("report", {"cli", "experiments"}),  # report/ draws from results files and the rows handed to it
])
def test_imports_point_down(layer, forbidden):
    for path in (SRC / layer).rglob("*.py"):
        bad = _addnorm_imports(path) & forbidden
        assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}"


def test_the_result_store_imports_nothing_of_addnorm():
    """store.py (atomic writes, content hashes) sits under every layer that writes results."""
    assert _addnorm_imports(SRC / "store.py") == set()


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


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _bindings(path: Path, known: set[str]):
    """(node, what it imports, the local name) for each addnorm import of a module: what is 'module' for an
    addnorm module (dotted, without 'addnorm.') or 'module:name' for a name taken from one."""
    pkg = _module(path).split(".") if path.name == "__init__.py" else _module(path).split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            elif node.module and (node.module == "addnorm" or node.module.startswith("addnorm.")):
                target = node.module.removeprefix("addnorm").removeprefix(".")
            else:
                continue
            for a in node.names:
                sub = f"{target}.{a.name}" if target else a.name
                yield node, (sub if sub in known else f"{target}:{a.name}"), a.asname or a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("addnorm.") and a.asname:
                    yield node, a.name.removeprefix("addnorm."), a.asname


def _owner(module: str) -> str:
    """The package a module belongs to ('' for addnorm's own modules)."""
    return module.rpartition(".")[0]


def test_no_module_reaches_into_another_modules_private_names():
    """A name with a leading underscore is its module's own: no other module imports it (``from x import _y``),
    reads it off an imported module (``x._y``) or imports a private module of another package. A package's
    private submodules (``nn/_shape.py``, the compiled ``kernels/cpu/_addnorm_cpu``) serve that package."""
    known = {_module(p) for p in SRC.rglob("*.py")} | {"kernels.cpu._addnorm_cpu", "kernels.cpu._addnorm_nodes"}
    bad = []
    for path in SRC.rglob("*.py"):
        me = _module(path)
        home = me if path.name == "__init__.py" else _owner(me)
        modules = {}
        for node, what, local in _bindings(path, known):
            module, _, name = what.partition(":")
            if name and _private(name):
                bad.append(f"{me} imports {module}.{name}")
            parts = module.split(".")
            for i, part in enumerate(parts):
                if _private(part) and ".".join(parts[:i]) != home:
                    bad.append(f"{me} imports {module}, a private module of another package")
            if not name:
                modules[local] = module
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                    and _private(node.attr)):
                bad.append(f"{me} reads {modules[node.value.id]}.{node.attr}")
    assert not bad, "\n".join(sorted(set(bad)))


def test_no_addnorm_module_is_aliased_F():
    """``F`` is torch.nn.functional's alias by convention: an addnorm module under that name misleads."""
    known = {_module(p) for p in SRC.rglob("*.py")}
    bad = [f"{_module(path)}: {what} as F" for path in SRC.rglob("*.py")
           for _, what, local in _bindings(path, known) if local == "F"]
    assert not bad, "\n".join(bad)
