"""Shared fixtures: tiny models built in code, an isolated stats cache, a CLI runner."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
EXAMPLE = REPO / "examples" / "tinycnn"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own statistics cache (never the user's ~/.cache)."""
    monkeypatch.setenv("QUANTBENCH_CACHE", str(tmp_path_factory.mktemp("qb-cache")))


@pytest.fixture(autouse=True)
def _isolated_error_files(tmp_path_factory, monkeypatch):
    """An internal error's traceback file goes to the test's own folder, not the system temp
    folder (every ``make test`` left one there)."""
    from quantbench.cli import ERROR_DIR_ENV

    monkeypatch.setenv(ERROR_DIR_ENV, str(tmp_path_factory.mktemp("qb-errors")))


def _error_files() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("quantbench-error-*.txt"))


@pytest.fixture(autouse=True, scope="session")
def _no_error_files_left_in_temp(tmp_path_factory):
    """Fail the session when a test left a traceback file in the system temp folder: it ran
    quantbench without the env var (a subprocess given its own environment?). Other sessions
    share /tmp, so only files naming this session's folders count."""
    before = _error_files()
    yield
    ours = str(tmp_path_factory.getbasetemp())
    left = sorted(
        str(f) for f in _error_files() - before if ours in f.read_text(errors="replace")
    )
    from quantbench.cli import ERROR_DIR_ENV

    assert not left, f"tests left {left}: pass {ERROR_DIR_ENV} (tests/conftest.py) to quantbench"


@pytest.fixture()
def cnn_path(tmp_path) -> Path:
    return synthetic.save(synthetic.small_cnn(), tmp_path / "cnn.onnx")


@pytest.fixture()
def cnn_data(tmp_path) -> Path:
    path = tmp_path / "calib.npz"
    np.savez(path, input=synthetic.images(40))
    return path


@pytest.fixture()
def run_cli(capsys) -> Callable[..., tuple[int, str, str]]:
    """Run ``quantbench ARGS`` in-process; returns (exit code, stdout, stderr)."""
    from quantbench import cli

    def run(*args: object) -> tuple[int, str, str]:
        old = sys.argv
        sys.argv = ["quantbench", *map(str, args)]
        code = 0
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.argv = old
        out, err = capsys.readouterr()
        return code, out, err

    return run


def require_example() -> Path:
    if not (EXAMPLE / "tinycnn.onnx").is_file():
        pytest.skip("bundled example examples/tinycnn/ not generated")
    return EXAMPLE


def exact_session(model: str | Path | bytes):
    """An onnxruntime CPU session running ``model`` as written: basic graph optimizations only,
    so no Q/DQ pair is fused into onnxruntime's integer kernels. On x86 without VNNI those
    saturate int16 sums (an AVX2-only AMD EPYC scored a CNN's INT8 model cosine 0.90 to FP32
    fused, 0.9999 as written) and would be a wrong reference; quantbench's own sessions turn
    that fusion off on such CPUs (quantbench.backends.onnxruntime.saturating_int8_kernels).
    onnxruntime's other Q/DQ rewrites are off too (they round an FP32 bias to int32)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    from quantbench.backends.onnxruntime import NO_QDQ_REWRITES

    options.add_session_config_entry(NO_QDQ_REWRITES, "1")
    source = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
