"""The module structure the README promises: every module imports, no import cycles, and lower
layers never import higher ones (cli on top, then the reports; plugins depend on the core).

The import graph is read from the source with ``ast`` (imports inside functions count: a lazy
import is still a dependency), with the installed layout: ``calibrators/``, ``reports/`` and
``plugins/`` (and ``configs/``) are ``quantbench.calibrators``, ``quantbench.reports`` and
``quantbench.plugins`` (``quantbench.configs``).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = {
    "quantbench": REPO / "quantbench",
    "quantbench.calibrators": REPO / "calibrators",
    "quantbench.reports": REPO / "reports",
    "quantbench.plugins": REPO / "plugins",
    "quantbench.configs": REPO / "configs",
}


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for prefix, root in ROOTS.items():
        for path in sorted(root.rglob("*.py")) if (root / "__init__.py").is_file() else ():
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([prefix, *parts])] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The quantbench modules ``name`` imports (a ``from pkg import mod`` names the module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    skip: set[int] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if _type_checking_only(node):
            skip.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_and_relative_imports():
    graph = import_graph()
    assert "quantbench.reports" in graph["quantbench.cli"]  # imported inside a command
    assert "quantbench.errors" in graph["quantbench.model.graph"]


@pytest.mark.parametrize("name", sorted(set(modules()) - {"quantbench.__main__"}))  # runs the CLI
def test_every_module_imports(name):
    importlib.import_module(name)


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def _layer(name: str) -> int:
    """cli 3 (with clihelp, its help rendering) > reports 2 > plugins 1 > core 0
    (quantbench.quantize, the rewrite command's Python twin, sits with the plugins: it is the
    one core module that drives them)."""
    if name in ("quantbench.cli", "quantbench.__main__", "quantbench.clihelp"):
        return 3
    if name.startswith("quantbench.reports"):
        return 2
    if name.startswith("quantbench.plugins") or name == "quantbench.quantize":
        return 1
    return 0


#: The core's stages, lowest first ("" is the package's ``__init__``): a room (a folder of
#: ``quantbench/`` or a module loose in it) imports only rooms on lower floors (README
#: "Architecture" draws them). Rooms on one floor are
#: independent of each other, but for the small base modules, which may use one another.
FLOORS: list[set[str]] = [
    {"errors", "fileio", "jsonsafe", "memo", "progress", "machine", "configs", ""},  # base
    {"model"},
    {"data", "stats"},
    {"evaluate", "calibrators", "fp16range"},
    {"table", "results"},
    {"backends", "qdq"},
    {"collect", "fp16", "ort_int8", "refine"},
    {"choose"},
    {"calibrate"},
    {"compare", "inspection"},
    {"recovery", "quantize"},
]
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def _room(name: str) -> str:
    """``quantbench.stats.binning`` -> ``stats``; ``quantbench`` (the package) -> ``""``."""
    return name.split(".")[1] if name.count(".") else ""


def test_every_core_room_has_a_floor():
    rooms = {_room(n) for n in modules() if _layer(n) == 0 or n == "quantbench.quantize"}
    assert sorted(rooms - set(FLOOR)) == [], "give the new room a floor in FLOORS"


def test_stages_import_only_lower_floors():
    """The stage folders (issue 40): a lower folder never imports a higher one or a sibling."""
    core = {n for n in modules() if _layer(n) == 0 or n == "quantbench.quantize"}
    wrong = sorted(
        f"{name} -> {target}"
        for name, targets in import_graph().items()
        if name in core
        for target in targets
        if target in core
        and _room(target) != _room(name)
        and FLOOR[_room(target)] >= max(FLOOR[_room(name)], 1)  # base modules share floor 0
    )
    assert wrong == []


def test_the_floor_rule_finds_an_upward_import():
    """The rule above, fed a stats module importing the collection stage, objects."""
    assert FLOOR[_room("quantbench.collect.statspass")] >= FLOOR[_room("quantbench.stats.grid")]
    assert _room("quantbench") == "" and _room("quantbench.cli") == "cli"


def test_lower_layers_do_not_import_higher_ones():
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in import_graph().items()
        for target in targets
        if _layer(target) > _layer(name)
    )
    assert upward == []


def test_source_runs_on_the_oldest_python_pyproject_declares():
    """quantbench/data/sources.py imported tomllib (Python 3.11) while pyproject declared >= 3.10,
    the Python of Ubuntu 22.04 and of TensorRT's containers: every command failed there on import.
    vermin reads the minimum version each construct and module needs from the source."""
    import re
    import subprocess
    import sys

    import tomllib

    pytest.importorskip("vermin")
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    oldest = re.fullmatch(r">=\s*(3\.\d+)", declared)
    assert oldest is not None, declared
    files = [str(p) for p in modules().values()]
    done = subprocess.run(
        [sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())",
         f"-t={oldest[1]}-", "--violations", "--no-tips", "--eval-annotations", *files],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_checkout_never_installed_imports_its_mapped_packages(tmp_path):
    """The GPU machine runs ``python3 -m pytest tests/gpu`` on a copy of the tree that pip never
    installed: ``quantbench.calibrators`` (top-level ``calibrators/``) failed to import there, so
    the GPU tests importing it did not even collect."""
    import shutil
    import subprocess
    import sys

    for name in {root.name for root in ROOTS.values()}:
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    code = (
        "import sys\n"
        # the installed (editable) copy must not answer: only the checkout's own layout counts
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import quantbench.calibrators, quantbench.reports, quantbench.configs\n"
        "print(quantbench.calibrators.__file__, quantbench.reports.__file__)\n"
    )
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        str(tmp_path / "calibrators" / "__init__.py"),
        str(tmp_path / "reports" / "__init__.py"),
    ]
