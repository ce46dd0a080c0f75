"""Progress display for long work (rich), silent when not wanted or not on a terminal."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

#: progress and warnings go to stderr, so that a command's result alone reaches stdout.
console = Console(stderr=True)
#: a command's human-readable result (inspect's tables, compare's summary) goes to stdout, so
#: that ``| less`` pages it while the warnings stay on the terminal
results = Console()

#: without a terminal, long work says where it is at most this often (seconds)
PLAIN_EVERY_S = 30.0


@contextmanager
def progress_bar(
    description: str, total: int | None, show: bool = True, unit: str = "samples"
) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``; draws a bar on a terminal; elsewhere (a log, a pipe) a plain line
    at most every :data:`PLAIN_EVERY_S` seconds, so that long work is not silent."""
    if not show:
        yield lambda n: None
        return
    if not console.is_terminal:
        yield _plain_progress(description, total, unit)
        return
    columns = [
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)


def _plain_progress(description: str, total: int | None, unit: str) -> Callable[[int], None]:
    start = last = time.monotonic()
    done = 0

    def advance(n: int) -> None:
        nonlocal done, last
        done += n
        now = time.monotonic()
        if now - last >= PLAIN_EVERY_S:
            last = now
            of = f"/{total}" if total else ""
            info(f"{description}: {done}{of} {unit}, {now - start:.0f} s")

    return advance


def warn(message: str) -> None:
    console.print(f"[yellow]warning:[/yellow] {escape(message)}", highlight=False, soft_wrap=True)


def info(message: str) -> None:
    console.print(escape(message), highlight=False, soft_wrap=True)
