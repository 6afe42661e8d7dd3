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
