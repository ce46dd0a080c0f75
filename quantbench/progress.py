"""Progress display for long work (rich), silent when not wanted or not on a terminal."""

from __future__ import annotations

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

#: progress and warnings go to stderr so stdout stays machine-readable.
console = Console(stderr=True)


@contextmanager
def progress_bar(
    description: str, total: int | None, show: bool = True, unit: str = "samples"
) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``; draws a bar on a terminal, nothing otherwise."""
    if not show or not console.is_terminal:
        yield lambda n: None
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


def warn(message: str) -> None:
    console.print(f"[yellow]warning:[/yellow] {escape(message)}", highlight=False, soft_wrap=True)


def info(message: str) -> None:
    console.print(escape(message), highlight=False, soft_wrap=True)
