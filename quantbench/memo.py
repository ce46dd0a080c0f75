"""Memo scopes: a context variable that holds a dict of results inside a ``with`` block and
None outside it, for work whose inputs cannot change inside the block (a finished pass's
statistics, a model's reference graph) and so is done once there, never cached beyond it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any


@contextmanager
def memo_scope(var: ContextVar[dict[Any, Any] | None]) -> Iterator[None]:
    """Binds ``var`` to a fresh dict for the block; a scope opened inside another shares the
    outer one's dict (and leaves it in place when it ends)."""
    if var.get() is not None:
        yield
        return
    token = var.set({})
    try:
        yield
    finally:
        var.reset(token)
