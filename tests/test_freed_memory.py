"""``give_back_freed_memory``: heap memory freed inside a process goes back to the system,
which glibc does not do by itself for blocks freed below the heap's top."""

from __future__ import annotations

import sys

import pytest

from quantbench.machine import _malloc_trim, give_back_freed_memory


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or _malloc_trim() is None, reason="needs glibc"
)
def test_blocks_freed_below_the_heap_top_leave_the_resident_set():
    """2,000 blocks of 64 KiB (below glibc's mmap threshold: heap blocks), each page touched,
    all freed but the last (which keeps the heap's top from shrinking on its own): 125 MiB
    freed in the middle of the heap, of which most must leave the resident set."""
    blocks = [bytearray(64 << 10) for _ in range(2000)]
    for block in blocks:
        block[::4096] = b"\1" * len(block[::4096])
    last = blocks[-1]
    del blocks
    before = _resident_bytes()
    give_back_freed_memory()
    assert before - _resident_bytes() > 100 << 20
    assert last[0] == 1  # still alive: the heap's top stayed in use
