"""The README and docstrings say only what the code does (issue 16 item 8): each claim that is a
behaviour is checked here against the code, never against a copy of the text."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import quantbench
from quantbench import calibrators as registry
from quantbench.stats.tensorstats import TensorStats

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
#: the README's internals, moved out of it: each file's claims are checked as the README's were
DOCS = {p.name: p.read_text(encoding="utf-8") for p in sorted((REPO / "docs").glob("*.md"))}
OPTION = re.compile(r"(?<![\w-])--[A-Za-z][A-Za-z0-9-]*")


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def synopsis() -> dict[str, set[str]]:
    """Command -> the options its README synopsis names (continuation lines included)."""
    block = _section(README, "## Command line").split("```sh\n", 1)[1].split("```", 1)[0]
    found: dict[str, set[str]] = {}
    command = None
    for line in block.splitlines():
        match = re.match(r"quantbench (\w+)", line)
        if match:
            command = match[1]
        if command:
            found.setdefault(command, set()).update(OPTION.findall(line))
    return found


def help_text(run_cli, command: str) -> str:
    code, out, err = run_cli(command, "--help")
    assert code == 0, err
    return out


def test_the_synopsis_is_read():
    commands = synopsis()
    assert {"calibrate", "quantize", "compare", "recover", "sensitivity"} <= set(commands)
    assert "--extract-table" in commands["quantize"] and "--fail-below" in commands["compare"]


@pytest.mark.parametrize("command", sorted(synopsis()))
def test_every_synopsis_option_exists(run_cli, monkeypatch, command):
    """README synopsis named `quantize --to-table`, which does not exist."""
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps help text to the terminal
    text = help_text(run_cli, command)
    missing = sorted(o for o in synopsis()[command] if not re.search(rf"{o}(?![\w-])", text))
    assert missing == [], f"README synopsis of `quantbench {command}` names {missing}"


def test_every_option_the_readme_names_exists_somewhere(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    commands = ("calibrate", "inspect", "quantize", "compare", "report", "sensitivity", "recover")
    known = set()
    for command in (*commands, "build", "rewrite"):
        known.update(OPTION.findall(help_text(run_cli, command)))
    # options of other programs the README quotes (trtexec, pip, pytest)
    foreign = {"--precisionConstraints", "--layerPrecisions", "--noconftest", "--extra-index-url"}
    foreign |= {"--onnx", "--stronglyTyped", "--calib"}  # trtexec
    named = set(OPTION.findall("\n".join([README, *DOCS.values()]))) - foreign
    assert sorted(named - known) == []


def test_python_api_names_exist():
    api = _section(README, "## Python API")
    names = re.findall(r"`(quantbench(?:\.\w+)+)`", api)
    names += [f"quantbench.qdq.{n}" for n in ("quantize_model", "table_from_qdq")]
    assert len(names) >= 10
    for dotted in names:
        module, _, attr = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), dotted


def test_package_docstring_points_to_modules_that_exist():
    """quantbench/__init__.py pointed to a quantbench.api that does not exist."""
    doc = quantbench.__doc__ or ""
    names = re.findall(r"``(quantbench(?:\.\w+)+)``", doc)
    assert names
    for dotted in names:
        module, _, attr = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), dotted
    assert "quantbench.api" not in doc


def test_benchmarks_readme_counts_the_tables_of_all():
    text = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    counts = [int(n) for n in re.findall(r"the (\d+) tables of `all`", text)]
    assert counts == [len(registry.expand_methods(["all"]))]


def test_entropy_ort_uses_all_the_data_and_equals_minmax_with_its_defaults():
    """README said "degenerates to the first batch's range"; the code builds one histogram of
    all the data, whose only candidate with 128 bins is the full range."""
    rng = np.random.default_rng(3)
    first = rng.standard_normal(4000).astype(np.float32)
    second = (rng.standard_normal(4000) * 4).astype(np.float32)  # a wider later batch
    stats = TensorStats("x")
    stats.update(first)
    stats.update(second)
    whole = float(np.abs(np.concatenate([first, second])).max())
    assert registry.compute_amax("entropy:ort", stats) == pytest.approx(whole, rel=1e-6)
    assert registry.compute_amax("entropy:ort", stats) > float(np.abs(first).max()) * 2
    assert registry.compute_amax("entropy:ort-2048", stats) < whole  # more bins: a real search
    row = next(line for line in README.splitlines() if line.startswith("| `entropy:ort` |"))
    assert "first batch" not in row and "`minmax`" in row


def test_the_readme_tensorrt_section_states_facts_about_tensorrt():
    section = DOCS["tensorrt.md"]  # the README's "GPU and TensorRT" details, moved
    assert "workplace" not in section and "cannot be installed" not in section
    assert "pypi.nvidia.com" in section
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    extra = re.search(r"^tensorrt = \[(.*)\]$", pyproject, re.M)
    assert extra is not None
    for requirement in re.findall(r'"([^"]+)"', extra[1]):
        assert f"`{requirement}`" in section, requirement


def _commands() -> dict:
    import typer

    from quantbench.cli import app

    return typer.main.get_command(app).commands


@pytest.mark.parametrize("command", sorted(_commands()))
def test_bracketed_words_survive_help_rendering(run_cli, monkeypatch, command):
    """rich read `pip install 'quantbench[ray]'` in --executor's help as a style tag and printed
    `pip install 'quantbench'`, an install line that does not install Ray. typer's own
    placeholders read as code: `<bool>` after every flag, `<list[str]>`, `{model}`."""
    monkeypatch.setenv("COLUMNS", "250")
    rendered = help_text(run_cli, command)
    params = _commands()[command].params
    helps = [getattr(p, "help", "") or "" for p in params]
    wanted = {m for h in helps for m in re.findall(r"\[[A-Za-z][\w-]*\]", h)}
    if any("--executor" in getattr(p, "opts", ()) for p in params):
        assert "[ray]" in wanted
    assert sorted(w for w in wanted if w not in rendered) == []
    assert not re.findall(r"<bool>|<list\[|\{[a-z_]+\}", rendered)
    usage = next(line for line in rendered.splitlines() if "Usage:" in line)
    arguments = [p.name.upper() for p in params if p.param_type_name == "argument"]
    assert arguments and all(f" {a}" in usage for a in arguments), usage


@pytest.mark.parametrize("command", [None, *sorted(_commands())])
def test_help_sentences_are_not_broken_mid_line(run_cli, monkeypatch, command):
    """A docstring wrapped in the source kept its line break on screen: `rewrite` read "...
    or widen a" / "float16 model to float32." in the command list and in its own --help."""
    monkeypatch.setenv("COLUMNS", "250")  # wide enough that nothing wraps on its own
    code, rendered, err = run_cli(*([command] if command else []), "--help")
    assert code == 0, err
    lines = [" ".join(line.strip(" │").split()) for line in rendered.splitlines()]
    for name, cmd in _commands().items() if command is None else [(command, _commands()[command])]:
        first = " ".join(inspect.cleandoc(cmd.help or "").split("\n\n")[0].split())
        assert any(first in line for line in lines), (name, first)


def test_the_docs_folder_is_linked_and_each_file_says_its_purpose():
    """The README's internals moved to docs/: each file is linked from the README and opens
    with its title and a one-line purpose."""
    assert {"internals.md", "gpu.md", "tensorrt.md", "metrics.md"} <= set(DOCS)
    for name, text in DOCS.items():
        assert f"(docs/{name})" in README, name
        title, blank, purpose, *_ = text.split("\n")
        assert title.startswith("# ") and blank == "" and purpose.endswith("."), name
    for target, anchor in re.findall(r"\]\((docs/[\w.-]+\.md)#([\w-]+)\)", README):
        headings = re.findall(r"^#+ (.+)$", DOCS[target.removeprefix("docs/")], re.M)
        slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
        assert anchor in slugs, f"{target}#{anchor}"


def test_the_readme_states_the_python_pyproject_requires():
    """README said Python >= 3.11 while pyproject (and test_imports' vermin check) said 3.10."""
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    required = re.search(r'^requires-python = ">=\s*([\d.]+)"$', pyproject, re.M)
    assert required is not None
    stated = re.findall(r"Python ≥ ([\d.]+)", README)
    assert stated == [required[1]]


def test_the_readme_first_screen_is_a_quick_start():
    """A newcomer's first screen: the two set-up commands, how to run `quantbench` then, a
    three-command run on their own model, and what the browser tests need."""
    quick = _section(README, "## Quick start")
    block = quick.split("```sh\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in block.splitlines()] == ["make demo", "make test"]
    first_screen = "\n".join(README.splitlines()[:40])
    for needed in (". .venv/bin/activate", "pip install -e .", "--preset imagenet", "chromium"):
        assert needed in first_screen, needed
    own = quick.split("```sh\n", 2)[2].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in own] == [
        ["quantbench", "calibrate"],
        ["quantbench", "quantize"],
        ["quantbench", "compare"],
    ]
    assert all(line in first_screen for line in own)
    # the three commands chain: quantize reads calibrate's table, compare measures quantize's model
    table = own[0].split("-o ")[1].split()[0]
    model = own[1].split("-o ")[1].split()[0]
    assert f"--table {table}" in own[1] and own[2].split()[2:4] == ["fp32", model]


def test_the_readme_says_what_the_latency_numbers_are():
    """compare's console and report say what was timed: the README quotes their wording."""
    from quantbench.compare.latency import timing_note

    doc = {
        "a": {"spec": "fp32", "op_precisions": {"fp32": 20}},
        "b": {"spec": "int8", "op_precisions": {"int8": 10, "fp32": 10}},
        "latency": {
            side: {"median_ms": 1.0, "backend": "onnxruntime", "provider": "CPUExecutionProvider"}
            for side in ("A", "B")
        },
    }
    note = timing_note(doc)
    assert note is not None and f'"{note}"' in " ".join(README.split())
