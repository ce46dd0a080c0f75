"""``build_tables``: every method's table a chunk of tensors at a time, the derived histograms
of a settled scope let go after each chunk. The reference is ``build_table``, one method over
all tensors at once (the route every command took before), on tensors of unlike shapes."""

from __future__ import annotations

import numpy as np

from quantbench import calibrators as registry
from quantbench.choose.autocalib import default_auto_methods
from quantbench.stats import tensorstats
from quantbench.stats.tensorstats import StatsFile, TensorStats, settled
from quantbench.table import build as table_build
from quantbench.table.build import build_table, build_tables


def _stats(count: int) -> StatsFile:
    """``count`` tensors: normal, ReLU-like, heavy-tailed, spiky, constant and empty ones."""
    rng = np.random.default_rng(3)
    tensors = {}
    for i in range(count):
        t = TensorStats(f"t{i}")
        kind = i % 6
        if kind == 0:
            t.update(rng.standard_normal(4000).astype(np.float32) * (i + 1))
        elif kind == 1:
            t.update(np.maximum(rng.standard_normal(4000), 0).astype(np.float32))
        elif kind == 2:
            t.update(rng.standard_t(2, 4000).astype(np.float32))
        elif kind == 3:
            t.update(np.concatenate([np.full(3000, 0.06), rng.uniform(-0.04, 0.4, 1000)]))
        elif kind == 4:
            t.update(np.full(100, 2.5, np.float32))
        tensors[t.name] = t
    return StatsFile("h", "d", 1, tensors)


def test_chunked_tables_equal_whole_tables_and_hold_no_histograms(monkeypatch):
    monkeypatch.setattr(table_build, "TABLE_CHUNK", 4)
    stats = _stats(15)
    methods = registry.expand_methods(default_auto_methods())
    assert len(methods) >= 5
    with settled():
        chunked = build_tables(stats, methods)
        assert tensorstats._SETTLED.get() == {}  # the last chunk's arrays let go too
    for method in methods:
        whole = build_table(stats, method)
        assert chunked[method].method == whole.method
        assert chunked[method].amaxes() == whole.amaxes()
        assert list(chunked[method].entries) == list(whole.entries)  # tensor order kept
        assert {e.method for e in chunked[method].entries.values()} == {whole.method}
