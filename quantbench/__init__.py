"""quantbench: INT8 calibration and explicit quantization for TensorRT and ONNX models.

Every CLI command has a Python twin in the module of its concept
(``quantbench.calibrate.calibrate``, ``quantbench.quantize.quantize``,
``quantbench.compare.compare``, ...): the README's "Python API" section lists them, and a test
imports each name it gives.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"


def _source_tree_subpackages() -> None:
    """Run from a source checkout that was never pip-installed (the GPU machine's copy of the
    tree, ``python3 -m pytest tests/gpu``), ``quantbench.calibrators``, ``.reports``,
    ``.plugins`` and ``.configs`` are the top-level folders pyproject.toml maps into the
    package: let the package find them there. An installed copy holds them itself."""
    here = _Path(__file__).resolve().parent
    root = here.parent
    checkout = (root / "pyproject.toml").is_file() and (root / "calibrators").is_dir()
    if checkout and not (here / "calibrators").is_dir():
        __path__.append(str(root))  # noqa: F821  (the package's own search path)


_source_tree_subpackages()

__all__ = ["__version__"]
