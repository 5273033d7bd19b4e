"""Images of the Docker backend: built from ``environment/Dockerfile`` by the
engine (tagged by the environment's hash, so the engine's cache is the build
cache), or ``[environment] docker_image`` used as it is when present and
pulled when not; then a derived image prepared once per image and committed
(``harnessrl-prep:<image id>-sq|raw``): the workspace squashed to a one-commit
git history when the integrity policy asks, owned by the sandbox user, and
/logs/agent made, so a trial's setup needs no exec of its own.

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
import shlex
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from services.sandbox import dockerfile, integrity, tarsafe
from services.sandbox.errors import EnvSetupError
from services.sandbox.tasks import NetworkMode, Task

log = logging.getLogger(__name__)

PREPARED_REPO = "harnessrl-prep"
LABEL_PREPARED = "io.harnessrl.prepared-from"
LABEL_CLOSED = "io.harnessrl.closed-dirs"


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

    async def image_for(self, task: Task, *, squash: bool) -> Prepared:
        """The image a trial of ``task`` starts from, prepared once. Raises EnvSetupError."""
        name = task.config.environment.docker_image
        async with self._lock(name or build_tag(task)):
            image = await (self._prebuilt(task, name) if name else self._built(task))
        async with self._lock(f"prep:{image}:{squash}"):
            return await self._prepared(task, image, squash)

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

        # No network for the build unless the task allows its setup one (allowlist: stricter, none).
        open_net = task.config.environment.network_mode in (None, NetworkMode.PUBLIC)
        try:
            image, _ = self.client.images.build(
                path=str(task.environment_dir),
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode=self.build_network if open_net else "none",
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

    async def _prepared(self, task: Task, image: str, squash: bool) -> Prepared:
        tag = f"{PREPARED_REPO}:{image.split(':')[-1][:24]}-{'sq' if squash else 'raw'}"
        try:
            found = await asyncio.to_thread(self.client.images.get, tag)
            return Prepared(str(found.id), _closed_dirs(found.attrs))
        except Exception:  # noqa: BLE001 - not made yet
            pass
        workdir = workdir_of(await asyncio.to_thread(self.client.api.inspect_image, image), task)
        create = self.client.containers.create
        container = await asyncio.to_thread(create, image, ["sleep", "infinity"], network_mode="none", detach=True)
        tree = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="hrl-prepare-"))
        try:
            await asyncio.to_thread(container.start)
            if squash:
                await self._squash_in(task, container, workdir, tree)
            closed = await self._root(task, container, prepare_script(workdir))
            changes = [f"LABEL {LABEL_PREPARED}={image}", f"LABEL {LABEL_CLOSED}={','.join(closed.split())}"]
            commit = container.commit
            committed = await asyncio.to_thread(
                commit, repository=PREPARED_REPO, tag=tag.split(":")[1], changes=changes
            )
            log.info("prepared image", extra={"kv": {"image": image, "tag": tag, "squashed": squash}})
            return Prepared(str(committed.id), closed.split())
        finally:
            await asyncio.to_thread(shutil.rmtree, tree, True)
            await asyncio.to_thread(container.remove, force=True)

    async def _squash_in(self, task: Task, container: Any, workdir: str, tree: Path) -> None:
        try:
            stream, _ = await asyncio.to_thread(container.get_archive, workdir)
            data = await asyncio.to_thread(b"".join, stream)
        except Exception:  # noqa: BLE001 - no workdir in the image: nothing to squash
            return
        await asyncio.to_thread(extract_owned, data, tree)
        root = tree / PurePosixPath(workdir).name
        repos = await integrity.squash_all_git(root)
        if repos:
            await self._root(task, container, f"rm -rf {shlex.quote(workdir)}")
            await asyncio.to_thread(
                container.put_archive, str(PurePosixPath(workdir).parent), tar_as_user(root, root.name, None)
            )
            log.info("squashed git history", extra={"kv": {"task": task.task_id, "repos": repos}})

    @staticmethod
    async def _root(task: Task, container: Any, script: str) -> str:
        code, out = await asyncio.to_thread(container.exec_run, ["sh", "-c", script], user="0")
        text = out.decode(errors="replace")
        if code != 0:
            raise EnvSetupError(f"task {task.task_id}: preparing the image failed: {script!r}: {text[-300:]}")
        return text


@dataclass(frozen=True)
class Prepared:
    """A trial's starting image and the directories in it the sandbox user cannot traverse."""

    image: str
    closed_dirs: list[str]


def prepare_script(workdir: str) -> str:
    """Run once per image (root): the sandbox user owns its workspace and /logs/agent
    (/logs stays root's); prints the directories it could not traverse."""
    q = shlex.quote(workdir)
    return (
        f"mkdir -p /logs/agent {q} && chown -R 1000:1000 /logs/agent {q} && chmod 755 /logs && "
        "{ find / -xdev -maxdepth 3 -type d ! -perm -o=x 2>/dev/null || true; }"
    )


def _closed_dirs(attrs: dict[str, Any]) -> list[str]:
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    return [d for d in str(labels.get(LABEL_CLOSED, "")).split(",") if d]


def base_images(task: Task) -> list[str]:
    """The images the task's Dockerfile starts from (not its own stage names)."""
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
    env.setdefault("PATH", dockerfile.DEFAULT_PATH)
    return env


def extract_owned(data: bytes, dest: Path) -> None:
    """Unpacks a tar from the engine keeping numeric owners and modes (the worker is root)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tarsafe.extractall(tar, dest, "owned")


def tar_as_user(src: Path, arcname: str, uid: int | None) -> bytes:
    """A tar of a worker file or tree whose entries ``uid`` owns (None: as on disk)."""

    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        if uid is None:
            return info
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
