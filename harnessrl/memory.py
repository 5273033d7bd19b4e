"""Giving freed memory back to the system (glibc's malloc), so that a process's resident
set is what it holds, not what it once held.

Measured in the quickstart (one process: engine, trainer, services; issue 48): in the
second trainer step the run's resident set was 5.18 GB, and ``malloc_trim(0)`` from
outside brought it to 3.37 GB at once: 1.8 GB were free chunks kept in malloc's arenas.
Torch's CPU tensors are plain malloc'd memory: glibc's threshold above which it maps a
block on its own (and unmaps it on free) rises with every such block freed, up to 32 MB,
after which the activations of each micro-batch and the engine's per-step tensors come
from the arenas, whose free pages are not returned.

``configure`` fixes that threshold (1 MiB: every tensor larger than that is mapped and
returned when freed); ``trim`` returns the free pages of every arena (called after each
trainer step and each weight load). Elsewhere than glibc both do nothing.
"""

from __future__ import annotations

import contextlib
import ctypes

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 1 << 20


def _libc() -> ctypes.CDLL | None:
    with contextlib.suppress(OSError):
        return ctypes.CDLL("libc.so.6")
    return None


def configure(mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Blocks of ``mmap_threshold`` bytes or more are mapped alone (a fixed threshold also
    stops glibc from raising it). Returns whether malloc took it."""
    libc = _libc()
    return bool(libc is not None and hasattr(libc, "mallopt") and libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold))


def trim() -> bool:
    """Returns the free pages of every malloc arena to the system; whether any was returned."""
    libc = _libc()
    return bool(libc is not None and hasattr(libc, "malloc_trim") and libc.malloc_trim(0))
