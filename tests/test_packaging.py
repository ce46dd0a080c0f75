"""pyproject.toml declares what a wheel holds: a subpackage missing from ``packages`` installs
fine in editable mode and is absent from a real wheel (quantbench.recovery was), and a data file
no package-data pattern names is silently left out. Checked from the source tree, installing
nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    import tomllib  # Python >= 3.11, as the other pyproject tests

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    return pyproject["tool"]["setuptools"]


def _extension_sources() -> set[Path]:
    """The C sources setup.py compiles (``Extension(name, [sources])``): built, not shipped as
    data."""
    import ast

    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    found: set[Path] = set()
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "Extension":
            found |= {REPO / ast.literal_eval(s) for s in call.args[1].elts}
    return found


def _package_folders(setup: dict) -> dict[str, Path]:
    """Each folder with an __init__.py under the mapped roots, by the name it installs as."""
    found: dict[str, Path] = {}
    for root_name, root_dir in setup["package-dir"].items():
        root = REPO / root_dir
        for init in root.rglob("__init__.py"):
            parts = init.parent.relative_to(root).parts
            if "build" in parts:
                continue
            found[".".join((root_name, *parts))] = init.parent
    return found


def _tracked_files(folder: Path) -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", str(folder)],
            cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [REPO / name for name in listed.split("\0") if name]


def test_every_package_folder_is_a_declared_package():
    setup = _setuptools()
    on_disk = _package_folders(setup)
    declared = set(setup["packages"])
    assert not sorted(set(on_disk) - declared), (
        "folders with an __init__.py missing from [tool.setuptools] packages in pyproject.toml"
    )
    assert not sorted(declared - set(on_disk)), "declared packages with no __init__.py"


def test_every_data_file_in_a_package_folder_is_package_data():
    setup = _setuptools()
    folders = _package_folders(setup)
    owners = sorted(folders.items(), key=lambda item: len(item[1].parts), reverse=True)
    shipped: set[Path] = set()
    for package, patterns in setup.get("package-data", {}).items():
        for pattern in patterns:
            shipped |= {p for p in folders[package].glob(pattern) if p.is_file()}
    missing = []
    built = _extension_sources()
    assert built, "setup.py compiles the binning kernels"
    for root in {REPO / d for d in setup["package-dir"].values()}:
        for path in _tracked_files(root):
            if path.suffix == ".py" or not any(path.is_relative_to(d) for _, d in owners):
                continue
            if path in built:
                continue
            if path not in shipped:
                missing.append(str(path.relative_to(REPO)))
    assert not sorted(missing), "files no [tool.setuptools.package-data] pattern ships"


def test_data_is_shipped_only_as_declared():
    """include-package-data would add files setuptools guesses at and warn ~80 lines about the
    data folders (kernels/, templates/) at every ``pip install -e .``."""
    assert _setuptools()["include-package-data"] is False
