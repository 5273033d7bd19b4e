"""The local backend: one bubblewrap sandbox per exec over a per-trial
workspace copied from a cached layer.

It is fast, not faithful to the base image: the host system (read-only) is
every task's base, and ``layers.py`` replays the Dockerfile on top of it (ENV
from Docker's default PATH, WORKDIR, COPY/ADD, RUN whose new directories are
kept as layer roots). What it cannot reproduce (a RUN that changes /usr or
/etc, a base image's own files and env, multi-stage builds) fails setup naming
the Dockerfile line; the docker backend runs the task's real image.

Every exec mounts only what its phase may see (``_phase_mounts``): the agent
phase gets the workspace, its logs, its HOME, the harness installs read-only
and the proxy's socket; never the tests, the solution (but for the oracle) or
/logs/verifier. The verify phase gets a fresh /tests copy and a fresh
/logs/verifier. Each exec has its own pid namespace (its processes die with
it) and cgroups (memory, pids, cpu; v1 or v2, see ``cgroups.py``; swept empty
before exec returns).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import itertools
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from services.sandbox.backends import bwrap
from services.sandbox.backends.base import (
    Backend,
    Capabilities,
    ExecRequest,
    ExecResult,
    Network,
    Phase,
    Sandbox,
    SandboxSpec,
    empty_dir,
    restore_workspace,
)
from services.sandbox.backends.cgroups import CgroupSupport, PhaseCgroup
from services.sandbox.backends.layers import Layer, LayerCache
from services.sandbox.backends.limits import watch_disk
from services.sandbox.common.errors import BackendUnavailable, EnvSetupError
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.common.settings import Settings
from services.sandbox.defences import module_shadow
from services.sandbox.task import verifier_policy

log = logging.getLogger(__name__)

FORWARDER = Path(__file__).with_name("forwarder.py")
# Where the forwarder and the proxy's socket appear in the agent phase (outside the read-only runtime dir).
NET_DIR = PurePosixPath("/run/harnessrl-net")
_PASSWD = "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/bash\n"
_GROUP = "root:x:0:\nagent:x:1000:\n"


@dataclass
class _Handle:
    layer: Layer
    uploads: dict[str, Path] = field(default_factory=dict)
    cgroups: list[PhaseCgroup] = field(default_factory=list)
    counter: itertools.count[int] = field(default_factory=itertools.count)
    stopped: bool = False
    # Held (flock) while this process owns the trial dir; a dead worker's lock is free.
    owner: IO[str] | None = None


class LocalBackend(Backend):
    name = "local"
    runs_steps = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cfg = settings.local
        if shutil.which(self.cfg.bwrap) is None:
            raise BackendUnavailable(
                f"bubblewrap ({self.cfg.bwrap}) not found; install the Debian package 'bubblewrap'"
            )
        self.cgroup_support = CgroupSupport.detect(self.cfg.cgroup_root)
        # RLIMIT_AS only where the operator chose it: Node and Bun harnesses reserve huge address space.
        self.memory_rlimit = self.cfg.memory_rlimit_fallback and not self.cgroup_support.enforces("memory")
        self.layers = LayerCache(settings.cache_dir, self.cfg)
        if self.cfg.verify_network == "auto":  # a bubblewrap sandbox has no network of its own to give
            self.public_verify_network_missing = (
                "[sandbox.local] verify_network = 'auto' (the default): the local backend has no network to give a "
                "verifier; set 'none' to verify with no network, or 'host' (the worker's, which the agent's code "
                "would reach too)"
            )
        self.capabilities = Capabilities(
            builds_dockerfile=True,
            prebuilt_images=False,
            network_isolation=True,
            kills_process_tree=True,
            hides_verifier_files=True,
            squashes_git_history=True,
            memory_limit=self.cgroup_support.enforces("memory") or self.memory_rlimit,
            pids_limit=self.cgroup_support.enforces("pids"),
            cpu_limit=self.cgroup_support.enforces("cpu"),
            limits_detail=self.cgroup_support.describe()
            + ("; memory: RLIMIT_AS instead (memory_rlimit_fallback)" if self.memory_rlimit else ""),
            disk_limit=True,
            wall_time_limit=True,
            non_root=True,
        )
        super().__init__(settings.integrity, self.cfg.limits_unenforced_ok)

    async def start(self, spec: SandboxSpec) -> Sandbox:
        if spec.task.compose is not None:
            raise EnvSetupError(
                f"task {spec.task.task_id}: environment/docker-compose.yaml: the local backend runs one sandbox and "
                "no services (sidecars); run the task on the docker or kubernetes backend"
            )
        run = verifier_policy.resolve(spec.task)
        verifier_policy.check_local_user(spec.task, run)
        for i, step in enumerate(spec.task.steps):
            step_run = verifier_policy.for_step(run, step.config.verifier.user)
            verifier_policy.check_local_user(spec.task, step_run, f"steps[{i}].verifier.user")
        layer = await self.layers.get(spec.task, squash_git=self.integrity.squash_git_history)
        dirs = spec.dirs.create()
        owner = _own(dirs.root / OWNER_FILE)
        await _copy_tree(layer.host_path(layer.workdir), dirs.workspace)
        etc = dirs.runtime / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "passwd").write_text(_PASSWD)
        (etc / "group").write_text(_GROUP)
        paths = SandboxPaths.for_workdir(layer.workdir)
        return Sandbox(spec=spec, paths=paths, env=dict(layer.env), handle=_Handle(layer=layer, owner=owner))

    async def exec(self, sandbox: Sandbox, request: ExecRequest, cancel: asyncio.Event | None = None) -> ExecResult:
        handle = _handle(sandbox)
        spec, limits = sandbox.spec, sandbox.spec.limits
        name = f"{cgroup_prefix(spec.dirs.root)}{request.phase}-{next(handle.counter)}"
        cgroup = PhaseCgroup.create(self.cgroup_support, name, limits.memory_mb, limits.pids, limits.cpus)
        handle.cgroups.append(cgroup)
        keep_alive = request.phase == Phase.AGENT and not self.integrity.kill_agent_processes
        argv = list(request.argv)
        if request.network == Network.PROXY_ONLY and spec.proxy_socket is not None:
            sock = str(NET_DIR / "proxy.sock")
            argv = [self.cfg.python, str(NET_DIR / "forwarder.py"), f"127.0.0.1:{request.proxy_port}"]
            argv += [sock, "--", *request.argv]
        # A verifier runs the agent's code: the host's network (loopback services included)
        # only where [sandbox.local] verify_network says so.
        public = request.network == Network.PUBLIC and (
            request.phase != Phase.VERIFY or self.cfg.verify_network == "host"
        )
        share_net = public or (request.phase == Phase.AGENT and not self.integrity.isolate_network)
        # The verifier as Harbor's user: root is uid 0 of the exec's user namespace, with no
        # capabilities: `id -u` is 0 and the workspace is its own, but the host system stays
        # read-only (apt-get fails there, honestly: the host is every task's base system).
        root = request.user is not None and verifier_policy.is_root(request.user, handle.layer.user)
        uid = 0 if root else bwrap.SANDBOX_UID
        rlimits = {"fsize": limits.storage_mb * 1024 * 1024}
        if self.memory_rlimit:
            rlimits["as"] = limits.memory_mb * 1024 * 1024
        inv = bwrap.build(
            self.cfg,
            argv=argv,
            mounts=self._phase_mounts(sandbox, request),
            env={**request.env, "HOME": str(sandbox.paths.home), "USER": "root" if uid == 0 else bwrap.SANDBOX_USER},
            cwd=request.cwd or str(sandbox.paths.workdir),
            uid_inside=uid,
            share_net=share_net,
            unshare_pid=not keep_alive,
            tmp_size_mb=self.cfg.tmp_size_mb,
            cgroup_procs=cgroup.procs_files(),
            rlimits=rlimits,
        )
        disk_full = asyncio.Event()
        dirs = spec.dirs
        watched = [dirs.workspace, dirs.home(request.phase), dirs.agent_logs, dirs.verifier_logs, dirs.published]
        watchdog = asyncio.ensure_future(
            watch_disk(watched, limits.storage_mb * 1024 * 1024, self.cfg.disk_poll_s, disk_full)
        )
        try:
            outcome = await bwrap.run(
                inv,
                timeout_s=request.timeout_s,
                output_limit=limits.output_limit_bytes,
                stdin=request.stdin,
                stop=[disk_full, *([cancel] if cancel else [])],
                component="harness" if request.phase == Phase.AGENT else "sandbox",
            )
        finally:
            watchdog.cancel()
        killed = 0 if keep_alive else await cgroup.kill_all()
        result = ExecResult(
            exit_code=outcome.exit_code,
            timed_out=outcome.timed_out,
            output=outcome.output.value(),
            output_bytes=outcome.output.total,
            output_truncated=outcome.output.truncated,
            oom_killed=cgroup.oom_killed(),
            pids_limit_hit=cgroup.pids_limit_hit(),
            disk_exceeded=disk_full.is_set(),
            killed_leftovers=killed,
            duration_s=outcome.duration_s,
            cpu_s=outcome.cpu_s,
        )
        if not keep_alive:
            cgroup.remove()
            handle.cgroups.remove(cgroup)
        return result

    def _phase_mounts(self, sandbox: Sandbox, request: ExecRequest) -> list[bwrap.Mount]:
        """What this phase may see. The table the integrity defences rest on."""
        handle, paths, dirs = _handle(sandbox), sandbox.paths, sandbox.spec.dirs
        phase, policy = request.phase, self.integrity
        home = dirs.home(request.phase)
        home.mkdir(parents=True, exist_ok=True)
        runtime = dirs.runtime / request.phase
        runtime.mkdir(parents=True, exist_ok=True)
        mounts = [bwrap.Mount(dirs.workspace, str(paths.workdir), writable=True)]
        mounts += [
            bwrap.Mount(handle.layer.host_path(root), root)
            for root in handle.layer.roots
            if root != handle.layer.workdir
        ]
        mounts += [
            bwrap.Mount(home, str(paths.home), writable=True),
            bwrap.Mount(dirs.runtime / "etc" / "passwd", "/etc/passwd"),
            bwrap.Mount(dirs.runtime / "etc" / "group", "/etc/group"),
            bwrap.Mount(runtime, str(paths.runtime)),
            # Harbor's publish folder: its bind mount is writable by the agent and the verifier.
            bwrap.Mount(dirs.published, str(paths.published), writable=True),
        ]
        if phase == Phase.AGENT:
            mounts.append(bwrap.Mount(dirs.agent_logs, str(paths.agent_logs), writable=True))
            mounts += [bwrap.Mount(p, str(p)) for p in sandbox.spec.ro_mounts]
            if not policy.protect_reward_files:
                mounts.append(bwrap.Mount(dirs.verifier_logs, str(paths.verifier_logs), writable=True))
            if request.network == Network.PROXY_ONLY and sandbox.spec.proxy_socket is not None:
                mounts.append(bwrap.Mount(FORWARDER, str(NET_DIR / "forwarder.py")))
                mounts.append(bwrap.Mount(sandbox.spec.proxy_socket, str(NET_DIR / "proxy.sock"), writable=True))
        elif phase == Phase.VERIFY:
            mounts.append(bwrap.Mount(dirs.agent_logs, str(paths.agent_logs)))
            mounts.append(bwrap.Mount(dirs.verifier_logs, str(paths.verifier_logs), writable=True))
        for dest, host in sorted(handle.uploads.items()):
            if self._visible(dest, phase, paths):
                mounts.append(bwrap.Mount(host, dest, writable=phase == Phase.VERIFY))
        return mounts

    def _visible(self, dest: str, phase: Phase, paths: SandboxPaths) -> bool:
        hide = self.integrity.hide_tests_and_solution
        if dest == str(paths.tests):
            return phase == Phase.VERIFY or not hide
        if dest == str(paths.solution):
            return phase == Phase.AGENT or not hide
        return True

    async def snapshot_pristine(self, sandbox: Sandbox) -> None:
        """Nothing to do: the cached layer, read-only, is the pristine snapshot."""

    async def restore_protected(
        self, sandbox: Sandbox, imports: module_shadow.VerifierImports | None = None
    ) -> list[str]:
        """The file defences before verify (test files, the runner's routes), against the
        layer: the pristine snapshot, read-only in the cache. Only the workspace outlives
        a phase here (the rest of the root is the read-only layer, /tmp and HOME are per exec)."""
        layer = _handle(sandbox).layer
        pristine = layer.host_path(layer.workdir)
        return await asyncio.to_thread(
            restore_workspace, sandbox, sandbox.spec.dirs.workspace, pristine, self.integrity, imports
        )

    async def next_step(self, sandbox: Sandbox) -> None:
        """The workspace and the agent's HOME carry over as they are; each verify exec mounts
        its own /tests (hidden from the agent); /logs/verifier (no stale reward), /logs/agent
        and /logs/artifacts (collected into the step's folder) are emptied."""
        dirs = sandbox.spec.dirs
        for logs in (dirs.verifier_logs, dirs.agent_logs, dirs.published):
            await asyncio.to_thread(empty_dir, logs)

    async def upload(self, sandbox: Sandbox, src: Path, dst: PurePosixPath) -> None:
        dirs, handle = sandbox.spec.dirs, _handle(sandbox)
        if dst.is_relative_to(sandbox.paths.workdir):
            target = dirs.workspace / dst.relative_to(sandbox.paths.workdir)
        else:
            target = dirs.root / "uploads" / str(dst).lstrip("/")
            handle.uploads[str(dst)] = target
        await asyncio.to_thread(_replace_with_copy, src, target)

    async def download(self, sandbox: Sandbox, src: PurePosixPath, dst: Path) -> None:
        host = self._host_path(sandbox, src)
        if host is None or not (host.exists() or host.is_symlink()):
            raise FileNotFoundError(f"{src} does not exist in sandbox {sandbox.spec.trial_id}")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if host.is_dir():
            await asyncio.to_thread(shutil.copytree, host, dst, symlinks=True, dirs_exist_ok=True)
        else:
            await asyncio.to_thread(shutil.copy2, host, dst, follow_symlinks=False)

    def _host_path(self, sandbox: Sandbox, src: PurePosixPath) -> Path | None:
        paths, dirs = sandbox.paths, sandbox.spec.dirs
        roots = {
            paths.workdir: dirs.workspace,
            paths.agent_logs: dirs.agent_logs,
            paths.published: dirs.published,
            paths.verifier_logs: dirs.verifier_logs,
            paths.home: dirs.home(Phase.AGENT),
            **{PurePosixPath(k): v for k, v in _handle(sandbox).uploads.items()},
        }
        for inside, host in roots.items():
            if src.is_relative_to(inside):
                return host / src.relative_to(inside)
        return None

    async def stop(self, sandbox: Sandbox) -> None:
        handle = _handle(sandbox)
        if handle.stopped:
            return
        handle.stopped = True
        for cgroup in handle.cgroups:
            await cgroup.kill_all()
            cgroup.remove()
        handle.cgroups.clear()
        if not self.settings.keep_trial_dirs:
            await asyncio.to_thread(shutil.rmtree, sandbox.spec.dirs.root, True)
        if handle.owner is not None:
            handle.owner.close()

    async def cleanup_orphans(self) -> int:
        """Removes trial dirs whose worker died (their owner lock is free) and kills
        whatever still runs in their cgroups. Safe while other workers run."""
        removed = 0
        for trial_dir in await asyncio.to_thread(_orphans, self.settings.work_dir):
            for group in PhaseCgroup.existing(self.cgroup_support, prefix=cgroup_prefix(trial_dir)):
                await group.kill_all(settle_s=0)
                group.remove()
            await asyncio.to_thread(shutil.rmtree, trial_dir, True)
            removed += 1
        return removed


OWNER_FILE = ".owner"


def cgroup_prefix(trial_dir: Path) -> str:
    """The name prefix of a sandbox's exec cgroups. Every worker in the same cgroup (two
    runs on one machine, two test processes) makes its groups side by side, and trial ids
    repeat across runs ("s0-hello-0"): the trial directory's whole path tells them apart,
    so that one worker's stop or orphan sweep never kills another worker's trial."""
    digest = hashlib.sha256(str(trial_dir.resolve()).encode()).hexdigest()[:10]
    return f"{trial_dir.name[:64]}-{digest}-"


def _own(path: Path) -> IO[str]:
    handle = open(path, "a")
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return handle


def _orphans(work_dir: Path) -> list[Path]:
    found: list[Path] = []
    if not work_dir.is_dir():
        return found
    for trial_dir in work_dir.iterdir():
        lock = trial_dir / OWNER_FILE
        if not lock.exists():
            continue
        with open(lock, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live worker owns it
            found.append(trial_dir)
    return found


def _handle(sandbox: Sandbox) -> _Handle:
    assert isinstance(sandbox.handle, _Handle)
    return sandbox.handle


def _replace_with_copy(src: Path, target: Path) -> None:
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, target, symlinks=True)
    else:
        shutil.copy2(src, target)


async def _copy_tree(src: Path, dst: Path) -> None:
    """``cp -a`` (reflinks where the filesystem has them): faster than shutil for many small files."""
    os.makedirs(dst, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        "cp", "-a", "--reflink=auto", f"{src}/.", str(dst), stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise EnvSetupError(f"copying the workspace failed: {err.decode(errors='replace').strip()}")
