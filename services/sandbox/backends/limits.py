"""Resource limits of the sandbox backends: a disk watchdog and bounded output
capture. The cgroups (memory, pids, cpu; v1 or v2) are in ``cgroups.py``, whose
names this module re-exports for the callers that predate the split.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from services.sandbox.backends.cgroups import CGROUP_ROOT, CgroupSupport, PhaseCgroup

__all__ = ["CGROUP_ROOT", "BoundedOutput", "CgroupSupport", "PhaseCgroup", "disk_usage", "drain", "watch_disk"]


class BoundedOutput:
    """Keeps the first and last ``limit/2`` bytes of a stream and counts the rest,
    so a harness that floods its output costs bounded memory and disk."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def value(self) -> bytes:
        if not self.truncated:
            return bytes(self.head + self.tail)
        skipped = self.total - len(self.head) - len(self.tail)
        return bytes(self.head) + f"\n[... {skipped} bytes dropped ...]\n".encode() + bytes(self.tail)


async def drain(stream: asyncio.StreamReader, sink: BoundedOutput) -> None:
    while chunk := await stream.read(1 << 16):
        sink.feed(chunk)


def disk_usage(paths: list[Path], stop_after: int) -> int:
    """Bytes used under ``paths`` (allocated blocks), stopping once past ``stop_after``."""
    total = 0
    stack = list(paths)
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
        if total > stop_after:
            return total
    return total


async def watch_disk(paths: list[Path], limit_bytes: int, interval_s: float, on_exceeded: asyncio.Event) -> None:
    """Sets ``on_exceeded`` once the paths use more than ``limit_bytes``."""
    while not on_exceeded.is_set():
        await asyncio.sleep(interval_s)
        used = await asyncio.to_thread(disk_usage, paths, limit_bytes)
        if used > limit_bytes:
            on_exceeded.set()
