"""Images of the Docker backend: built from ``environment/Dockerfile`` by the
engine (tagged by the environment's hash, so the engine's cache is the build
cache), or ``[environment] docker_image`` used as it is when present and
pulled when not; then, when the integrity policy asks, a derived image whose
workspace has a one-commit git history (``harnessrl-sq:<image id>``), made
once per image and committed, so a trial starts from an already clean repo.

The squash runs on the worker's side (the workspace goes out as a tar, is
squashed by ``integrity.squash_all_git`` and comes back), so it needs no git
in the image. Older commits stay in the base image's lower layers, which no
process in the container can reach.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from services.sandbox import integrity
from services.sandbox.errors import EnvSetupError
from services.sandbox.tasks import Task

log = logging.getLogger(__name__)

SQUASHED_REPO = "harnessrl-sq"
LABEL_SQUASHED = "io.harnessrl.squashed-from"


def build_tag(task: Task) -> str:
    return f"harnessrl-env:{task.environment_hash()[:24]}"


class ImageStore:
    """Resolves a task to the image its containers start from (one lock per tag)."""

    def __init__(self, client: Any, *, build_network: str, pull: bool, cache_dir: Path) -> None:
        self.client = client
        self.build_network = build_network
        self.pull = pull
        self.cache_dir = cache_dir
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def image_for(self, task: Task, *, squash: bool) -> str:
        """The image id a trial of ``task`` starts from. Raises EnvSetupError."""
        name = task.config.environment.docker_image
        async with self._lock(name or build_tag(task)):
            image = await (self._prebuilt(task, name) if name else self._built(task))
        if not squash:
            return image
        async with self._lock(f"sq:{image}"):
            return await self._squashed(task, image)

    async def _prebuilt(self, task: Task, name: str) -> str:
        try:
            return str((await asyncio.to_thread(self.client.images.get, name)).id)
        except Exception:  # noqa: BLE001 - not present locally: pull it
            pass
        if not self.pull:
            raise EnvSetupError(f"task {task.task_id}: image {name!r} is not present and pulling is off")
        try:
            return str((await asyncio.to_thread(self.client.images.pull, name)).id)
        except Exception as e:
            raise EnvSetupError(
                f"task {task.task_id}: image {name!r} is not present locally and could not be pulled "
                f"(no registry answered?): {e}"
            ) from e

    async def _built(self, task: Task) -> str:
        tag = build_tag(task)
        try:
            return str((await asyncio.to_thread(self.client.images.get, tag)).id)
        except Exception:  # noqa: BLE001 - not built yet
            pass
        if task.dockerfile is None:
            raise EnvSetupError(f"task {task.task_id}: no environment/Dockerfile and no [environment] docker_image")
        timeout = task.config.environment.build_timeout_sec
        try:
            image = await asyncio.wait_for(asyncio.to_thread(self._build, task, tag), timeout)
        except TimeoutError as e:
            raise EnvSetupError(f"task {task.task_id}: docker build ran past {timeout}s") from e
        return str(image.id)

    def _build(self, task: Task, tag: str) -> Any:
        from docker.errors import BuildError

        try:
            image, _ = self.client.images.build(
                path=str(task.environment_dir),
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode=self.build_network,
            )
        except BuildError as e:
            tail = "".join(str(part.get("stream") or part.get("error") or "") for part in e.build_log)[-1500:]
            missing = [name for name in base_images(task) if not self._present(name)]
            hint = ""
            if missing:
                hint = (
                    f" (FROM {', '.join(missing)}: not present locally and not pulled; "
                    "`harnessrl sandbox base-images` imports the offline base images)"
                )
            raise EnvSetupError(f"task {task.task_id}: docker build failed: {e.msg}{hint}\n{tail}") from e
        except Exception as e:
            raise EnvSetupError(f"task {task.task_id}: docker build failed: {e}") from e
        return image

    def _present(self, name: str) -> bool:
        try:
            self.client.images.get(name)
        except Exception:  # noqa: BLE001 - docker.errors.ImageNotFound
            return False
        return True

    async def _squashed(self, task: Task, image: str) -> str:
        tag = f"{SQUASHED_REPO}:{image.split(':')[-1][:24]}"
        try:
            return str((await asyncio.to_thread(self.client.images.get, tag)).id)
        except Exception:  # noqa: BLE001 - not made yet
            pass
        workdir = workdir_of(await asyncio.to_thread(self.client.api.inspect_image, image), task)
        create = self.client.containers.create
        container = await asyncio.to_thread(create, image, ["sleep", "infinity"], network_mode="none", detach=True)
        tree = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="hrl-squash-"))
        try:
            return await self._squash_in(task, container, image, workdir, tree, tag)
        finally:
            await asyncio.to_thread(shutil.rmtree, tree, True)
            await asyncio.to_thread(container.remove, force=True)

    async def _squash_in(self, task: Task, container: Any, image: str, workdir: str, tree: Path, tag: str) -> str:
        repo, version = tag.split(":")
        try:
            stream, _ = await asyncio.to_thread(container.get_archive, workdir)
            data = await asyncio.to_thread(b"".join, stream)
        except Exception:  # noqa: BLE001 - no workdir in the image: nothing to squash
            data = b""
        if data:
            await asyncio.to_thread(extract_owned, data, tree)
        root = tree / PurePosixPath(workdir).name
        repos = await integrity.squash_all_git(root) if data else 0
        if repos == 0:
            await asyncio.to_thread(self.client.api.tag, image, repo, version)
            return image
        await asyncio.to_thread(container.start)
        code, out = await asyncio.to_thread(container.exec_run, ["rm", "-rf", workdir], user="0")
        if code != 0:
            raise EnvSetupError(f"task {task.task_id}: clearing {workdir} to squash it failed: {out[-300:]!r}")
        await asyncio.to_thread(container.put_archive, str(PurePosixPath(workdir).parent), tar_owned(root))
        changes = [f"LABEL {LABEL_SQUASHED}={image}"]
        committed = await asyncio.to_thread(container.commit, repository=repo, tag=version, changes=changes)
        log.info("squashed git history", extra={"kv": {"image": image, "repos": repos, "tag": tag}})
        return str(committed.id)


def base_images(task: Task) -> list[str]:
    """The images the task's Dockerfile starts from (not its own stage names)."""
    from services.sandbox import dockerfile

    assert task.dockerfile is not None
    try:
        instructions = dockerfile.parse(task.dockerfile.read_text())
    except (dockerfile.DockerfileError, UnicodeDecodeError):
        return []
    stages: set[str] = set()
    bases = []
    for ins in instructions:
        if ins.keyword != "FROM" or not ins.raw.split():
            continue
        words = ins.raw.split()
        if words[0] not in stages:
            bases.append(words[0])
        if len(words) == 3 and words[1].lower() == "as":
            stages.add(words[2])
    return bases


def workdir_of(inspect: dict[str, Any], task: Task) -> str:
    return task.config.environment.workdir or (inspect.get("Config") or {}).get("WorkingDir") or "/app"


def image_env(inspect: dict[str, Any]) -> dict[str, str]:
    """The image's ENV, with Docker's default PATH where the image sets none."""
    env = dict(e.split("=", 1) for e in (inspect.get("Config") or {}).get("Env") or [] if "=" in e)
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def _keep_owner(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's 'tar' filter (no absolute paths, nothing outside ``dest``), modes kept."""
    return tarfile.tar_filter(member, dest).replace(mode=member.mode, deep=False)


def extract_owned(data: bytes, dest: Path) -> None:
    """Unpacks a tar from the engine keeping numeric owners and modes (the worker is root)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, numeric_owner=True, filter=_keep_owner)


def tar_owned(src: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(src, arcname=src.name)
    return buffer.getvalue()


def tar_as_user(src: Path, arcname: str, uid: int) -> bytes:
    """A tar of a worker file or tree whose entries the sandbox's user owns."""

    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = uid
        info.uname = info.gname = ""
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(src, arcname=arcname, filter=owned)
    return buffer.getvalue()


def pristine_cache(cache_dir: Path, image: str, workdir: str) -> Path:
    """Where the host copy of an image's workspace lives (one per image and workdir)."""
    key = json.dumps([image, workdir])
    return cache_dir / "docker-pristine" / hashlib.sha256(key.encode()).hexdigest()[:24]
