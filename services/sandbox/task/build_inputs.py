"""Everything of a task that decides the environment the local backend builds (issue 45,
section 3): one function gathers it (``gather``), and both the layer cache's key
(``BuildInputs.digest``, ``Task.environment_hash``) and the builder (``backends/layers.py``)
take their inputs from it, so a field the builder starts reading cannot be missed by the key.

Not in it, on purpose: ``build_timeout_sec`` (it decides whether a build finishes, never what
it holds) and the backend's own settings (the cache is the worker's; its directory holds them).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BuildInputs:
    """What the builder reads: ``context`` (environment/, the build context, the Dockerfile
    and its .dockerignore among its files), ``dockerfile`` (None: the task names only an
    image), ``docker_image`` ([environment], where there is no Dockerfile), ``workdir``
    ([environment] workdir: the layer's workdir, the one squashed), ``env`` ([environment]
    env, over the Dockerfile's ENV) and ``build_args`` (a compose file's ``main`` build args:
    ``FROM ${ARG}`` and ARG defaults)."""

    context: Path
    dockerfile: Path | None
    docker_image: str | None
    workdir: str | None
    env: tuple[tuple[str, str], ...]
    build_args: tuple[tuple[str, str], ...] = ()

    def digest(self) -> str:
        """sha256 over every field and every file of the context (names, modes, contents,
        link targets): the cache key."""
        h = hashlib.sha256()
        h.update(f"image={self.docker_image}\nworkdir={self.workdir}\n".encode())
        h.update(f"dockerfile={self.dockerfile.name if self.dockerfile else None}\n".encode())
        for key, value in self.env:
            h.update(f"env {key}={value}\n".encode())
        for key, value in self.build_args:
            h.update(f"arg {key}={value}\n".encode())
        if self.context.is_dir():
            for path in sorted(self.context.rglob("*")):
                rel = path.relative_to(self.context).as_posix()
                if path.is_symlink():
                    h.update(f"link {rel} {os.readlink(path)}\n".encode())
                elif path.is_file():
                    h.update(f"file {rel} {path.stat().st_mode & 0o777:o}\n".encode())
                    h.update(hashlib.sha256(path.read_bytes()).digest())
                elif path.is_dir():
                    h.update(f"dir {rel}\n".encode())
        return h.hexdigest()


def gather(
    environment_dir: Path,
    docker_image: str | None,
    workdir: str | None,
    env: dict[str, str],
    build_args: dict[str, str] | None = None,
) -> BuildInputs:
    """The task's build inputs (``Task.build_inputs`` passes its fields)."""
    dockerfile = environment_dir / "Dockerfile"
    return BuildInputs(
        context=environment_dir,
        dockerfile=dockerfile if dockerfile.is_file() else None,
        docker_image=docker_image,
        workdir=workdir,
        env=tuple(sorted(env.items())),
        build_args=tuple(sorted((build_args or {}).items())),
    )
