"""Old module paths keep importing after a move: every entry of addnorm._moved.MOVED is the new module itself."""

import importlib
import sys
import warnings

import pytest

from addnorm import _moved


@pytest.mark.parametrize("old, new", sorted(_moved.MOVED.items()))
def test_an_old_path_is_the_new_module(old, new):
    real = importlib.import_module(new)
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alias = importlib.import_module(old)
    assert alias is real
    assert real.__spec__.name == new  # the alias did not take over the module's own spec
    assert any(new in str(w.message) and issubclass(w.category, DeprecationWarning) for w in caught)


def test_a_name_that_did_not_move_is_not_found():
    assert _moved.new_name("addnorm.nn") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("addnorm.no_such_module")


def test_addnorm_itself_imports_no_old_path():
    from pathlib import Path
    src = Path(_moved.__file__).parent
    for path in src.rglob("*.py"):
        text = path.read_text()
        for old in _moved.MOVED:
            for form in (f"import {old}\n", f"from {old} import", f"import {old} "):
                assert form not in text, f"{path.relative_to(src)} imports the old path {old}"


# what each moved module exported (its __all__) before it moved: every name still imports from the old path
OLD_EXPORTS = {
    "addnorm.fused_functional": ["layer_norm_add", "rms_norm_add", "parallel_add_layer_norm", "parallel_add_rms_norm"],
    "addnorm.pointwise_functional": ["add_dyt", "add_derf"],
    "addnorm.stream_functional": ["mhc_pre", "stream_read", "stream_write"],  # mhc_pre now lives in functional.mhc
    "addnorm.out_buffers": ["check_out_buffers"],
}


@pytest.mark.parametrize("old", sorted(OLD_EXPORTS))
def test_an_old_path_still_exports_its_names(old):
    import addnorm.functional

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(old)
    for name in OLD_EXPORTS[old]:
        assert getattr(module, name) is getattr(addnorm.functional, name, getattr(module, name)), (old, name)
        exec(f"from {old} import {name}", {})  # the form user code has


def test_the_most_specific_entry_wins(monkeypatch):
    """A package entry covers its submodules, except one that left the package and has its own entry -- whatever
    the order of the table's lines."""
    assert _moved.new_name("addnorm.benchmark.gpu") == "addnorm.bench.gpu"
    assert _moved.new_name("addnorm.benchmark.timing") == "addnorm.harness.timing"
    monkeypatch.setattr(_moved, "MOVED", {"a.pkg": "a.new", "a.pkg.left": "a.low.left", "a.pk": "a.other"})
    assert _moved.new_name("a.pkg.left") == "a.low.left"
    assert _moved.new_name("a.pkg.left.sub") == "a.low.left.sub"
    assert _moved.new_name("a.pkg.stays") == "a.new.stays"
    assert _moved.new_name("a.pkgx") is None  # a prefix of the name, not of its dotted path


def test_a_module_under_an_old_package_path_is_the_new_one():
    import addnorm.bench.gpu as real
    import addnorm.harness.timing as timing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from addnorm.benchmark import gpu
        from addnorm.benchmark.timing import measure

    assert gpu is real and measure is timing.measure


def test_python_dash_m_runs_a_module_by_its_old_path():
    """runpy asks the loader for the module's code; the alias hands over the new module's."""
    import subprocess

    p = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-m", "addnorm.benchmark.gpu", "--help"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "--ops" in p.stdout
