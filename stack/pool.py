"""Task pools: a path is a task (a folder with ``task.toml``) or a pool (a folder
whose immediate sub-folders with ``task.toml`` are its tasks, sorted by name).

A task's family is ``[metadata] category`` in its task.toml. ``expand`` turns the
configured paths into the ordered list of task folders, filtered by family;
anything else (a missing path, a folder that is neither, an unreadable
task.toml, a family no task has) is a ConfigError naming the path.
"""

from __future__ import annotations

import tomllib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harnessrl.errors import ConfigError


def is_task(path: Path) -> bool:
    return (path / "task.toml").is_file()


def family(task: Path) -> str:
    """``[metadata] category`` of a task ('' when unset)."""
    try:
        data = tomllib.loads((task / "task.toml").read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{task / 'task.toml'}: unreadable task config: {e}") from e
    meta = data.get("metadata", {})
    value = meta.get("category", "") if isinstance(meta, dict) else ""
    return value if isinstance(value, str) else ""


def tasks_of(path: Path) -> list[Path]:
    """The tasks a path stands for: itself, or a pool's tasks."""
    if not path.exists():
        raise ConfigError(f"task path {path} does not exist")
    if is_task(path):
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_dir() and is_task(p))
        if found:
            return found
    raise ConfigError(f"{path} is neither a task (no task.toml) nor a pool (no sub-folder with a task.toml)")


def expand(paths: Sequence[Path], families: Sequence[str] = ()) -> list[Path]:
    """Task folders of ``paths`` (tasks or pools), each once, in order; ``families``
    keeps only tasks whose category is one of them."""
    seen: dict[Path, None] = {}
    for path in paths:
        for task in tasks_of(Path(path)):
            seen.setdefault(task.resolve(), None)
    tasks = list(seen)
    if families:
        wanted = set(families)
        tasks = [t for t in tasks if family(t) in wanted]
        if not tasks:
            shown = ", ".join(str(p) for p in paths)
            raise ConfigError(f"no task of families {sorted(wanted)} under {shown}")
    return tasks


def pool_summary(path: Path) -> dict[str, Any]:
    """A task or pool's path, task count and tasks per family (sorted by family)."""
    tasks = tasks_of(Path(path))
    families = Counter(family(t) for t in tasks)
    return {"path": str(path), "tasks": len(tasks), "families": dict(sorted(families.items()))}
