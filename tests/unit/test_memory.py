"""harnessrl.memory: freed memory goes back to the system. Blocks freed in the middle of
malloc's heap stay resident until ``trim``; ``configure`` is taken by glibc's malloc."""

from __future__ import annotations

import platform

import pytest

from harnessrl import memory

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")


def resident_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_trim_returns_blocks_freed_inside_the_heap() -> None:
    blocks = [bytearray(100_000) for _ in range(1000)]  # 100 MB of blocks under the mmap threshold
    keep = blocks[-1]  # the heap's top stays in use: free() alone returns nothing below it
    del blocks
    before = resident_mib()
    assert memory.trim()
    assert before - resident_mib() > 50
    del keep


def test_configure_is_taken() -> None:
    assert memory.configure()
