"""Images of the Docker backend: built from ``environment/Dockerfile`` by the
engine, or ``[environment] docker_image`` used as it is when present and
pulled when not; then a derived image prepared once and committed: the
workspace squashed to a one-commit git history when the integrity policy asks,
owned by the sandbox user, and /logs/agent made, so a trial's setup needs no
exec of its own.

Both caches are keyed by everything that decides their content:
- a build (``harnessrl-env:<key>``) by the task's environment hash and the
  resolved id of every image its Dockerfile builds on (``base_images``), so a
  base image replaced under its name (a security update, a re-pulled tag)
  is built on again;
- a prepared image (``harnessrl-prep:<image>-<key>``) by the image id, the
  workspace it squashes and chowns (tasks on one image may name different
  workdirs), the squash policy, the script it runs (which names the sandbox
  uid) and ``PREPARE_VERSION``.

The squash runs on the worker's side (the workspace goes out as a tar, is
squashed by ``integrity.squash_all_git`` and comes back), so it needs no git
in the image. Older commits stay in the base image's lower layers, which no
process in the container can reach.

Engine failures are not the task's: a refused or unanswered engine call is
``ContainerEngineError`` naming the engine; only a 404 means "absent".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import logging
import os
import re
import shlex
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from docker.errors import APIError, BuildError, NotFound
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import RequestException

from services.sandbox.common import tarsafe
from services.sandbox.common.errors import ContainerEngineError, EnvSetupError
from services.sandbox.defences import integrity
from services.sandbox.task import dockerfile, heredoc
from services.sandbox.task.model import Task

log = logging.getLogger(__name__)

BUILT_REPO = "harnessrl-env"
PREPARED_REPO = "harnessrl-prep"
LABEL_PREPARED = "io.harnessrl.prepared-from"
LABEL_CLOSED = "io.harnessrl.closed-dirs"
SANDBOX_UID = 1000
# Bump when the preparation changes what it leaves in an image in a way its script text
# does not show (integrity.squash_all_git's algorithm): every prepared image is made again.
PREPARE_VERSION = 2
# The key part of a base image that is not present: the build pulls it (or fails); the next
# trial then sees its id, misses this tag and builds once more, through the engine's cache.
ABSENT = "absent"


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def build_log_tail(build_log: Any, limit: int) -> str:
    """The end of a failed build's log for its error: whole lines (never cut mid-word) of at
    most ``limit`` characters in all, without the terminal colour codes pip and apt print."""
    text = _ANSI.sub("", "".join(str(part.get("stream") or part.get("error") or "") for part in build_log))
    if len(text) <= limit:
        return text
    tail = text[-limit:]
    return tail[tail.index("\n") + 1 :] if "\n" in tail[:-1] else tail


def image_present(client: Any, name: str) -> bool:
    try:
        client.images.get(name)
    except NotFound:
        return False
    return True


def missing_bases_hint(client: Any, bases: list[str]) -> str:
    """What a failed build adds to its error when the images it builds on (FROM, COPY --from)
    are not on the engine: the build pulls none, so that is the likely cause."""
    missing = [name for name in bases if not image_present(client, name)]
    if not missing:
        return ""
    return (
        f" (base image {', '.join(missing)}: not present locally and not pulled; "
        "`harnessrl sandbox base-images` imports the offline base images)"
    )


def build_tag(environment_hash: str, base_ids: list[str]) -> str:
    """The tag of a build of an environment on these base images (their resolved ids)."""
    key = json.dumps([environment_hash, base_ids])
    return f"{BUILT_REPO}:{hashlib.sha256(key.encode()).hexdigest()[:24]}"


def prepared_tag(image: str, workdir: str, squash: bool) -> str:
    """The tag of ``image`` prepared for ``workdir``: keyed by everything the preparation reads."""
    key = json.dumps(
        {"image": image, "workdir": workdir, "squash": squash, "script": prepare_script(workdir), "v": PREPARE_VERSION},
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{PREPARED_REPO}:{image.split(':')[-1][:12]}-{digest}{'-sq' if squash else ''}"


class ImageStore:
    """Resolves a task to the image its containers start from (one lock per cache key)."""

    def __init__(self, client: Any, *, build_network: str, pull: bool, cache_dir: Path, engine: str) -> None:
        self.client = client
        self.build_network = build_network
        self.pull = pull
        self.cache_dir = cache_dir
        # The engine's address, for messages (the SDK's base_url of a socket says only "localhost").
        self.engine = engine
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def image_for(self, task: Task, *, squash: bool) -> Prepared:
        """The image a trial of ``task`` starts from, prepared once. Raises EnvSetupError,
        ContainerEngineError where the engine (not the task) failed."""
        name = task.config.environment.docker_image
        if name:
            async with self._lock(f"image:{name}"):
                image = await self._prebuilt(task, name)
        else:
            environment_hash = await asyncio.to_thread(build_hash, task)
            async with self._lock(f"env:{environment_hash}"):
                image = await self._built(task, environment_hash)
        inspect = await self._call(task, f"inspecting image {image}", self.client.api.inspect_image, image)
        workdir = workdir_of(inspect, task)
        tag = prepared_tag(image, workdir, squash)
        async with self._lock(tag):
            return await self._prepared(task, image, workdir, tag, squash)

    async def _call(
        self, task: Task, doing: str, fn: Callable[..., Any], *args: Any, absent_ok: bool = False, **kwargs: Any
    ) -> Any:
        """One engine call in a thread. A 404 is None where ``absent_ok`` (the image or the
        path is not there); any other failure of the engine is ContainerEngineError."""
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except (APIError, RequestException) as e:
            if absent_ok and isinstance(e, NotFound):
                return None
            raise self.engine_error(task, doing, e) from e

    def engine_error(self, task: Task, doing: str, error: Exception) -> ContainerEngineError:
        if isinstance(error, APIError):
            cause = f"answered {error.status_code}: {error.explanation or error}"
        elif isinstance(error, RequestsConnectionError):
            cause = f"is unreachable: {error}"
        else:
            cause = f"failed ({type(error).__name__}): {error}"
        return ContainerEngineError(f"task {task.task_id}: {doing}: Docker engine {self.engine} {cause}")

    async def _image_id(self, task: Task, name: str) -> str | None:
        found = await self._call(task, f"looking up image {name!r}", self.client.images.get, name, absent_ok=True)
        return None if found is None else str(found.id)

    async def _prebuilt(self, task: Task, name: str) -> str:
        found = await self._image_id(task, name)
        if found is not None:
            return found
        if not self.pull:
            raise EnvSetupError(f"task {task.task_id}: image {name!r} is not present and pulling is off")
        try:
            return str((await asyncio.to_thread(self.client.images.pull, name)).id)
        except APIError as e:
            # The engine answered: the registry refused the name or could not be reached from the engine.
            raise EnvSetupError(
                f"task {task.task_id}: image {name!r} is not present locally and could not be pulled: "
                f"{e.explanation or e}"
            ) from e
        except RequestException as e:
            raise self.engine_error(task, f"pulling image {name!r}", e) from e

    async def _built(self, task: Task, environment_hash: str) -> str:
        """The task's build on the current base images. Their ids are in the tag, so the cached
        path is one lookup per base image and one for the tag (~3 ms on the tests' engine).
        Letting the engine's build cache decide instead (it keys on the base's id too) sends the
        whole build context on every trial: 60-80 ms for a small task, 4-6 s for a 50 MB,
        2,000-file context (measured here, 2026-12-04). Where the FROM lines cannot be read,
        the engine's cache decides: slower, never stale."""
        if main_dockerfile(task) is None:
            raise EnvSetupError(f"task {task.task_id}: no environment/Dockerfile and no [environment] docker_image")
        bases = await asyncio.to_thread(base_images, task)
        if bases is None:
            tag = build_tag(environment_hash, ["unread"])
        else:
            ids = [await self._image_id(task, name) or f"{ABSENT}:{name}" for name in bases]
            tag = build_tag(environment_hash, ids)
            found = await self._image_id(task, tag)
            if found is not None:
                return found
        timeout = task.config.environment.build_timeout_sec
        try:
            image = await asyncio.wait_for(self._call(task, "docker build", self._build, task, tag), timeout)
        except TimeoutError as e:
            raise EnvSetupError(f"task {task.task_id}: docker build ran past {timeout}s") from e
        return str(image.id)

    def build_kwargs(self, task: Task, tag: str) -> dict[str, Any]:
        """``docker build``'s arguments. The build always has ``build_network``: Harbor's
        network_mode / allow_internet govern the running phases, never the image build.
        A compose file's ``main`` build (context, dockerfile, args) replaces environment/."""
        main = task.compose.main_build if task.compose else None
        kwargs: dict[str, Any] = {
            "path": str(main.context if main else task.environment_dir),
            "tag": tag,
            "rm": True,
            "forcerm": True,
            "pull": False,
            "network_mode": self.build_network,
        }
        if main is not None:
            kwargs |= {"dockerfile": main.dockerfile, "buildargs": dict(main.args)}
        return kwargs

    def _build(self, task: Task, tag: str) -> Any:
        try:
            image, _ = engine_build(self.client, **self.build_kwargs(task, tag))
        except dockerfile.DockerfileError as e:
            raise EnvSetupError(f"task {task.task_id}: {main_dockerfile(task)}: {e}") from e
        except BuildError as e:
            tail = build_log_tail(e.build_log, 1500)
            hint = missing_bases_hint(self.client, base_images(task) or [])
            raise EnvSetupError(f"task {task.task_id}: docker build failed: {e.msg}{hint}\n{tail}") from e
        except APIError as e:
            if e.is_client_error():  # the engine refused the Dockerfile or its context (a parse error)
                raise EnvSetupError(f"task {task.task_id}: docker build failed: {e.explanation or e}") from e
            raise  # the engine's own failure: ContainerEngineError in _call
        return image

    def _present(self, name: str) -> bool:
        return image_present(self.client, name)

    async def _prepared(self, task: Task, image: str, workdir: str, tag: str, squash: bool) -> Prepared:
        found = await self._call(task, f"looking up image {tag}", self.client.images.get, tag, absent_ok=True)
        if found is not None:
            return Prepared(str(found.id), _closed_dirs(found.attrs))
        create = self.client.containers.create
        argv = ["sleep", "infinity"]
        container = await self._call(task, "preparing the image", create, image, argv, network_mode="none", detach=True)
        tree = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="hrl-prepare-"))
        try:
            await self._call(task, "preparing the image", container.start)
            if squash:
                await self._squash_in(task, container, workdir, tree)
            closed = await self._root(task, container, prepare_script(workdir))
            changes = [f"LABEL {LABEL_PREPARED}={image}", f"LABEL {LABEL_CLOSED}={','.join(closed.split())}"]
            repo, _, name = tag.partition(":")
            committed = await self._call(
                task, "committing the prepared image", container.commit, repository=repo, tag=name, changes=changes
            )
            kv = {"image": image, "tag": tag, "workdir": workdir, "squashed": squash}
            log.info("prepared image", extra={"kv": kv})
            return Prepared(str(committed.id), closed.split())
        finally:
            await asyncio.to_thread(shutil.rmtree, tree, True)
            await self._call(task, "removing the preparation container", container.remove, force=True, v=True)

    async def _squash_in(self, task: Task, container: Any, workdir: str, tree: Path) -> None:
        reading = f"reading {workdir} from the image"
        archive = await self._call(task, reading, container.get_archive, workdir, absent_ok=True)
        if archive is None:  # no workdir in the image: nothing to squash
            return
        data = await self._call(task, reading, b"".join, archive[0])
        await asyncio.to_thread(extract_owned, data, tree)
        root = tree / PurePosixPath(workdir).name
        repos = await integrity.squash_all_git(root)
        if repos:
            await self._root(task, container, f"rm -rf {shlex.quote(workdir)}")
            put = container.put_archive
            await self._call(
                task,
                "writing the squashed workspace",
                put,
                str(PurePosixPath(workdir).parent),
                tar_as_user(root, root.name, None),
            )
            log.info("squashed git history", extra={"kv": {"task": task.task_id, "repos": repos}})

    async def _root(self, task: Task, container: Any, script: str) -> str:
        run = container.exec_run
        code, out = await self._call(task, "preparing the image", run, ["sh", "-c", script], user="0")
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
        f"mkdir -p /logs/agent {q} && chown -R {SANDBOX_UID}:{SANDBOX_UID} /logs/agent {q} && chmod 755 /logs && "
        "{ find / -xdev -maxdepth 3 -type d ! -perm -o=x 2>/dev/null || true; }"
    )


def _closed_dirs(attrs: dict[str, Any]) -> list[str]:
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    return [d for d in str(labels.get(LABEL_CLOSED, "")).split(",") if d]


def main_dockerfile(task: Task) -> Path | None:
    """The Dockerfile of the task's image: a compose file's ``main`` build, else environment/Dockerfile."""
    main = task.compose.main_build if task.compose else None
    return main.context / main.dockerfile if main else task.dockerfile


def build_hash(task: Task) -> str:
    """The task's environment hash, and where a compose file's ``main`` build names another
    context, that context's files and the build's dockerfile and args too."""
    main = task.compose.main_build if task.compose else None
    if main is None or main.context == task.environment_dir:
        return task.environment_hash() + (f"{main.dockerfile}{sorted(main.args.items())}" if main else "")
    h = hashlib.sha256(task.environment_hash().encode())
    h.update(f"{main.dockerfile}\0{sorted(main.args.items())}\0".encode())
    for path in sorted(main.context.rglob("*")):
        if path.is_file() and not path.is_symlink():
            h.update(f"{path.relative_to(main.context).as_posix()} {path.stat().st_mode & 0o777:o}\n".encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
        elif path.is_symlink():
            h.update(f"link {path.relative_to(main.context).as_posix()} {os.readlink(path)}\n".encode())
    return h.hexdigest()


def base_images(task: Task) -> list[str] | None:
    """The images the task's Dockerfile builds on, in order, once each: every FROM that is
    not an earlier stage (with the ARGs declared before the first FROM substituted, as Docker
    does: the build args the build passes, a compose file's ``main`` build args, over their
    defaults) and every ``COPY --from`` that names an image. ``scratch`` is no image. None
    where the Dockerfile cannot be read."""
    path = main_dockerfile(task)
    assert path is not None
    main = task.compose.main_build if task.compose else None
    try:
        return base_images_of(path.read_text(), dict(main.args) if main else None)
    except (UnicodeDecodeError, OSError):
        return None


def base_images_of(text: str, build_args: dict[str, str] | None = None) -> list[str] | None:
    """``base_images`` of a Dockerfile's text (None where it cannot be parsed), with the
    build args the build passes."""
    try:
        instructions = dockerfile.parse(text)
    except dockerfile.DockerfileError:
        return None
    global_args: dict[str, str] = {}
    stages: set[str] = set()
    bases: list[str] = []
    seen_from = False

    def add(ref: str) -> None:
        ref = dockerfile.substitute(ref, global_args)
        if ref and ref.lower() not in stages and ref != "scratch" and ref not in bases:
            bases.append(ref)

    for ins in instructions:
        if ins.keyword == "ARG" and not seen_from:
            global_args.update(_arg_defaults(ins.raw, global_args, build_args))
        elif ins.keyword == "FROM":
            seen_from = True
            words = ins.raw.split()
            add(words[0] if words else "")
            if len(words) == 3 and words[1].lower() == "as":
                stages.add(words[2].lower())
        elif ins.keyword == "COPY" and not ins.flags.get("from", "0").isdigit():
            add(ins.flags["from"])
    return bases


def _arg_defaults(raw: str, known: dict[str, str], build_args: dict[str, str] | None = None) -> dict[str, str]:
    """``ARG A=1 B`` -> {"A": "1"}: each declared ARG's build arg, else its default (an ARG
    with neither is unset)."""
    try:
        words = shlex.split(raw)
    except ValueError:
        return {}
    out: dict[str, str] = {}
    for word in words:
        name, sep, value = word.partition("=")
        if build_args and name in build_args:
            out[name] = build_args[name]
        elif sep:
            out[name] = dockerfile.substitute(value, {**known, **out})
    return out


def engine_build(client: Any, **kwargs: Any) -> Any:
    """``client.images.build(**kwargs)``; a Dockerfile with heredocs, which the engine's classic
    builder (Debian's docker.io 20.10) cannot read, is rewritten first (``task/heredoc.py``) and
    sent with the files it needs. Raises DockerfileError for a heredoc it cannot rewrite."""
    path = Path(kwargs["path"])
    try:
        text = (path / (kwargs.get("dockerfile") or "Dockerfile")).read_text()
    except (OSError, UnicodeDecodeError):
        return client.images.build(**kwargs)  # the engine names what is wrong with it
    if "<<" not in text:
        return client.images.build(**kwargs)
    variables_of: dict[str, dict[str, str]] = {}
    for name in base_images_of(text, kwargs.get("buildargs")) or []:  # a COPY heredoc expands the base image's ENV too
        try:
            variables_of[name] = image_env(client.api.inspect_image(name))
        except NotFound:
            continue  # not present: the build pulls it or fails naming it
    rewritten = heredoc.classic(text, variables_of, kwargs.get("buildargs") or {})
    if rewritten is None:
        return client.images.build(**kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("path", "dockerfile")}
    with classic_context(path, rewritten) as context:
        return client.images.build(
            **kwargs, fileobj=context, custom_context=True, dockerfile=heredoc.CLASSIC_DOCKERFILE
        )


@contextlib.contextmanager
def classic_context(path: Path, rewritten: heredoc.Classic) -> Iterator[IO[bytes]]:
    """The build context ``docker build PATH`` would send (less its .dockerignore, read as the
    SDK reads it), plus the rewritten Dockerfile and the heredoc files (root, 0644)."""
    from docker.utils.build import tar

    exclude = None
    ignore = path / ".dockerignore"
    if ignore.is_file():
        exclude = [x.strip() for x in ignore.read_text().splitlines() if x.strip() and not x.strip().startswith("#")]
    context = tar(str(path), exclude=exclude)
    try:
        with tarfile.open(fileobj=context, mode="a") as archive:
            for name, data in [(heredoc.CLASSIC_DOCKERFILE, rewritten.text.encode()), *rewritten.files.items()]:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                archive.addfile(info, io.BytesIO(data))
        context.seek(0)
        yield context
    finally:
        context.close()


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
