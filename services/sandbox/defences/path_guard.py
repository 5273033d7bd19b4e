"""The agent must not gain from the verifier's privileges (``task/verifier_policy.py`` says
who runs ``tests/test.sh`` with what network): ``revert_path_dirs`` reverts every change of the
agent's in a workspace directory on the verifier's ``PATH`` (a planted ``python3`` or
``pytest`` the verifier's script would run as root); on docker, the agent's changes outside
the workspace on the routes root follows (its PATH directories, ``ROOT_ROUTES``) are reverted
too (``route_changes``, ``clear_script``), and set-id bits of the agent's files cleared.
"""

from __future__ import annotations

import filecmp
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from services.sandbox.defences.runner_guard import CONFIG_FILES
from services.sandbox.task.model import Task
from services.sandbox.task.verifier_policy import verifier_path

# Directories root reads or runs from implicitly (shell start-up files, apt/dpkg hooks, cron,
# ld.so.preload, profile.d, root's HOME), besides every PATH directory.
ROOT_ROUTES = ("/etc", "/root", "/usr/local", "/var/spool/cron", "/var/lib/dpkg/info")
# Files the engine bind-mounts into every container (not the agent's, not in the image).
_ENGINE_FILES = frozenset({"/etc/hostname", "/etc/hosts", "/etc/resolv.conf"})
PATH_SHADOW = "path-shadow"
ROOT_ROUTE = "root-route"
LOOKUP_ROUTE = "lookup-route"


def workspace_path_dirs(path_value: str, workdir: PurePosixPath) -> list[PurePosixPath]:
    """The PATH entries inside the workspace, relative to it ('.' for the workdir itself)."""
    out: list[PurePosixPath] = []
    for entry in path_value.split(":"):
        p = PurePosixPath(entry) if entry.startswith("/") else None
        if p is not None and p.is_relative_to(workdir) and p.relative_to(workdir) not in out:
            out.append(p.relative_to(workdir))
    return out


def revert_path_dirs(current: Path, pristine: Path, rel_dirs: list[PurePosixPath]) -> list[str]:
    """Reverts every entry the agent added or changed in the workspace's PATH directories
    (``current`` against ``pristine``, both host copies of the workspace): a command there
    shadows the image's of that name for the verifier, who may be root. Returns tamper
    events ``path-shadow:<path>``."""
    events: list[str] = []
    for rel in rel_dirs:
        here, before = current / rel, pristine / rel
        if here.is_symlink() or not here.is_dir():
            if here.is_symlink() or (here.exists() and not before.is_dir()):
                _remove(here)
                events.append(f"{PATH_SHADOW}:{rel}")
            continue
        for entry in sorted(here.iterdir()):
            old = before / entry.name
            if _same(entry, old):
                continue
            _remove(entry)
            if old.exists() or old.is_symlink():
                _copy(old, entry)
            events.append(f"{PATH_SHADOW}:{rel / entry.name}")
    return events


def guard_workspace(current: Path, pristine: Path, sandbox_env: dict[str, str], task: Task, workdir: str) -> list[str]:
    """``revert_path_dirs`` for the verifier's PATH of ``task`` (``current``: the workspace or its host copy)."""
    rel_dirs = workspace_path_dirs(verifier_path(sandbox_env, task), PurePosixPath(workdir))
    return revert_path_dirs(current, pristine, rel_dirs)


@dataclass(frozen=True)
class RouteChanges:
    """The agent's changes (``docker diff`` of its container) on root's routes outside the
    workspace: files it added (removed before verify) and files it changed (restored from
    the image), whoever owns them: a world-writable file of the image counts."""

    added: list[str]
    changed: list[str]


def route_changes(diff: list[dict[str, object]], path_value: str, workdir: PurePosixPath) -> RouteChanges:
    """Filters a container's diff (``Path``, ``Kind``: 0 changed, 1 added, 2 deleted) to
    root's routes: every PATH directory outside the workspace and ``ROOT_ROUTES``, each
    with what lies under it (a tools prefix's ``bin`` and its ``lib``, ``/etc/apt``...)."""
    roots = [PurePosixPath(e) for e in path_value.split(":") if e.startswith("/")]
    roots = [r for r in roots if not r.is_relative_to(workdir)] + [PurePosixPath(r) for r in ROOT_ROUTES]
    return _outside_workspace(diff, workdir, lambda path: any(path.is_relative_to(r) and path != r for r in roots))


def lookup_changes(diff: list[dict[str, object]], import_dirs: tuple[str, ...], workdir: PurePosixPath) -> RouteChanges:
    """The agent's changes (a container's diff) outside the workspace on the verifier's
    lookup paths, found by mechanism: anything under a directory its Python imports from
    (``import_dirs``, ``module_shadow``: a site-packages or PYTHONPATH directory the agent's
    user can write, a uid-1000 venv), and, in every parent of WORKDIR, the files pytest
    looks for there (its config files, ``runner_guard.CONFIG_FILES``, and ``conftest``):
    ``locate_config`` walks up from the arguments to ``/``."""
    roots = [PurePosixPath(d) for d in import_dirs if d.startswith("/")]
    roots = [r for r in roots if not r.is_relative_to(workdir) and r != PurePosixPath("/")]
    parents = set(workdir.parents)

    def on_lookup_path(path: PurePosixPath) -> bool:
        under_import = any(path.is_relative_to(r) and path != r for r in roots)
        config_above = path.parent in parents and (path.name in CONFIG_FILES or path.name.startswith("conftest"))
        return under_import or config_above

    return _outside_workspace(diff, workdir, on_lookup_path)


def _outside_workspace(
    diff: list[dict[str, object]], workdir: PurePosixPath, keep: Callable[[PurePosixPath], bool]
) -> RouteChanges:
    """The diff's added and changed paths outside the workspace (and not the engine's own
    files) that ``keep`` selects; deletions are not listed."""
    added: list[str] = []
    changed: list[str] = []
    for entry in diff:
        path, kind = PurePosixPath(str(entry.get("Path", ""))), entry.get("Kind")
        if path.is_relative_to(workdir) or str(path) in _ENGINE_FILES or not keep(path):
            continue
        if kind == 1:
            added.append(str(path))
        elif kind == 0:
            changed.append(str(path))
    return RouteChanges(added=added, changed=changed)


def clear_script(added: list[str], changed: list[str], agent_uid: int) -> str:
    """Root's shell script before verify, in the verifier's container: removes the agent's
    ``added`` files (not directories: what they hold is listed too), prints ``-PATH`` for
    each removed and ``~PATH`` for each of ``changed`` that is not a directory (the worker
    restores those from the image), and clears set-id bits on every file the agent owns."""
    lines = [
        f'p={shlex.quote(p)}; if [ -L "$p" ] || [ -e "$p" -a ! -d "$p" ]; then rm -f "$p" && echo "-$p"; fi'
        for p in added
    ]
    lines += [f'p={shlex.quote(p)}; if [ -L "$p" ] || [ -e "$p" -a ! -d "$p" ]; then echo "~$p"; fi' for p in changed]
    lines.append(f"find / -xdev -user {agent_uid} -perm /6000 ! -type d -exec chmod ug-s {{}} + 2>/dev/null; true")
    return "\n".join(lines)


def _same(a: Path, b: Path) -> bool:
    if a.is_symlink() or b.is_symlink():
        return a.is_symlink() and b.is_symlink() and a.readlink() == b.readlink()
    if a.is_dir() or b.is_dir():
        # PATH lookup is one level deep: a directory there is only a shadow when it is new.
        return a.is_dir() and b.is_dir()
    if not b.is_file():
        return False
    same_mode = a.stat().st_mode & 0o7777 == b.stat().st_mode & 0o7777
    return same_mode and filecmp.cmp(a, b, shallow=False)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copy2(src, dst, follow_symlinks=False)
