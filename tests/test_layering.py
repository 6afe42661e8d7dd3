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


ABOVE_OPS = {"functional", "nn", "model", "check", "max", "cli", "experiments", "diagnostics", "interop", "report",
             "bench"}


@pytest.mark.parametrize("layer, forbidden", [
    # harness/ (result files, timing, the corpus) imports nothing of addnorm: test_the_harness_imports_nothing_...
    # The math below functional/ neither runs nor writes anything: it has no use for the harness either
    ("reference", {"kernels", "ops", "harness"} | ABOVE_OPS),
    ("kernels", {"ops", "harness"} | ABOVE_OPS),
    ("ops", {"harness"} | ABOVE_OPS),
    ("check", {"max", "cli", "experiments", "report", "bench"}),
    ("bench", {"cli", "report", "experiments"}),
    ("experiments", {"cli", "bench"}),  # what both need lives below both, in harness/
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
    """A module's dotted name without 'addnorm.' (a package is its __init__; addnorm itself is '')."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _bound_in_package(package: list[str], name: str) -> bool:
    """Whether a package's __init__ binds ``name`` (defines, assigns or imports it, or may give any name through a
    module __getattr__); a name it does not bind is a submodule that is not Python source (a compiled extension)."""
    init = SRC.joinpath(*package, "__init__.py")
    if not init.exists():
        return True  # a module, not a package: the name is one of its attributes
    bound = set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                bound.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return name in bound or "__getattr__" in bound


def _module_imports(path: Path, known: set[str]) -> set[str]:
    """The addnorm modules (dotted, without 'addnorm.') that a module imports, relative imports resolved;
    'from package import module' counts as the module, and 'from package import name' as the package's __init__
    where that binds the name."""
    me = _module(path).split(".") if _module(path) else []
    pkg = me if path.name == "__init__.py" else me[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = pkg[: len(pkg) - node.level + 1] + (node.module.split(".") if node.module else [])
            elif node.module == "addnorm" or (node.module or "").startswith("addnorm."):
                target = node.module.split(".")[1:]
            else:
                continue
            for a in node.names:
                sub = ".".join(target + [a.name])
                if sub in known:
                    out.add(sub)
                elif _bound_in_package(target, a.name):
                    out.add(".".join(target))
        elif isinstance(node, ast.Import):
            out.update(a.name.removeprefix("addnorm").removeprefix(".") for a in node.names
                       if a.name == "addnorm" or a.name.startswith("addnorm."))
    return out & known


def _import_graph() -> dict[str, set[str]]:
    """{module: the addnorm modules it imports}, for every module of src/addnorm (imports inside functions
    count: a lazy import is still a dependency)."""
    paths = list(SRC.rglob("*.py"))
    known = {_module(p) for p in paths}
    return {_module(p): _module_imports(p, known) - {_module(p)} for p in paths}


def _import_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order, the first repeated at the end), or None: a depth-first
    search that meets a module still on its own path. A package's __init__ imported by its own submodules is a
    circle too."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d in graph and d not in state:
                found = visit(d, path + [d])
                if found:
                    return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_a_compiled_submodule_is_not_its_package():
    """library.py imports the C extension _addnorm_cpu from its package: that is the extension, not the package's
    __init__ (which imports library.py)."""
    known = {_module(p) for p in SRC.rglob("*.py")}
    assert "kernels.cpu" not in _module_imports(SRC / "kernels" / "cpu" / "library.py", known)
    assert "kernels.cpu.library" in _module_imports(SRC / "kernels" / "cpu" / "__init__.py", known)
    assert "" in _module_imports(SRC / "bench" / "frontier_cost.py", known)  # from .. import use_backend


def test_the_circle_search_finds_a_circle():
    assert _import_circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert _import_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _import_circle({"x": {"a"}, "a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_no_import_circle_among_all_modules():
    """No module of src/addnorm reaches itself again through imports (grid.py imported report/study_html.py,
    which imported grid.py back; benchmark/add_norm.py and fused_forms.py, gpu.py and gpu_forms.py imported each
    other)."""
    circle = _import_circle(_import_graph())
    assert circle is None, "import circle: " + " -> ".join(circle)


@pytest.mark.parametrize("low, high", [("bench", "experiments"), ("experiments", "bench")])
def test_bench_and_experiments_do_not_import_each_other(low, high):
    """What both need (timing, the corpus, result files) lives below both, in harness/."""
    graph = _import_graph()
    ties = sorted(f"{m} -> {d}" for m, deps in graph.items() if m.split(".")[0] == low
                  for d in deps if d.split(".")[0] == high)
    assert not ties, ties


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
