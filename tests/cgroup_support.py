"""Helpers of the cgroup v2 tests: the host's cgroup2 mount, this process's cgroup
there, and a test cgroup removed with everything in it moved back out."""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from services.sandbox.backends.cgroups import parse_proc_cgroup, under


def cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        if fs.split()[0] == "cgroup2":
            return Path(fields.split()[4])
    return None


def my_v2_cgroup(mount: Path) -> Path:
    _, path = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    assert path is not None
    return under(mount, path)


def remove_tree(group: Path, home: Path) -> None:
    """Moves whatever is left in ``group`` (this test process, or leftovers) out, then removes it."""
    for sub in [*sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), group]:
        for pid in (sub / "cgroup.procs").read_text().split():
            try:
                (home / "cgroup.procs").write_text(pid)
            except OSError as e:
                assert e.errno == errno.ESRCH
        sub.rmdir()


def read_words(path: Path) -> set[str]:
    return set(path.read_text().split())


@contextlib.contextmanager
def this_process_in_a_fresh_cgroup(mount: Path) -> Iterator[Path]:
    """A fresh cgroup under ``mount`` holding this process, as a worker's own cgroup would;
    the process moves back to where it was and the cgroup goes at the end."""
    home = my_v2_cgroup(mount)
    own = mount / f"hrl-test-{uuid.uuid4().hex[:8]}"
    own.mkdir()
    try:
        (own / "cgroup.procs").write_text(str(os.getpid()))
        yield own
    finally:
        remove_tree(own, home)
