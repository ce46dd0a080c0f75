"""Progress off a terminal: long work prints a plain line now and then, short work nothing."""

from __future__ import annotations

from quantbench import progress


def test_without_a_terminal_long_work_says_where_it_is(monkeypatch, capsys):
    clock = iter([0.0, 10.0, 31.0, 35.0, 62.0])  # start, then one reading per advance
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with progress.progress_bar("Ranking", total=64, unit="ops") as advance:
        for _ in range(4):
            advance(1)
    err = capsys.readouterr().err.splitlines()
    assert err == ["Ranking: 2/64 ops, 31 s", "Ranking: 4/64 ops, 62 s"]


def test_not_shown_is_silent(capsys):
    with progress.progress_bar("Ranking", total=3, show=False) as advance:
        advance(3)
    assert capsys.readouterr().err == ""
