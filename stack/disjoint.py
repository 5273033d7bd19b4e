"""Disjointness of a training pool and an evaluation pool.

Two levels of overlap are reported, one ``Overlap`` per (train task, eval task,
level) that applies:

* ``instance``: the same task id (``[task] name``, else the directory name), or
  the same content: the digest of the instruction (surrounding whitespace
  stripped) together with every file under ``tests/`` (relative path, mode and
  bytes). Copying a task under a new name is therefore still an overlap.
* ``repository``: the same ``[metadata] repo`` (converted SWE-style tasks carry
  ``repo`` and ``base_commit``). Training on one commit of a repository and
  evaluating on another still leaks the code base, so this is reported even
  when the commits differ; the detail names both commits.

Paths may be task directories or pools (a directory whose immediate
subdirectories holding ``task.toml`` are its tasks; ``stack.pool``). A path that
is neither is a ``ConfigError``; a malformed task is the sandbox's ``TaskError``.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from services.sandbox.task.model import Task, load_task
from stack import pool

Level = Literal["repository", "instance"]


@dataclass(frozen=True)
class Overlap:
    """One training task that overlaps one evaluation task at ``level``."""

    level: Level
    train_task: str
    eval_task: str
    detail: str


@dataclass(frozen=True)
class _Identity:
    label: str  # what a report shows: the task id and its directory
    task_id: str
    digest: str
    repo: str | None
    base_commit: str | None


def task_dirs(paths: Iterable[Path]) -> list[Path]:
    """Each path as itself (a task) or as its tasks (a pool, sorted): ``stack.pool.tasks_of``."""
    return [task for path in paths for task in pool.tasks_of(Path(path))]


def content_digest(task: Task) -> str:
    """sha256 of the instruction and the verifier's files: equal digests mean the same exercise."""
    h = hashlib.sha256()
    h.update(task.instruction.strip().encode())
    h.update(b"\0")
    tests = task.tests_dir
    for path in sorted(tests.rglob("*")):
        if path.is_file():
            h.update(f"{path.relative_to(tests).as_posix()} {path.stat().st_mode & 0o111:o}\n".encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _identity(path: Path) -> _Identity:
    task = load_task(path)
    meta = task.config.metadata
    repo = meta.get("repo")
    commit = meta.get("base_commit")
    return _Identity(
        label=f"{task.task_id} ({path})",
        task_id=task.task_id,
        digest=content_digest(task),
        repo=str(repo) if repo else None,
        base_commit=str(commit) if commit else None,
    )


def find_overlaps(train: Sequence[Path], evaluation: Sequence[Path]) -> list[Overlap]:
    """Every overlap between the two sides, instance level first, then by task."""
    train_ids = [_identity(p) for p in task_dirs(train)]
    eval_ids = [_identity(p) for p in task_dirs(evaluation)]
    by_id: dict[str, list[_Identity]] = defaultdict(list)
    by_digest: dict[str, list[_Identity]] = defaultdict(list)
    by_repo: dict[str, list[_Identity]] = defaultdict(list)
    for e in eval_ids:
        by_id[e.task_id].append(e)
        by_digest[e.digest].append(e)
        if e.repo:
            by_repo[e.repo].append(e)
    found: list[Overlap] = []
    for t in train_ids:
        instance: dict[str, list[str]] = defaultdict(list)
        for e in by_id.get(t.task_id, []):
            instance[e.label].append(f"same task id {t.task_id!r}")
        for e in by_digest.get(t.digest, []):
            instance[e.label].append("same instruction and tests")
        for label, reasons in instance.items():
            found.append(Overlap("instance", t.label, label, "; ".join(reasons)))
        for e in by_repo.get(t.repo, []) if t.repo else []:
            commits = f"train at {t.base_commit or '?'}, eval at {e.base_commit or '?'}"
            found.append(Overlap("repository", t.label, e.label, f"same repo {t.repo!r} ({commits})"))
    found.sort(key=lambda o: (o.level != "instance", o.train_task, o.eval_task))
    return found


def format_overlaps(overlaps: Sequence[Overlap]) -> str:
    """A listing, one overlap per line, for the CLI and ``run``'s refusal."""
    return "\n".join(f"{o.level}: {o.train_task} <-> {o.eval_task}: {o.detail}" for o in overlaps)
