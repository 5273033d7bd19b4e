"""The local backend's image builder: replays ``environment/Dockerfile`` onto a
layer directory cached by the environment's hash.

The host system is the base image (``FROM`` is recorded, not pulled). A layer
holds the directories the Dockerfile creates (WORKDIR and COPY/ADD targets:
its *roots*), the accumulated ENV and the final WORKDIR and USER. RUN steps
run in the sandbox with those roots writable and the host read-only, so a RUN
that writes elsewhere fails with a clear message. Anything else that changes
the filesystem (multi-stage builds, ``COPY --from``, ``ADD <url>``, ONBUILD,
SHELL, heredocs) is refused with an error naming the instruction and pointing
to the docker backend. The built layer is squashed to a one-commit git history
when the integrity policy asks (so every trial copies an already-clean repo).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import shutil
import tarfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from services.sandbox import dockerfile, integrity
from services.sandbox.backends import bwrap
from services.sandbox.errors import EnvSetupError, UnsupportedInstruction
from services.sandbox.settings import LocalBackendSettings
from services.sandbox.tasks import NetworkMode, Task

log = logging.getLogger(__name__)

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
DEFAULT_WORKDIR = "/app"
LAYER_FORMAT = "2"


@dataclass
class Layer:
    """A built environment: ``root/<abs path>`` for each of ``roots``."""

    path: Path
    roots: list[str]
    workdir: str
    env: dict[str, str]
    user: str
    base_image: str
    ignored: list[str] = field(default_factory=list)

    def host_path(self, sandbox_path: str) -> Path:
        return self.path / "root" / sandbox_path.lstrip("/")

    @classmethod
    def load(cls, path: Path) -> Layer:
        meta = json.loads((path / "layer.json").read_text())
        return cls(path=path, **meta)

    def save(self) -> None:
        meta = {k: v for k, v in self.__dict__.items() if k != "path"}
        (self.path / "layer.json").write_text(json.dumps(meta, indent=1))


class LayerCache:
    """Builds each environment once per (hash, variant); concurrent builders of
    the same key wait on a file lock and reuse the result."""

    def __init__(self, cache_dir: Path, settings: LocalBackendSettings) -> None:
        self.dir = cache_dir / "layers"
        self.settings = settings
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, task: Task, *, squash_git: bool, timeout_s: float | None = None) -> Layer:
        key = f"{task.environment_hash()[:32]}-{'sq' if squash_git else 'raw'}-v{LAYER_FORMAT}"
        final = self.dir / key
        if (final / "layer.json").exists():
            return Layer.load(final)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            lock_file = await asyncio.to_thread(_flock, self.dir / f"{key}.lock")
            try:
                if (final / "layer.json").exists():
                    return Layer.load(final)
                build_dir = self.dir / f"{key}.build-{uuid.uuid4().hex[:8]}"
                try:
                    builder = _Builder(task, build_dir, self.settings)
                    await asyncio.wait_for(builder.build(), timeout_s or task.config.environment.build_timeout_sec)
                    if squash_git:
                        await integrity.squash_all_git(builder.layer.host_path(builder.layer.workdir))
                    builder.layer.save()
                    build_dir.rename(final)
                except TimeoutError as e:
                    raise EnvSetupError(f"task {task.task_id}: environment build timed out") from e
                finally:
                    shutil.rmtree(build_dir, ignore_errors=True)
                return Layer.load(final)
            finally:
                lock_file.close()


def _flock(path: Path):  # type: ignore[no-untyped-def]
    handle = open(path, "a+")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


class _Builder:
    def __init__(self, task: Task, build_dir: Path, settings: LocalBackendSettings) -> None:
        self.task = task
        self.settings = settings
        self.context = task.environment_dir.resolve()
        self.layer = Layer(path=build_dir, roots=[], workdir="", env={}, user="root", base_image="host")
        self.args: dict[str, str] = {}
        self.cwd = "/"
        self.froms = 0

    def fail(self, ins: dockerfile.Instruction, why: str) -> UnsupportedInstruction:
        return UnsupportedInstruction(
            f"task {self.task.task_id}: Dockerfile line {ins.line}: {ins.describe()!r}: {why}; "
            "the local backend cannot honour it, use the docker backend (backend = 'docker')"
        )

    async def build(self) -> None:
        (self.layer.path / "root").mkdir(parents=True)
        dockerfile_path = self.task.dockerfile
        if dockerfile_path is None:
            raise EnvSetupError(
                f"task {self.task.task_id}: [environment] docker_image {self.task.config.environment.docker_image!r} "
                "has no Dockerfile to replay; the local backend cannot pull images, use the docker backend"
            )
        try:
            instructions = dockerfile.parse(dockerfile_path.read_text())
        except (dockerfile.DockerfileError, UnicodeDecodeError) as e:
            raise EnvSetupError(f"task {self.task.task_id}: environment/Dockerfile: {e}") from e
        for ins in instructions:
            await self.apply(ins)
        workdir = self.task.config.environment.workdir or (self.cwd if self.cwd != "/" else DEFAULT_WORKDIR)
        self.add_root(workdir)
        self.layer.workdir = workdir
        self.layer.env.update(self.task.config.environment.env)

    async def apply(self, ins: dockerfile.Instruction) -> None:
        kw = ins.keyword
        if kw in dockerfile.METADATA_ONLY:
            self.layer.ignored.append(ins.describe())
            return
        if kw not in dockerfile.REPLAYED:
            raise self.fail(ins, f"instruction {kw} is not supported")
        try:
            await getattr(self, f"do_{kw.lower()}")(ins)
        except dockerfile.DockerfileError as e:
            raise EnvSetupError(f"task {self.task.task_id}: environment/Dockerfile: {e}") from e

    async def do_from(self, ins: dockerfile.Instruction) -> None:
        self.froms += 1
        if self.froms > 1:
            raise self.fail(ins, "multi-stage builds are not supported")
        self.layer.base_image = dockerfile.substitute(ins.raw.split()[0], self.args) if ins.raw else "host"

    async def do_arg(self, ins: dockerfile.Instruction) -> None:
        name, _, default = ins.raw.partition("=")
        self.args.setdefault(name.strip(), default.strip().strip('"'))

    async def do_env(self, ins: dockerfile.Instruction) -> None:
        self.layer.env.update(dockerfile.parse_env(ins.raw, {**self.args, **self.layer.env}, ins.line))

    async def do_user(self, ins: dockerfile.Instruction) -> None:
        self.layer.user = dockerfile.substitute(ins.raw.strip(), self.variables()).split(":")[0]

    async def do_workdir(self, ins: dockerfile.Instruction) -> None:
        self.cwd = self.resolve(dockerfile.substitute(ins.raw.strip(), self.variables()))
        self.add_root(self.cwd)

    async def do_copy(self, ins: dockerfile.Instruction) -> None:
        if "from" in ins.flags:
            raise self.fail(ins, "COPY --from (multi-stage) is not supported")
        sources, dest = dockerfile.copy_args(ins, self.variables())
        await asyncio.to_thread(self.copy, ins, sources, dest, extract=False)

    async def do_add(self, ins: dockerfile.Instruction) -> None:
        sources, dest = dockerfile.copy_args(ins, self.variables())
        for src in sources:
            if "://" in src or src.startswith("git@"):
                raise self.fail(ins, "ADD of a URL or git repository is not supported")
        await asyncio.to_thread(self.copy, ins, sources, dest, extract=True)

    async def do_run(self, ins: dockerfile.Instruction) -> None:
        if "mount" in ins.flags or "network" in ins.flags or "security" in ins.flags:
            raise self.fail(ins, "RUN flags (--mount, --network, --security) are not supported")
        argv = ins.exec_args() if ins.is_exec_form else ["/bin/sh", "-c", ins.raw]
        if self.cwd != "/":
            self.add_root(self.cwd)
        mounts = [bwrap.Mount(self.layer.host_path(r), r, writable=True) for r in self.layer.roots]
        path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        env = {"PATH": path, "HOME": "/tmp", **self.args, **self.layer.env}  # ARGs are RUN's env, as in docker
        net = self.task.config.environment.network_mode
        inv = bwrap.build(
            self.settings,
            argv=argv,
            mounts=mounts,
            env=env,
            cwd=self.cwd,
            uid_inside=0 if self.layer.user in ("root", "0", "") else bwrap.SANDBOX_UID,
            share_net=net in (None, NetworkMode.PUBLIC),
            tmp_size_mb=self.settings.tmp_size_mb,
        )
        outcome = await bwrap.run(inv, timeout_s=self.task.config.environment.build_timeout_sec, output_limit=1 << 16)
        if outcome.exit_code != 0:
            tail = outcome.output.value().decode(errors="replace")[-1500:]
            hint = " (the local backend can only write WORKDIR/COPY targets)" if "Read-only file system" in tail else ""
            raise EnvSetupError(
                f"task {self.task.task_id}: Dockerfile line {ins.line}: {ins.describe()!r} exited with "
                f"{outcome.exit_code}{hint}:\n{tail}"
            )

    def variables(self) -> dict[str, str]:
        return {**self.args, **self.layer.env}

    def resolve(self, path: str) -> str:
        return str(PurePosixPath(self.cwd, path)) if not path.startswith("/") else str(PurePosixPath(path))

    def add_root(self, path: str) -> None:
        """Makes ``path`` part of the layer unless an existing root already holds it."""
        if any(PurePosixPath(path).is_relative_to(r) for r in self.layer.roots):
            self.layer.host_path(path).mkdir(parents=True, exist_ok=True)
            return
        if path in ("/", "/usr", "/etc", "/bin", "/lib", "/proc", "/dev", "/tmp", "/run"):
            raise EnvSetupError(f"task {self.task.task_id}: the local backend cannot write to {path}")
        self.layer.roots = [r for r in self.layer.roots if not PurePosixPath(r).is_relative_to(path)] + [path]
        self.layer.host_path(path).mkdir(parents=True, exist_ok=True)

    def copy(self, ins: dockerfile.Instruction, sources: list[str], dest: str, *, extract: bool) -> None:
        target = self.resolve(dest)
        matches: list[Path] = []
        for src in sources:
            found = sorted(self.context.glob(src.lstrip("/"))) if any(c in src for c in "*?[") else [self.context / src]
            for path in found:
                resolved = path.resolve()
                if not resolved.is_relative_to(self.context):
                    raise self.fail(ins, f"source {src!r} is outside the build context")
                if not resolved.exists():
                    raise EnvSetupError(f"task {self.task.task_id}: Dockerfile line {ins.line}: {src!r} not found")
                matches.append(resolved)
        into_dir = dest.endswith("/") or len(matches) > 1 or any(m.is_dir() for m in matches)
        self.add_root(target if into_dir else str(PurePosixPath(target).parent))
        out = self.layer.host_path(target)
        for src_path in matches:
            if extract and src_path.is_file() and src_path.name.endswith(_TAR_SUFFIXES):
                out.mkdir(parents=True, exist_ok=True)
                with tarfile.open(src_path) as tar:
                    tar.extractall(out, filter="data")
            elif src_path.is_dir():
                shutil.copytree(src_path, out, symlinks=True, dirs_exist_ok=True)
            elif into_dir:
                out.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src_path, out / src_path.name)
            else:
                shutil.copy2(src_path, out)
