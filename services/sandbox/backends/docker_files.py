"""Files in and out of a trial's container (``DockerBackend`` upload, download and the
workspace defences before verify): tars through the engine's archive API, except the
folders bind-mounted from the worker (/logs/agent, /logs/artifacts), read on the host."""

from __future__ import annotations

import asyncio
import shlex
import shutil
import uuid
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from docker.errors import NotFound

from services.sandbox.backends import docker_images as images
from services.sandbox.backends.base import Sandbox, restore_workspace, unpack_tar
from services.sandbox.backends.docker_exec import ContainerExec
from services.sandbox.common import tarsafe
from services.sandbox.defences import module_shadow, path_guard, suspicious

if TYPE_CHECKING:
    from services.sandbox.backends.docker import DockerBackend


async def upload(backend: DockerBackend, sandbox: Sandbox, src: Path, dst: PurePosixPath) -> None:
    handle = _handle(sandbox)
    data = await asyncio.to_thread(images.tar_as_user, src, dst.name, 1000)
    # A path of the image (the workspace) or one uploaded before is replaced, not merged;
    # a fresh one (/tests, /solution) goes straight in: one engine call, no exec.
    fresh = str(dst) not in handle.uploaded and not dst.is_relative_to(sandbox.paths.workdir)
    if fresh:
        try:
            await backend._api(handle.container.put_archive, str(dst.parent), data)
        except NotFound:  # the parent does not exist yet: make it below
            fresh = False
    if not fresh:
        await handle.root(f"mkdir -p {shlex.quote(str(dst.parent))} && rm -rf {shlex.quote(str(dst))}")
        await backend._api(handle.container.put_archive, str(dst.parent), data)
    handle.uploaded.add(str(dst))


async def download(backend: DockerBackend, sandbox: Sandbox, src: PurePosixPath, dst: Path) -> None:
    paths, dirs = sandbox.paths, sandbox.spec.dirs
    for inside, behind in ((paths.agent_logs, dirs.agent_logs), (paths.published, dirs.published)):
        if src.is_relative_to(inside):  # bind-mounted from the worker
            host = behind / src.relative_to(inside)
            await asyncio.to_thread(_copy_out, host, dst, sandbox.spec.trial_id, src)
            return
    await _download(sandbox, src, dst, "data")


async def _download(sandbox: Sandbox, src: PurePosixPath, dst: Path, policy: tarsafe.Policy) -> None:
    try:
        stream, _ = await asyncio.to_thread(_handle(sandbox).container.get_archive, str(src))
        data = await asyncio.to_thread(b"".join, stream)
    except Exception as e:
        raise FileNotFoundError(f"{src} does not exist in sandbox {sandbox.spec.trial_id}") from e
    await asyncio.to_thread(unpack_tar, data, src, dst, policy)


async def snapshot_pristine(backend: DockerBackend, sandbox: Sandbox) -> None:
    """One host copy of the workspace per image (every trial of it starts the same)."""
    handle = _handle(sandbox)
    cache = images.pristine_cache(backend.settings.cache_dir, handle.image, str(sandbox.paths.workdir))
    async with handle.pristine_lock(cache):
        if not (cache / "tree").exists():
            partial = cache / f"partial-{uuid.uuid4().hex[:8]}"
            # Symlinks kept as they are (repositories have absolute ones), as in the restore.
            await _download(sandbox, sandbox.paths.workdir, partial / "tree", "tar")
            try:
                (partial / "tree").rename(cache / "tree")
            except OSError:  # another worker was first: same content
                pass
            await asyncio.to_thread(shutil.rmtree, partial, True)
    handle.pristine = cache / "tree"


async def restore_protected(
    backend: DockerBackend, sandbox: Sandbox, imports: module_shadow.VerifierImports | None = None
) -> list[str]:
    """The file defences before verify (test files, the runner's routes) on a host copy
    of the workspace, copied back whole when anything changed; first, outside the
    workspace, the agent's changes on the verifier's lookup paths (``lookup_changes``:
    the directories its Python imports from, the config files above WORKDIR)."""
    handle, paths = _handle(sandbox), sandbox.paths
    if handle.pristine is None:
        raise RuntimeError("snapshot_pristine was not called at start")
    outside: list[str] = []
    if backend.integrity.guard_runner_routes:
        dirs = imports.dirs if imports is not None else ()
        changes = path_guard.lookup_changes(handle.agent_diff, dirs, paths.workdir)
        outside = await backend._clear(sandbox, changes, path_guard.LOOKUP_ROUTE)
    current = sandbox.spec.dirs.root / "current"
    # Every symlink as it is: one the "data" policy refuses (absolute, or out of the
    # tree) would fail the copy, turning the agent's attempt into an infrastructure
    # failure; the guard removes the agent's (symlink-escape) instead.
    await _download(sandbox, paths.workdir, current, "tar")
    events = await asyncio.to_thread(restore_workspace, sandbox, current, handle.pristine, backend.integrity, imports)
    if any(not suspicious.is_event(e) for e in events):  # something was reverted
        await upload(backend, sandbox, current, paths.workdir)
    return outside + events


def _copy_out(host: Path, dst: Path, trial_id: str, src: PurePosixPath) -> None:
    if not (host.exists() or host.is_symlink()):
        raise FileNotFoundError(f"{src} does not exist in sandbox {trial_id}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    if host.is_dir() and not host.is_symlink():
        shutil.copytree(host, dst, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(host, dst, follow_symlinks=False)


def _handle(sandbox: Sandbox) -> ContainerExec:
    assert isinstance(sandbox.handle, ContainerExec)
    return sandbox.handle
