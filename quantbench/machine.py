"""What this process may use of the machine it runs on (lowest layer: imports nothing of ours)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (affinity-aware where the platform tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
