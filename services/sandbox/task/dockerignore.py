"""The build context a Dockerfile's COPY and ADD see: the environment directory less what its
``.dockerignore`` excludes, exactly as the docker backend's engine gets it.

Which semantics, and why: the docker backend builds through the docker SDK
(``images.build(path=...)``) on the 20.10 engine's classic builder. The SDK reads
``<context>/.dockerignore`` and leaves what it excludes out of the context it sends, with its
``PatternMatcher`` (a port of moby's fileutils: Go ``filepath.Match`` plus ``**``, ``!``
exceptions, the last matching line wins, leading ``/`` and ``./`` and ``..`` cleaned away, blank
and ``#`` lines skipped, a pattern that matches a directory excludes what is under it). It always
sends the Dockerfile and ``.dockerignore`` themselves; the classic builder reads them and then
drops each that ``.dockerignore`` names. The local backend reuses that very matcher, so both
backends copy the same files by construction. (Where the SDK's matcher differs from the Docker
CLI's Go one, both backends here follow the SDK: ``[^a]`` is not a negated class there, and a
backslash escapes nothing.)

BuildKit's Dockerfile-specific ``Dockerfile.dockerignore`` (which BuildKit prefers to
``.dockerignore``) is honoured by neither the SDK nor the classic builder, so not here either; a
task that has one gets a note in its layer's ``ignored`` (``ignored_note``) rather than silence.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from docker.utils.build import Pattern, exclude_paths

DOCKERFILE = "Dockerfile"
IGNORE_FILE = ".dockerignore"
BUILDKIT_IGNORE_FILE = f"{DOCKERFILE}.dockerignore"


def patterns(context: Path) -> list[str] | None:
    """The patterns of ``context``'s ``.dockerignore`` as the SDK reads them; None without one."""
    path = context / IGNORE_FILE
    if not path.is_file():
        return None
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def included(context: Path, rules: list[str]) -> list[str]:
    """The context's entries (files, directories, symlinks; relative, sorted) a build sees."""
    kept = exclude_paths(str(context), list(rules), dockerfile=DOCKERFILE)  # it appends to the list
    for name in (IGNORE_FILE, DOCKERFILE):
        if _excluded(name, rules):
            kept.discard(name)  # the classic builder's removal after reading them
    return sorted(kept)


def filtered_copy(context: Path, dest: Path) -> Path:
    """``context`` itself without a ``.dockerignore``, else a copy at ``dest`` of what it lets
    through (parents of a re-included file are made, as the engine does for a tar's entries)."""
    rules = patterns(context)
    if rules is None:
        return context
    dest.mkdir(parents=True)
    dirs: list[str] = []
    for rel in included(context, rules):
        src, out = context / rel, dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), out)
        elif src.is_dir():
            out.mkdir(exist_ok=True)
            dirs.append(rel)
        elif src.is_file():
            shutil.copy2(src, out)
        # sockets and fifos: the SDK's tar leaves them out too
    for rel in reversed(dirs):  # modes last: a read-only directory is filled first
        shutil.copystat(context / rel, dest / rel)
    return dest


def ignored_note(context: Path) -> str:
    """'' unless the context has BuildKit's Dockerfile-specific ignore file, which no backend here honours."""
    if not (context / BUILDKIT_IGNORE_FILE).exists():
        return ""
    return (
        f"{BUILDKIT_IGNORE_FILE} (BuildKit only; the docker backend's classic builder and so the local "
        f"backend use {IGNORE_FILE})"
    )


def _excluded(name: str, rules: list[str]) -> bool:
    """Whether ``rules`` exclude a top-level ``name`` (the SDK's matcher always keeps ``.dockerignore``
    itself, so it cannot answer this): the last matching pattern decides."""
    matched = False
    for rule in rules:
        pattern = Pattern(rule)
        if pattern.dirs and pattern.match(name):
            matched = not pattern.exclusion
    return matched
