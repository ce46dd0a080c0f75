"""Which binning kernels a process uses, and when it loads them: the C kernels from the first
value (nothing to load), numba only where they are not built and a pass is large enough to
repay its load, numpy otherwise; the bins are the same on every path."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from quantbench.collect import statspass as collect
from quantbench.stats import binning
from quantbench.stats.tensorstats import exponent_for


def test_an_unimportable_numba_falls_back_to_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the C kernels, numba is imported on first use; if that import fails (a broken
    install), binning takes the numpy path with the same bins instead of failing the
    calibration."""
    import sys

    rng = np.random.default_rng(11)
    x = (rng.standard_normal(50_000) * 2).astype(np.float32)
    x[7] = np.nan
    e = exponent_for(float(np.nanmax(np.abs(x))))
    import quantbench.stats

    monkeypatch.setenv("QUANTBENCH_BINNING", "numba")  # an install without the C kernels
    monkeypatch.setitem(sys.modules, "quantbench.stats.binning_kernels", None)  # -> ImportError
    monkeypatch.delattr(quantbench.stats, "binning_kernels", raising=False)
    binning._native.cache_clear()
    binning._kernels.cache_clear()
    try:
        assert binning.backend() == "numpy"
        got, ref = binning.scan(x, e), binning.numpy_scan(x, e)
        assert (got.lo, got.hi, got.finite, got.nan, got.inf) == (
            ref.lo, ref.hi, ref.finite, ref.nan, ref.inf,
        )  # fmt: skip
        assert np.array_equal(got.counts, ref.counts)
    finally:
        monkeypatch.undo()
        binning._native.cache_clear()
        binning._kernels.cache_clear()


_FRESH_PROCESS = """
import sys
import numpy as np
from quantbench.stats import binning
x = np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32)
first = binning.scan(x, -10)
print(binning.backend(), "numba" in sys.modules)
binning.warm_up()
again = binning.scan(x, -10)
print(binning.backend(), bool(np.array_equal(first.counts, again.counts)))
"""


def _fresh_python(code: str, *args: str, binning_path: str = "numba") -> list[str]:
    """The words ``code`` prints, run in a fresh interpreter (numba not yet imported) with the
    project and the tests' helpers importable, ``QUANTBENCH_BINNING`` set to ``binning_path``
    ("" for the default: the C kernels where built)."""
    import subprocess
    import sys

    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "QUANTBENCH_BINNING": binning_path}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, env=env
    )
    return done.stdout.split()


def test_numba_is_loaded_only_by_warm_up() -> None:
    """Without the C kernels (``QUANTBENCH_BINNING=numba`` stands for an install that could not
    build them), a process that bins before warm_up bins with numpy and never imports numba
    (its load is most of a second); after warm_up it bins with numba, the same counts."""
    assert _fresh_python(_FRESH_PROCESS) == ["numpy", "False", "numba", "True"]


def test_the_load_threshold_grows_with_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba's gain per value is shared among the cores, its load is not: 256 M values a
    usable core (hand-derived: 512 M on 2 cores, 4 G on 16)."""
    monkeypatch.setattr(collect, "usable_cores", lambda: 2)
    assert collect.compiled_min_values() == 512 * 2**20
    monkeypatch.setattr(collect, "usable_cores", lambda: 16)
    assert collect.compiled_min_values() == 4 * 2**30


def test_the_pass_expects_its_first_parts_times_the_samples() -> None:
    """Hand-derived: 2 parts of 4 samples, 1,000 values each, out of 100 samples: 25,000
    values expected; a source that does not say its samples: the 2,000 binned so far."""
    load = collect._CompiledLoad(None, 100)  # type: ignore[arg-type]  # no load at these sizes
    load.binning(1_000, 4)
    load.binning(1_000, 4)
    assert load.expected() == 25_000 and load.loading is None
    unknown = collect._CompiledLoad(None, None)  # type: ignore[arg-type]
    unknown.binning(1_000, 4)
    unknown.binning(1_000, 4)
    assert unknown.expected() == 2_000


_PASS_PROCESS = """
import sys
from pathlib import Path
import numpy as np
from synthetic import images, save, small_cnn
from quantbench.collect import statspass
from quantbench.data.sources import open_data
from quantbench.model.graph import calibration_tensors, open_graph
from quantbench.stats import binning

tmp, threshold = Path(sys.argv[1]), int(sys.argv[2])
statspass.compiled_min_values = lambda: threshold
graph = open_graph(save(small_cnn(), tmp / "m.onnx"))
np.savez(tmp / "d.npz", input=images(16, seed=7))
names = calibration_tensors(graph, "all")
stats = statspass.collect_stats(
    graph, open_data(tmp / "d.npz", graph.inputs, batch_size=2), names, show_progress=False
)
np.savez(tmp / f"counts{threshold}.npz", **{n: stats[n].counts for n in names})
print(binning.backend(), "numba" in sys.modules)
"""


def test_a_small_pass_never_loads_numba_and_a_large_one_switches_exactly(tmp_path: Path) -> None:
    """Without the C kernels, a pass expected to bin fewer values than compiled_min_values()
    never imports numba; one over it (a threshold of 1 value) loads it on a worker after its
    first part and switches mid-pass: the same counts for every tensor."""
    runs = {t: _fresh_python(_PASS_PROCESS, str(tmp_path), str(t)) for t in (1 << 40, 1)}
    assert runs[1 << 40] == ["numpy", "False"]
    assert runs[1][1] == "True"  # loaded (whether it finished before the last part is timing)
    small, large = np.load(tmp_path / f"counts{1 << 40}.npz"), np.load(tmp_path / "counts1.npz")
    assert small.files == large.files
    for name in small.files:
        assert np.array_equal(small[name], large[name]), name


def test_this_install_built_the_c_kernels() -> None:
    """pyproject builds the extension wherever a C compiler is found (as here and in CI): the
    default path is C, so the C kernels are what every other binning test checks first."""
    assert _fresh_python(_FRESH_PROCESS, binning_path="") == ["c", "False", "c", "True"]


def test_a_pass_with_the_c_kernels_never_loads_numba(tmp_path: Path) -> None:
    """Even a pass over the load threshold (1 value) bins with C from its first part, never
    importing numba (~125 MiB, most of a second), with the counts numba's path gives."""
    c_run = _fresh_python(_PASS_PROCESS, str(tmp_path), "1", binning_path="")
    assert c_run == ["c", "False"]
    c_counts = dict(np.load(tmp_path / "counts1.npz"))
    assert _fresh_python(_PASS_PROCESS, str(tmp_path), "1")[1] == "True"
    numba_counts = np.load(tmp_path / "counts1.npz")
    assert sorted(c_counts) == sorted(numba_counts.files)
    for name, counts in c_counts.items():
        assert np.array_equal(counts, numba_counts[name]), name


@pytest.mark.parametrize("path", ["numba", "numpy"])
def test_the_environment_can_ask_for_another_path(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """``QUANTBENCH_BINNING=numba`` or ``numpy`` sets the C kernels aside (to compare, or to
    work around a broken build); warm_up loads numba only where asked."""
    monkeypatch.setenv("QUANTBENCH_BINNING", path)
    binning._native.cache_clear()
    binning._kernels.cache_clear()
    try:
        binning.warm_up()
        assert binning.backend() == path
    finally:
        monkeypatch.undo()
        binning._native.cache_clear()
        binning._kernels.cache_clear()


def test_a_library_that_cannot_be_loaded_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A ``_binning_c`` file that is not a loadable library here (a copy from another machine, a
    truncated build) sets the C kernels aside with the rest of the fallback, not a traceback."""
    import importlib.util
    import sys

    broken = tmp_path / "_binning_c.so"
    broken.write_bytes(b"not a shared library")
    spec = importlib.util.spec_from_file_location("quantbench.stats._binning_c", broken)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    import quantbench.stats

    monkeypatch.delitem(sys.modules, "quantbench.stats.binning_ckernels", raising=False)
    monkeypatch.delattr(quantbench.stats, "binning_ckernels", raising=False)
    binning._native.cache_clear()
    try:
        assert binning._native() is None
        assert binning.backend() in ("numba", "numpy")
    finally:
        monkeypatch.undo()
        binning._native.cache_clear()
