"""What `pip install /path/to/clone` and a wheel built from it contain: every package, the C sources and headers
(the C++ autograd nodes are built from them against the user's torch), the package data, and the LICENSE.

The fast checks run setuptools' own steps on a copy of the project (build_py: the packages and their data, exactly
what goes into the wheel besides the compiled library; dist_info: the metadata and the licence files), so they take
seconds. The full `pip wheel` compiles the C library (minutes on two cores) and runs where ADDNORM_TEST_WHEEL=1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "addnorm"
C_FILES = sorted(p.name for p in (SRC / "kernels" / "cpu").iterdir() if p.suffix in (".c", ".h", ".cpp"))
PACKAGES = sorted(str(p.parent.relative_to(ROOT / "src")) for p in SRC.rglob("__init__.py")
                  if "__pycache__" not in p.parts and "kernels_repo" not in p.parts)


def _copy_project(dest: Path) -> Path:
    """The files a build reads, without build outputs, so that nothing is written into the working tree."""
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    return dest


def _setup(project: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "setup.py", "-q", *args], cwd=project, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_license_is_mit_as_pyproject_says():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) 2026 the addnorm authors" in text
    assert 'license = "MIT"' in (ROOT / "pyproject.toml").read_text()


def test_build_holds_every_package_the_c_sources_and_the_package_data(tmp_path):
    project = _copy_project(tmp_path / "project")
    _setup(project, "build_py", "--build-lib", str(tmp_path / "lib"))
    lib = tmp_path / "lib"
    for package in PACKAGES:
        assert (lib / package / "__init__.py").is_file(), f"{package} is not in the build"
    assert C_FILES and "addnorm_cpu.c" in C_FILES
    for name in C_FILES:
        assert (lib / "addnorm" / "kernels" / "cpu" / name).is_file(), f"{name} is not in the build"
    repo = lib / "addnorm" / "interop" / "kernels_repo"
    assert (repo / "README.md").is_file() and list(repo.glob("build/*/metadata.json")), "the kernels repository"
    assert list(repo.glob("build/*/*/*.py")), "the kernels repository's layer module"


def test_metadata_carries_the_license_and_the_extras(tmp_path):
    project = _copy_project(tmp_path / "project")
    (tmp_path / "meta").mkdir()
    _setup(project, "dist_info", "--output-dir", str(tmp_path / "meta"))
    info = next((tmp_path / "meta").glob("addnorm-*.dist-info"))
    meta = (info / "METADATA").read_text()
    assert "License-Expression: MIT" in meta and (info / "licenses" / "LICENSE").is_file()
    for extra in ("hf", "gpu", "max", "kernels", "tensorboard", "test", "peers"):
        assert f"Provides-Extra: {extra}" in meta, extra
    assert "addnorm = addnorm.cli.main:main" in (info / "entry_points.txt").read_text()


@pytest.mark.skipif(os.environ.get("ADDNORM_TEST_WHEEL") != "1",
                    reason="compiles the C library (minutes on two cores): set ADDNORM_TEST_WHEEL=1")
def test_pip_wheel_builds_with_the_compiled_library(tmp_path):
    project = _copy_project(tmp_path / "project")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ".",
                           "-w", str(tmp_path / "dist")], cwd=project, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("addnorm-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert any(n.startswith("addnorm/kernels/cpu/_addnorm_cpu") and n.endswith(".so") for n in names)
    for name in C_FILES:
        assert f"addnorm/kernels/cpu/{name}" in names, name
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "addnorm/interop/kernels_repo/README.md" in names
