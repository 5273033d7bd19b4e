"""Collects a trial's artifacts (the entries ``task/artifacts.py`` declares, and Harbor's
publish folder ``/logs/artifacts``) through a backend into the trial's output folder: after
the agent phase and before the verifier, best effort, under the safety rules and budget that
the declared part's docstring states with the facts from Harbor.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from services.sandbox.task.artifacts import MANIFEST, ArtifactEntry

if TYPE_CHECKING:
    from services.sandbox.backends.base import Backend, Sandbox
    from services.sandbox.task.model import Task

log = logging.getLogger(__name__)

FOLDER = "artifacts"
MAX_BYTES = 256 * 1024 * 1024
MAX_FILES = 20_000
_PROBE_TIMEOUT_S = 60.0
_MARK = "HRLART\t"
# For each path argument: one NUL-ended record "HRLART\t<i>\t<kind>\t<resolved>", kind
# missing | file | dir | other. Links are resolved as the sandbox sees them.
_PROBE = r"""exec 2>/dev/null
i=0
for p in "$@"; do
  if [ -e "$p" ]; then
    r=$(realpath -- "$p" || readlink -f -- "$p")
    if [ -z "$r" ]; then k=missing; elif [ -d "$r" ]; then k=dir; elif [ -f "$r" ]; then k=file; else k=other; fi
  else
    k=missing; r=""
  fi
  printf 'HRLART\t%s\t%s\t%s\0' "$i" "$k" "$r"
  i=$((i+1))
done
"""


@dataclass
class _Budget:
    bytes_left: int = MAX_BYTES
    files_left: int = MAX_FILES


@dataclass
class _Placed:
    files: int = 0
    dropped: int = 0
    cut: bool = False


async def collect(backend: Backend, sandbox: Sandbox, task: Task, out_dir: Path) -> list[str]:
    """Collects the task's artifacts into ``out_dir/artifacts`` with its manifest; returns the
    trial's events (one per entry). Best effort, as Harbor: never raises for the task's sake."""
    entries = list(task.config.artifacts)
    if not entries:
        return []
    root = out_dir / FOLDER
    try:
        probes = await _probe(backend, sandbox, entries)
    except Exception as e:  # broad: best effort, as Harbor (the docstring): never a reason for the task's sake
        log.warning("probing artifacts failed", exc_info=True, extra={"kv": {"trial": sandbox.spec.trial_id}})
        probes = [("failed", f"probing the sandbox failed: {type(e).__name__}: {e}")] * len(entries)
    manifest: list[dict[str, Any]] = []
    claimed = [PurePosixPath(MANIFEST)]
    budget = _Budget()
    for entry, (kind, resolved) in zip(entries, probes, strict=True):
        record = {
            "source": entry.source,
            "destination": f"{FOLDER}/{entry.relative}" if str(entry.relative) != "." else FOLDER,
            "type": _type(kind, entry),
            "status": "ok",
            "service": entry.service,
            "exclude": list(entry.exclude) if kind == "dir" else [],
            "detail": "",
        }
        if any(_overlap(entry.relative, other) for other in claimed):
            record.update(status="skipped", detail="its place under artifacts/ overlaps an earlier entry's")
        elif kind not in ("file", "dir"):
            why = {
                "missing": "no such file or directory (or not readable by the sandbox user)",
                "failed": resolved,
            }
            record.update(status="failed", detail=why.get(kind, "not a regular file or a directory"))
        else:
            claimed.append(entry.relative)
            record.update(await _fetch(backend, sandbox, entry, resolved, kind == "dir", root, budget))
        manifest.append(record)
    await asyncio.to_thread(_write_manifest, root, manifest)
    return [f"artifact:{r['status']}:{r['source']}" for r in manifest]


async def collect_published(backend: Backend, sandbox: Sandbox, task: Task, out_dir: Path) -> list[str]:
    """Harbor's convention entry: ``/logs/artifacts`` into ``out_dir/artifacts/logs/artifacts``,
    its record first in the manifest; an event when it held something. Best effort."""
    published = sandbox.paths.published
    if any(e.path == published and e.service in (None, "main") for e in task.config.artifacts):
        return []  # the task's own entry replaced it (collected before the verifier)
    entry = ArtifactEntry(source=str(published))
    root = out_dir / FOLDER
    record: dict[str, Any] = {"source": entry.source, "destination": f"{FOLDER}/{entry.relative}"}
    record |= {"type": "directory", "status": "ok", "service": None, "exclude": [], "detail": ""}
    manifest = await asyncio.to_thread(read_manifest, out_dir)
    if any(_overlap(entry.relative, PurePosixPath(r["destination"]).relative_to(FOLDER)) for r in manifest):
        record.update(status="skipped", detail="its place under artifacts/ overlaps an earlier entry's")
    else:
        existed = await asyncio.to_thread(root.is_dir)
        record.update(await _fetch(backend, sandbox, entry, str(published), True, root, _Budget(), empty_ok=True))
        if record["status"] == "empty" and not manifest:
            if not existed:
                await asyncio.to_thread(shutil.rmtree, root, True)
            return []  # nothing collected at all: no folder, no manifest
    await asyncio.to_thread(_write_manifest, root, [record, *manifest])
    return [] if record["status"] == "empty" else [f"artifact:{record['status']}:{entry.source}"]


async def _probe(backend: Backend, sandbox: Sandbox, entries: list[ArtifactEntry]) -> list[tuple[str, str]]:
    """(kind, resolved path) of each entry, as the sandbox user sees them after the agent."""
    from services.sandbox.backends.base import ExecRequest, Network, Phase

    request = ExecRequest(
        argv=["/bin/sh", "-c", _PROBE, "probe", *(str(e.path) for e in entries)],
        phase=Phase.AGENT,
        timeout_s=_PROBE_TIMEOUT_S,
        network=Network.NONE,
    )
    result = await backend.exec(sandbox, request)
    found: dict[int, tuple[str, str]] = {}
    for record in result.output.decode(errors="surrogateescape").split("\0"):
        start = record.find(_MARK)
        if start < 0:
            continue
        fields = record[start + len(_MARK) :].split("\t", 2)
        if len(fields) == 3 and fields[0].isdigit():
            found[int(fields[0])] = (fields[1], fields[2])
    if len(found) != len(entries):
        tail = result.output.decode(errors="replace")[-300:]
        raise RuntimeError(
            f"the probe answered for {len(found)} of {len(entries)} source(s) (exit {result.exit_code}): {tail}"
        )
    return [found[i] for i in range(len(entries))]


async def _fetch(
    backend: Backend,
    sandbox: Sandbox,
    entry: ArtifactEntry,
    resolved: str,
    is_dir: bool,
    root: Path,
    budget: _Budget,
    *,
    empty_ok: bool = False,
) -> dict[str, Any]:
    """Downloads one resolved source to a private staging folder, then places what is safe;
    ``empty_ok``: an empty directory is status ``empty`` and placed nowhere (Harbor's mounted
    convention folder)."""
    await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
    staging = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=".staging-", dir=root))
    try:
        fetched = staging / "x"
        try:
            await backend.download(sandbox, PurePosixPath(resolved), fetched)
        except Exception as e:  # broad: any backend's download fault is this entry's 'failed' status, no more
            kv = {"trial": sandbox.spec.trial_id, "source": entry.source}
            log.info("an artifact could not be copied out", exc_info=True, extra={"kv": kv})
            where = "" if resolved == str(entry.path) else f" (resolved to {resolved})"
            return {"status": "failed", "detail": f"copying it out failed{where}: {type(e).__name__}: {e}"}
        if empty_ok and await asyncio.to_thread(_empty_dir, fetched):
            return {"status": "empty"}
        target = root / entry.relative
        placed = await asyncio.to_thread(_place, fetched, target, is_dir, entry.exclude, budget)
    finally:
        await asyncio.to_thread(shutil.rmtree, staging, True)
    notes = []
    if placed.dropped:
        notes.append(f"{placed.dropped} link(s) out of it or special file(s) dropped")
    if placed.cut:
        notes.append(f"cut at the trial's cap ({MAX_BYTES} bytes, {MAX_FILES} files): {placed.files} file(s) kept")
        return {"status": "failed", "detail": "; ".join(notes)}
    return {"status": "ok", "detail": "; ".join(notes)}


def drop_planted(folder: Path) -> list[str]:
    """Before a verifier runs: removes every link (and anything not a file or directory) the
    agent left in the worker's folder behind /logs/artifacts. The verifier (root on docker)
    may write there, as Harbor's does; a planted link would carry that write anywhere, the
    reward files included. Returns a tamper note per entry removed; raises when one cannot
    be (the verify must not run then)."""
    notes: list[str] = []
    if not folder.is_dir() or folder.is_symlink():
        return notes
    for here, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = Path(here) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                continue
            os.unlink(path)
            notes.append(
                f"/logs/artifacts/{path.relative_to(folder)}: a link or special file, removed before the verifier"
            )
    return notes


def _empty_dir(path: Path) -> bool:
    if not path.is_dir() or path.is_symlink():
        return not path.exists() and not path.is_symlink()
    with os.scandir(path) as it:
        return not any(True for _ in it)


def _place(src: Path, dst: Path, is_dir: bool, exclude: list[str], budget: _Budget) -> _Placed:
    placed = _Placed()
    if not is_dir:
        if not stat.S_ISREG(os.lstat(src).st_mode):
            placed.dropped += 1
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            _copy_file(src, dst, budget, placed)
        return placed
    dst.mkdir(parents=True, exist_ok=True)
    _place_dir(src, dst, src, PurePosixPath(), exclude, budget, placed)
    return placed


def _place_dir(
    top: Path, dst: Path, here: Path, rel: PurePosixPath, exclude: list[str], budget: _Budget, placed: _Placed
) -> None:
    with os.scandir(here) as it:
        children = sorted(it, key=lambda d: d.name)
    for child in children:
        if placed.cut:
            return
        child_rel = rel / child.name
        if excluded(child_rel, exclude):
            continue
        mode = child.stat(follow_symlinks=False).st_mode
        out = dst / child_rel
        if stat.S_ISDIR(mode):
            out.mkdir(parents=True, exist_ok=True)
            _place_dir(top, dst, Path(child.path), child_rel, exclude, budget, placed)
        elif stat.S_ISREG(mode):
            _copy_file(Path(child.path), out, budget, placed)
        elif stat.S_ISLNK(mode) and _link_stays_inside(child_rel, os.readlink(child.path)):
            out.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(child.path), out)
        else:
            placed.dropped += 1


def _copy_file(src: Path, dst: Path, budget: _Budget, placed: _Placed) -> None:
    size = os.lstat(src).st_size
    if size > budget.bytes_left or budget.files_left <= 0:
        placed.cut = True
        return
    shutil.copyfile(src, dst, follow_symlinks=False)
    os.chmod(dst, 0o644)
    budget.bytes_left -= size
    budget.files_left -= 1
    placed.files += 1


def _link_stays_inside(rel: PurePosixPath, target: str) -> bool:
    """A relative link whose target stays within the collected directory."""
    if target.startswith("/"):
        return False
    joined = os.path.normpath(os.path.join(str(rel.parent), target))
    return joined != ".." and not joined.startswith("../")


def excluded(rel: PurePosixPath, patterns: list[str]) -> bool:
    """tar ``--exclude`` as Harbor passes it (unanchored, ``*`` matches ``/``): a pattern
    matching the member's path or any tail of it after a ``/``."""
    parts = rel.parts
    tails = ["/".join(parts[i:]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(tail, pattern) for pattern in patterns for tail in tails)


def _overlap(a: PurePosixPath, b: PurePosixPath) -> bool:
    return a == b or a in b.parents or b in a.parents


def _type(kind: str, entry: ArtifactEntry) -> str:
    """The manifest's type; for a source that is not there, Harbor's guess (a suffix: a file)."""
    if kind in ("file", "dir"):
        return "directory" if kind == "dir" else "file"
    return "file" if entry.path.suffix else "directory"


def _write_manifest(root: Path, manifest: list[dict[str, Any]]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2))


def read_manifest(out_dir: Path) -> list[dict[str, Any]]:
    """The manifest of a trial's output folder (``TrialOutcome.artifacts_dir``); [] when none."""
    path = out_dir / FOLDER / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else []
