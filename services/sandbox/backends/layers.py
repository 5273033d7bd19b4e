"""The local backend's image builder: replays ``environment/Dockerfile`` onto a
layer directory cached by the environment's hash.

What it reproduces: ``ARG``, ``ENV`` (from Docker's default env for a base
image, so ``ENV PATH=/x:$PATH`` extends the default PATH), ``WORKDIR``,
``COPY``/``ADD`` of local files and tars (from the build context less what its
``.dockerignore`` excludes, as the docker backend's engine sees it: see
``dockerignore.py``), ``USER``, and ``RUN``. A layer holds the directories the
Dockerfile creates (its *roots*: WORKDIR and COPY/ADD targets, and the new
directories RUN steps write, such as ``/opt/venv``), the accumulated ENV and
the final WORKDIR and USER; every later step and phase mounts the roots at
their places, on bubblewrap's own root: nothing is made on the host, and the
roots never depend on what the host holds outside its system paths.

What it does not: the base image. The host system is the base (``FROM`` is
recorded, not pulled), read-only, so a RUN that changes it (``apt-get
install``, ``pip install`` into /usr) fails setup naming the instruction, and
a base image's own env (beyond the default PATH) and files are not there. What
RUN steps leave in /tmp is not kept (each phase gets a fresh /tmp; listed in
the layer's ``ignored``). Anything else that changes the filesystem
(multi-stage builds, ``COPY --from``, ``ADD <url>``, ONBUILD, SHELL)
is refused with an error naming the instruction and pointing to the docker
backend, which is the faithful one. Heredocs (``RUN <<EOF``, ``COPY <<EOF /path``)
run as BuildKit runs them (``task/heredoc.py``). The built layer is squashed to a
one-commit git history when the integrity policy asks (so every trial copies
an already-clean repo).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import re
import shutil
import tarfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from services.sandbox.backends import bwrap
from services.sandbox.common import tarsafe
from services.sandbox.common.errors import EnvSetupError, UnsupportedInstruction
from services.sandbox.common.settings import LocalBackendSettings
from services.sandbox.defences import integrity
from services.sandbox.task import dockerfile, dockerignore, heredoc
from services.sandbox.task.build_inputs import BuildInputs
from services.sandbox.task.model import Task

log = logging.getLogger(__name__)

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
DEFAULT_WORKDIR = "/app"
LAYER_FORMAT = "4"
_READ_ONLY_HINT = (
    "the host's system paths (/usr, /etc, ...) are the local backend's read-only base image; a RUN may write "
    "anywhere else (WORKDIR, COPY targets, new directories such as /opt/venv); use the docker backend to "
    "change the base system"
)
# A RUN that calls a system package manager changes the base system, which the host is here:
# apt-get fails before it writes (the host's /var is not in the sandbox), never with
# "Read-only file system", so such a failure gets its own hint.
_PACKAGE_MANAGERS = re.compile(r"(?:^|[\s;&|(`/])(?:apt-get|apt|aptitude|dpkg|apk|yum|dnf|microdnf|zypper)\s")
_PACKAGE_HINT = (
    "it runs a system package manager: the local backend's base image is the host's system, read-only, "
    "whatever FROM says, so packages cannot be installed by a RUN; use the docker backend"
)
# Never layer roots: kernel or per-exec filesystems.
_NOT_KEPT = ("/proc", "/sys", "/dev", "/tmp")
# The directories a Debian or Ubuntu base image has outside the host system paths: what a RUN makes
# under them is kept as narrow roots (/opt/venv, not /opt). A fixed list, not the host's directories,
# so the layer never depends on what the host happens to hold (a leftover /opt/venv, say).
BASE_DIRS = frozenset(
    {"/boot", "/home", "/media", "/mnt", "/opt", "/root", "/srv", "/var", "/var/backups", "/var/cache"}
    | {"/var/lib", "/var/local", "/var/log", "/var/mail", "/var/opt", "/var/spool", "/var/tmp"}
)


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
        inputs = task.build_inputs()  # the key and the build read the same inputs
        key = f"{inputs.digest()[:32]}-{'sq' if squash_git else 'raw'}-v{LAYER_FORMAT}"
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
                    limit = task.config.environment.build_timeout_sec
                    builder = _Builder(task.task_id, inputs, build_dir, self.settings, limit)
                    await asyncio.wait_for(builder.build(), timeout_s or limit)
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
    """Reads the task only through ``inputs`` (``task/build_inputs.py``: the cache key's
    inputs too); ``build_timeout_s`` bounds each RUN."""

    def __init__(
        self, task_id: str, inputs: BuildInputs, build_dir: Path, settings: LocalBackendSettings, build_timeout_s: float
    ) -> None:
        self.task_id = task_id
        self.inputs = inputs
        self.build_timeout_s = build_timeout_s
        self.settings = settings
        self.source = inputs.context.resolve()
        self.context = self.source  # less what .dockerignore excludes, once build() has filtered it
        # Docker's default env of a base image applies from FROM on (the host is the base image).
        env = {"PATH": dockerfile.DEFAULT_PATH}
        self.layer = Layer(path=build_dir, roots=[], workdir="", env=env, user="root", base_image="host")
        self.args: dict[str, str] = {}
        self.cwd = "/"
        self.froms = 0
        # /tmp of the RUN steps: shared by them, as in docker, but not part of the layer.
        self.tmp = build_dir / "build-tmp"

    def fail(self, ins: dockerfile.Instruction, why: str) -> UnsupportedInstruction:
        return UnsupportedInstruction(
            f"task {self.task_id}: Dockerfile line {ins.line}: {ins.describe()!r}: {why}; "
            "the local backend cannot honour it, use the docker backend (backend = 'docker')"
        )

    async def build(self) -> None:
        (self.layer.path / "root").mkdir(parents=True)
        dockerfile_path = self.inputs.dockerfile
        if dockerfile_path is None:
            raise EnvSetupError(
                f"task {self.task_id}: [environment] docker_image {self.inputs.docker_image!r} "
                "has no Dockerfile to replay; the local backend cannot pull images, use the docker backend"
            )
        try:
            instructions = dockerfile.parse(dockerfile_path.read_text())
        except (dockerfile.DockerfileError, UnicodeDecodeError) as e:
            raise EnvSetupError(f"task {self.task_id}: environment/Dockerfile: {e}") from e
        self.tmp.mkdir()
        self.context = await asyncio.to_thread(dockerignore.filtered_copy, self.source, self.layer.path / "context")
        self.layer.ignored += [note for note in [dockerignore.ignored_note(self.source)] if note]
        for ins in instructions:
            await self.apply(ins)
        await asyncio.to_thread(self.drop_tmp)
        if self.context != self.source:
            await asyncio.to_thread(shutil.rmtree, self.context)
        workdir = self.inputs.workdir or (self.cwd if self.cwd != "/" else DEFAULT_WORKDIR)
        self.add_root(workdir)
        self.layer.workdir = workdir
        self.layer.env.update(dict(self.inputs.env))

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
            raise EnvSetupError(f"task {self.task_id}: environment/Dockerfile: {e}") from e

    async def do_from(self, ins: dockerfile.Instruction) -> None:
        self.froms += 1
        if self.froms > 1:
            raise self.fail(ins, "multi-stage builds are not supported")
        self.layer.base_image = dockerfile.substitute(ins.raw.split()[0], self.args) if ins.raw else "host"

    async def do_arg(self, ins: dockerfile.Instruction) -> None:
        name, _, default = ins.raw.partition("=")
        # A build arg (a compose file's ``main`` build args) wins over the default, as in docker.
        build_args = dict(self.inputs.build_args)
        self.args.setdefault(name.strip(), build_args.get(name.strip(), default.strip().strip('"')))

    async def do_env(self, ins: dockerfile.Instruction) -> None:
        self.layer.env.update(dockerfile.parse_env(ins.raw, {**self.args, **self.layer.env}, ins.line))

    async def do_user(self, ins: dockerfile.Instruction) -> None:
        self.layer.user = dockerfile.substitute(ins.raw.strip(), self.variables()).split(":")[0]

    async def do_workdir(self, ins: dockerfile.Instruction) -> None:
        self.cwd = self.resolve(dockerfile.substitute(ins.raw.strip(), self.variables()))
        self.add_root(self.cwd, ins)

    async def do_copy(self, ins: dockerfile.Instruction) -> None:
        if "from" in ins.flags:
            raise self.fail(ins, "COPY --from (multi-stage) is not supported")
        sources, dest = dockerfile.copy_args(ins, self.variables())
        await asyncio.to_thread(self.copy, ins, sources, dest, extract=False, inline=self.inline_files(ins))

    def inline_files(self, ins: dockerfile.Instruction) -> list[Path]:
        """A COPY/ADD's heredocs as files (mode 0644, as BuildKit makes them), outside the context."""
        out: list[Path] = []
        for index, doc in enumerate(ins.heredocs):
            path = self.layer.path / "heredocs" / f"{ins.line}-{index}" / doc.name
            path.parent.mkdir(parents=True)
            path.write_bytes(heredoc.copy_file(doc, self.variables()))
            path.chmod(0o644)
            out.append(path)
        return out

    async def do_add(self, ins: dockerfile.Instruction) -> None:
        sources, dest = dockerfile.copy_args(ins, self.variables())
        for src in sources:
            if "://" in src or src.startswith("git@"):
                raise self.fail(ins, "ADD of a URL or git repository is not supported")
        # A heredoc's file is never unpacked (BuildKit copies it as it is).
        await asyncio.to_thread(self.copy, ins, sources, dest, extract=True, inline=self.inline_files(ins))

    async def do_run(self, ins: dockerfile.Instruction) -> None:
        if "mount" in ins.flags or "network" in ins.flags or "security" in ins.flags:
            raise self.fail(ins, "RUN flags (--mount, --network, --security) are not supported")
        argv = ins.exec_args() if ins.is_exec_form else ["/bin/sh", "-c", ins.raw]
        if self.cwd != "/":
            self.add_root(self.cwd, ins)
        mounts = [bwrap.Mount(self.layer.host_path(r), r, writable=True) for r in self.layer.roots]
        if ins.heredocs:
            plan = heredoc.run_plan(ins)
            argv = plan.argv
            if plan.pipe is not None:  # BuildKit's read-only /dev/pipes with the #! body, mode 0755
                pipes = self.layer.path / "pipes" / str(ins.line)
                pipes.mkdir(parents=True)
                (pipes / plan.pipe[0]).write_text(plan.pipe[1])
                (pipes / plan.pipe[0]).chmod(0o755)
                mounts.append(bwrap.Mount(pipes, heredoc.PIPES, writable=False))
        env = {"HOME": "/tmp", **self.args, **self.layer.env}  # ARGs are RUN's env, as in docker
        # The RUN's / is a capture directory, not bubblewrap's tmpfs: what it writes outside the
        # roots is kept (or refused) by keep_writes, never lost with the tmpfs.
        capture = self.layer.path / "capture"
        capture.mkdir()
        try:
            inv = bwrap.build(
                self.settings,
                argv=argv,
                mounts=mounts,
                env=env,
                cwd=self.cwd,
                uid_inside=0 if self.layer.user in ("root", "0", "") else bwrap.SANDBOX_UID,
                # A RUN has the host's network whatever the task's network_mode, as in Harbor,
                # whose policy governs the running phases, never the image build.
                share_net=True,
                root=capture,
                tmp_dir=self.tmp,
            )
            outcome = await bwrap.run(inv, timeout_s=self.build_timeout_s, output_limit=1 << 16)
            output = outcome.output.value().decode(errors="replace")
            # A write into the base system that the RUN tolerated (``|| true``) would have worked in
            # docker: the layer would differ from the image, so it fails setup all the same.
            read_only = "Read-only file system" in output
            if outcome.exit_code != 0 or read_only:
                hint = f" ({_READ_ONLY_HINT})" if read_only else ""
                if not hint and _PACKAGE_MANAGERS.search(ins.raw + "".join(h.content for h in ins.heredocs)):
                    hint = f" ({_PACKAGE_HINT})"
                raise EnvSetupError(
                    f"task {self.task_id}: Dockerfile line {ins.line}: {ins.describe()!r} exited with "
                    f"{outcome.exit_code}{hint}:\n{output[-1500:]}"
                )
            await asyncio.to_thread(self.keep_writes, ins, capture, bwrap.mount_points(self.settings, mounts))
        finally:
            await asyncio.to_thread(shutil.rmtree, capture, True)

    def keep_writes(self, ins: dockerfile.Instruction, capture: Path, mount_points: set[str]) -> None:
        """Moves what a RUN wrote outside the layer's roots (left in ``capture``, its ``/``) into
        the layer, as new roots. Kept, rather than refused, because everyday Dockerfiles do it
        (``python3 -m venv /opt/venv``, ``mkdir /data``) and a new directory can be mounted as it is
        in every later step and phase: its mount point is made in bubblewrap's own root, never on
        the host, and what the host holds there (say a leftover /opt/venv) is neither seen nor used.
        What cannot be kept that way is refused naming the instruction: a file directly in /,
        anything under /proc, /sys, /dev or a host system path. (Writes into the host's system
        paths rarely get here: those are mounted read-only, so the RUN itself fails.)"""
        parents = {str(p) for point in mount_points for p in PurePosixPath(point).parents}
        parents.update(bwrap.MADE_DIRS)
        for written in _written(capture, PurePosixPath("/"), mount_points, parents):
            for path, root in _split(capture, written):
                if root == PurePosixPath("/"):
                    raise self.fail(ins, f"it wrote {path} directly in /, where the local backend keeps no files")
                refused = _refused(root, self.settings)
                if refused:
                    raise self.fail(ins, f"it wrote {path}, {refused}")
                src, dest = capture / str(path).lstrip("/"), self.layer.host_path(str(path))
                dest.parent.mkdir(parents=True, exist_ok=True)
                if dest.is_dir() and src.is_dir() and not src.is_symlink():
                    shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
                else:
                    src.rename(dest)
                self.add_root(str(root))
                log.info("task=%s line=%d kept=%s root=%s", self.task_id, ins.line, path, root)

    def drop_tmp(self) -> None:
        """Unlike docker's, the local backend's /tmp is a fresh tmpfs in every phase (it is what
        keeps trials apart), so what the RUN steps left there is not in the layer: logged and
        listed in the layer's ``ignored``, not silently dropped."""
        left = sorted(p.name for p in self.tmp.iterdir())
        if left:
            shown = ", ".join(left[:5]) + (", ..." if len(left) > 5 else "")
            self.layer.ignored.append(f"files RUN steps left in /tmp (each phase gets a fresh /tmp): {shown}")
            log.warning("task=%s dropped from /tmp after the build: %s", self.task_id, shown)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def variables(self) -> dict[str, str]:
        return {**self.args, **self.layer.env}

    def resolve(self, path: str) -> str:
        return str(PurePosixPath(self.cwd, path)) if not path.startswith("/") else str(PurePosixPath(path))

    def add_root(self, path: str, ins: dockerfile.Instruction | None = None) -> None:
        """Makes ``path`` part of the layer unless an existing root already holds it. A root under a
        host system path is refused: it cannot be mounted there without hiding the host's files or
        (bubblewrap cannot make a mount point in a read-only /usr) at all."""
        if any(PurePosixPath(path).is_relative_to(r) for r in self.layer.roots):
            self.layer.host_path(path).mkdir(parents=True, exist_ok=True)
            return
        refused = _refused(PurePosixPath(path), self.settings)
        if refused:
            if ins is not None:
                raise self.fail(ins, f"{path} is {refused}")
            raise EnvSetupError(f"task {self.task_id}: the local backend cannot write to {path}: {refused}")
        self.layer.roots = [r for r in self.layer.roots if not PurePosixPath(r).is_relative_to(path)] + [path]
        self.layer.host_path(path).mkdir(parents=True, exist_ok=True)

    def copy(
        self, ins: dockerfile.Instruction, sources: list[str], dest: str, *, extract: bool, inline: list[Path]
    ) -> None:
        target = self.resolve(dest)
        matches: list[Path] = []
        for src in sources:
            found = sorted(self.context.glob(src.lstrip("/"))) if any(c in src for c in "*?[") else [self.context / src]
            for path in found:
                resolved = path.resolve()
                if not resolved.is_relative_to(self.context):
                    raise self.fail(ins, f"source {src!r} is outside the build context")
                if not resolved.exists():
                    raise EnvSetupError(
                        f"task {self.task_id}: Dockerfile line {ins.line}: {src!r} not found in the build "
                        "context (or excluded by its .dockerignore)"
                    )
                matches.append(resolved)
        matches += inline
        into_dir = dest.endswith("/") or len(matches) > 1 or any(m.is_dir() for m in matches)
        self.add_root(target if into_dir else str(PurePosixPath(target).parent), ins)
        out = self.layer.host_path(target)
        for src_path in matches:
            if extract and src_path not in inline and src_path.is_file() and src_path.name.endswith(_TAR_SUFFIXES):
                out.mkdir(parents=True, exist_ok=True)
                with tarfile.open(src_path) as tar:
                    tarsafe.extractall(tar, out, "data")
            elif src_path.is_dir():
                shutil.copytree(src_path, out, symlinks=True, dirs_exist_ok=True)
            elif into_dir:
                out.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src_path, out / src_path.name)
            else:
                shutil.copy2(src_path, out)


def _written(capture: Path, under: PurePosixPath, points: set[str], parents: set[str]) -> list[PurePosixPath]:
    """The top-most entries of ``capture`` (a RUN's ``/``) that bubblewrap did not create as mount
    points or their parents: what the RUN itself wrote outside every mount."""
    found: list[PurePosixPath] = []
    for entry in sorted(os.scandir(capture / str(under).lstrip("/")), key=lambda e: e.name):
        path = under / entry.name
        if str(path) in points:
            continue  # a mount point: what was written there is in the mount
        if str(path) in parents and entry.is_dir(follow_symlinks=False):
            found += _written(capture, path, points, parents)
        else:
            found.append(path)
    return found


def _split(capture: Path, path: PurePosixPath) -> list[tuple[PurePosixPath, PurePosixPath]]:
    """(what to move, the layer root that will hold it) for one written entry. A directory a base
    image lacks is its own root (/opt/venv); one it has (/opt, ``BASE_DIRS``) is split into its
    entries, so the root stays as narrow as what the RUN created; a file's root is its directory."""
    src = capture / str(path).lstrip("/")
    if not src.is_dir() or src.is_symlink():
        return [(path, path.parent)]
    children = sorted(src.iterdir())
    if str(path) not in BASE_DIRS or not children:
        return [(path, path)]
    if any(not c.is_dir() or c.is_symlink() for c in children):
        return [(path, path)]
    return [pair for child in children for pair in _split(capture, path / child.name)]


def _refused(root: PurePosixPath, settings: LocalBackendSettings) -> str:
    """Why ``root`` cannot be a layer root ('' if it can)."""
    if root == PurePosixPath("/"):
        return "the root directory, which the local backend cannot replace (the host is its base system)"
    for base in (*settings.system_paths, *_NOT_KEPT):
        if root.is_relative_to(base):
            return f"under {base}, which the local backend cannot write (the host is its read-only base system)"
    return ""
