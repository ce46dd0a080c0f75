"""Statistics -> one method's :class:`CalibrationTable` (the step every command shares).

Non-finite values never cost a tensor its table entry:
:class:`quantbench.stats.tensorstats.TensorStats`
bins only finite values and counts the rest, so a tensor that held a NaN somewhere is
calibrated from its finite values. Only a tensor with *no* finite value has no range; it is
left out and named by :func:`nonfinite_report`, and every command that needs it refuses the
table through the coverage check.
"""

from __future__ import annotations

from quantbench import __version__
from quantbench import calibrators as registry
from quantbench.stats.tensorstats import StatsFile, TensorStats, release_settled
from quantbench.table import CalibrationTable, Provenance

#: tensors whose tables are built together by :func:`build_tables` before their derived
#: histograms are let go
TABLE_CHUNK = 64


def build_table(stats: StatsFile, method: str) -> CalibrationTable:
    """``method``'s amax for every tensor of ``stats`` that holds at least one finite value."""
    table = _empty_table(stats, method)
    kept = _kept(stats)
    for t, amax in zip(kept, registry.compute_amaxes(method, kept), strict=True):
        table.set(t.name, amax, table.method)
    return table


def build_tables(stats: StatsFile, methods: list[str]) -> dict[str, CalibrationTable]:
    """:func:`build_table` of each of ``methods``, the same tables, built
    :data:`TABLE_CHUNK` tensors at a time: inside a settled scope each chunk's derived
    histograms serve every method, then go (``auto``'s six tables of captcha-crnn's 832
    tensors held 632 MiB of them at once)."""
    tables = {m: _empty_table(stats, m) for m in methods}
    kept = _kept(stats)
    for start in range(0, len(kept), TABLE_CHUNK):
        chunk = kept[start : start + TABLE_CHUNK]
        for method, table in tables.items():
            for t, amax in zip(chunk, registry.compute_amaxes(method, chunk), strict=True):
                table.set(t.name, amax, table.method)
        release_settled()
    return tables


def _kept(stats: StatsFile) -> list[TensorStats]:
    return [t for t in stats if not (t.count == 0 and t.has_nonfinite)]


def _empty_table(stats: StatsFile, method: str) -> CalibrationTable:
    spec, _ = registry.parse_method(method)
    return CalibrationTable(
        method=registry.canonical(method),
        algorithm=spec.trt_algorithm,
        provenance=Provenance(
            model_hash=stats.model_hash,
            data_fingerprint=stats.data_fingerprint,
            num_samples=stats.num_samples,
            tool_version=__version__,
        ),
    )


def no_finite_tensors(stats: StatsFile) -> list[str]:
    """Tensors that never held a finite value: no range, no table entry."""
    return [t.name for t in stats if t.count == 0 and t.has_nonfinite]


def nonfinite_report(stats: StatsFile, limit: int = 8) -> list[str]:
    """One warning line per kind: tensors calibrated from their finite values only (with the
    NaN/Inf counts), and tensors left out because no value was finite."""
    partial = [t for t in stats if t.has_nonfinite and t.count > 0]
    empty = no_finite_tensors(stats)
    lines = []
    if partial:
        shown = ", ".join(
            f"{t.name} ({t.nan_count} NaN, {t.inf_count} Inf of "
            f"{t.count + t.nan_count + t.inf_count})"
            for t in partial[:limit]
        )
        more = f" and {len(partial) - limit} more" if len(partial) > limit else ""
        lines.append(
            f"{len(partial)} tensor(s) held NaN/Inf; calibrated from their finite values only: "
            f"{shown}{more}"
        )
    if empty:
        shown = ", ".join(empty[:limit]) + (
            f" and {len(empty) - limit} more" if len(empty) > limit else ""
        )
        lines.append(
            f"{len(empty)} tensor(s) held no finite value and are left out of the tables "
            f"(quantize/compare refuse a table that needs them): {shown}; check the data and "
            "the ops producing them"
        )
    return lines
