"""The one interface every sandbox backend implements (local bubblewrap,
Docker, Kubernetes), the capabilities each declares, and the request/result
records of an exec.

A backend is constructed with the integrity policy and limits it must honour;
``check_requirements`` refuses to build one whose declared capabilities fall
short, so a misconfigured deployment fails at start, not in the middle of a run.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Collection
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import ClassVar, get_args

from pydantic import BaseModel, ConfigDict, Field

from services.sandbox.common import tarsafe
from services.sandbox.common.errors import CapabilityError
from services.sandbox.common.paths import SandboxPaths, TrialDirs
from services.sandbox.common.settings import EnforcedLimit, IntegrityPolicy
from services.sandbox.defences import module_shadow, path_guard, runner_guard, suspicious
from services.sandbox.task.model import Task

log = logging.getLogger(__name__)

LIMITS: tuple[str, ...] = get_args(EnforcedLimit)


class Phase(StrEnum):
    SETUP = "setup"
    AGENT = "agent"
    VERIFY = "verify"


class Network(StrEnum):
    """What an exec may reach."""

    NONE = "none"
    PROXY_ONLY = "proxy-only"
    PUBLIC = "public"


class Capabilities(BaseModel):
    """What a backend can enforce. Checked against what the settings require."""

    model_config = ConfigDict(frozen=True)

    builds_dockerfile: bool = Field(description="Builds environment/Dockerfile itself.")
    prebuilt_images: bool = Field(description="Runs [environment] docker_image.")
    network_isolation: bool = Field(description="Agent phase can be limited to the proxy only.")
    kills_process_tree: bool = Field(description="Every process of a phase is dead when exec returns.")
    hides_verifier_files: bool = Field(description="Tests, solution and reward files are invisible to the agent.")
    squashes_git_history: bool = Field(description="One-commit git history in the workspace, nothing older reachable.")
    memory_limit: bool
    pids_limit: bool
    cpu_limit: bool = Field(default=True, description="A task's cpus is enforced as a CPU quota.")
    limits_detail: str = Field(default="", description="How this host enforces the limits (cgroup v1/v2, driver).")
    disk_limit: bool
    wall_time_limit: bool
    non_root: bool = Field(description="Processes run as a non-root uid with no capabilities.")


class Limits(BaseModel):
    """Resource limits of one sandbox (task values, capped by settings)."""

    model_config = ConfigDict(frozen=True)

    memory_mb: int = Field(default=2048, gt=0)
    pids: int = Field(default=512, gt=0)
    storage_mb: int = Field(default=2048, gt=0)
    cpus: float | None = None
    output_limit_bytes: int = Field(default=1 << 20, gt=0)


class SandboxSpec(BaseModel):
    """What ``start`` needs."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    trial_id: str
    task: Task
    dirs: TrialDirs
    limits: Limits
    # Host paths mounted read-only at the same path (harness installs and their interpreters).
    ro_mounts: tuple[Path, ...] = ()
    # Worker-side Unix socket that reaches the proxy (bound into the agent phase).
    proxy_socket: Path | None = None


class Sandbox(BaseModel):
    """A started sandbox. Backends keep their own state in ``handle``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    spec: SandboxSpec
    paths: SandboxPaths
    env: dict[str, str] = Field(default_factory=dict, description="The image's ENV plus the task's.")
    handle: object = None


class ExecRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    argv: list[str] = Field(min_length=1)
    phase: Phase
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    timeout_s: float = Field(gt=0)
    network: Network = Network.NONE
    # Inside-sandbox loopback port that forwards to the proxy (PROXY_ONLY only).
    proxy_port: int | None = None
    stdin: bytes | None = None
    # Who runs it: None is the sandbox user (uid 1000, no capabilities: the agent);
    # otherwise Harbor's verifier user: '' the image's USER, or a name or uid[:gid]
    # (``verifier_policy``).
    user: str | None = None


class ExecResult(BaseModel):
    exit_code: int
    timed_out: bool = False
    output: bytes = b""
    output_bytes: int = 0
    output_truncated: bool = False
    oom_killed: bool = False
    pids_limit_hit: bool = False
    disk_exceeded: bool = False
    killed_leftovers: int = Field(
        default=0, description="Processes still alive after the main one exited, then killed."
    )
    duration_s: float = 0.0
    cpu_s: float | None = Field(
        default=None,
        description="CPU-seconds (user + system) of the exec's process tree; None where the backend cannot tell "
        "(its processes are not the worker's children: docker, kubernetes).",
    )

    def events(self) -> list[str]:
        flags = {
            "timed_out": self.timed_out,
            "output_truncated": self.output_truncated,
            "oom_killed": self.oom_killed,
            "pids_limit_hit": self.pids_limit_hit,
            "disk_exceeded": self.disk_exceeded,
        }
        events = [name for name, on in flags.items() if on]
        if self.killed_leftovers:
            events.append(f"killed_leftover_processes={self.killed_leftovers}")
        return events


class Backend(abc.ABC):
    """start -> exec* -> (upload/download)* -> stop. All methods are async."""

    name: ClassVar[str]
    # Runs multi-step tasks ([[steps]]): its ``next_step`` readies the sandbox for the next step.
    runs_steps: ClassVar[bool] = False
    # Set by each backend before ``Backend.__init__`` checks it (it may depend on the host).
    capabilities: Capabilities
    # Non-empty where a verifier that asks for a public network cannot have one and the
    # operator did not say to verify without it (verify_network 'auto' where the backend has
    # no network to give): what to change. Such a task's trials are refused at start
    # (trial/runner.py): its verifier could fail to fetch its test tools and score 0 for it.
    public_verify_network_missing: str = ""

    def __init__(self, integrity: IntegrityPolicy, limits_unenforced_ok: Collection[str] | None = None) -> None:
        self.integrity = integrity
        check_requirements(self.name, self.capabilities, integrity, limits_unenforced_ok)

    @abc.abstractmethod
    async def start(self, spec: SandboxSpec) -> Sandbox:
        """Builds or fetches the environment and prepares the workspace. Raises EnvSetupError."""

    @abc.abstractmethod
    async def exec(self, sandbox: Sandbox, request: ExecRequest, cancel: asyncio.Event | None = None) -> ExecResult:
        """Runs a command to completion (or its timeout, or ``cancel``); every process
        it started is dead on return (unless the integrity policy says otherwise)."""

    @abc.abstractmethod
    async def upload(self, sandbox: Sandbox, src: Path, dst: PurePosixPath) -> None:
        """Copies a host file or directory into the sandbox."""

    @abc.abstractmethod
    async def download(self, sandbox: Sandbox, src: PurePosixPath, dst: Path) -> None:
        """Copies a sandbox file or directory to the host."""

    async def restore_protected(
        self, sandbox: Sandbox, imports: module_shadow.VerifierImports | None = None
    ) -> list[str]:
        """The file defences before verify, as the integrity policy switches them: the
        workspace's test files restored from the pristine snapshot and every change a
        test runner would load implicitly reverted (``runner_guard``; ``imports``: what
        the verifier's Python imports from outside the workspace, ``module_shadow``);
        returns the tamper events. Generic version: round-trips the workspace through
        the host (backends override it with something cheaper)."""
        dirs, paths = sandbox.spec.dirs, sandbox.paths
        pristine, current = dirs.root / "pristine", dirs.root / "current"
        if not pristine.exists():
            raise RuntimeError("snapshot_pristine was not called at start")
        await self.download(sandbox, paths.workdir, current)
        events = await asyncio.to_thread(restore_workspace, sandbox, current, pristine, self.integrity, imports)
        if any(not suspicious.is_event(e) for e in events):  # something was reverted
            await self.upload(sandbox, current, paths.workdir)
        return events

    async def prepare_verify(self, sandbox: Sandbox, user: str, network: Network) -> list[str]:
        """Called once before anything of the verify phase (restore, uploads, exec) with the
        verifier's user and network (``verifier_policy``): a backend that verifies in a fresh
        sandbox, or must clean what the agent left on root's routes, does it here. Returns
        tamper events. Default: nothing to do (every exec picks its own user and network)."""
        return []

    async def next_step(self, sandbox: Sandbox) -> None:
        """Between the steps of a multi-step task, before the next agent phase: the sandbox as
        the last verify left it (Harbor's shared verifier), but for the verify phase's own
        (its tests, reward files and logs: Harbor empties /tests and /logs/verifier) and the
        last agent's logs (Harbor empties /logs/agent; the runner kept them per step), with
        everything the agent phase had (user, network, mounts). Only where ``runs_steps``."""
        raise NotImplementedError(f"the {self.name} backend does not run multi-step tasks")

    async def snapshot_pristine(self, sandbox: Sandbox) -> None:
        """Keeps a host copy of the workspace as it was before the agent (generic version)."""
        await self.download(sandbox, sandbox.paths.workdir, sandbox.spec.dirs.root / "pristine")

    async def cleanup_orphans(self) -> int:
        """Removes what dead workers left behind (safe while other workers run);
        returns how many sandboxes it removed. Workers call it at start."""
        return 0

    async def close(self) -> None:
        """Releases what the backend holds beyond its sandboxes (the Docker backend's warm
        pool), when its worker stops or its process shuts down. Idempotent."""
        return None

    @abc.abstractmethod
    async def stop(self, sandbox: Sandbox) -> None:
        """Kills whatever is left and releases every resource. Idempotent."""


def empty_dir(path: Path) -> None:
    """Removes what ``path`` holds, keeping the directory itself (its owner, its mode: a mount
    point stays one): /logs/agent between the steps of a multi-step task, as Harbor empties it."""
    import shutil

    for child in path.iterdir() if path.is_dir() else ():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def restore_workspace(
    sandbox: Sandbox,
    current: Path,
    pristine: Path,
    policy: IntegrityPolicy,
    imports: module_shadow.VerifierImports | None = None,
) -> list[str]:
    """Every file defence of a workspace before verify (``current``: it, or its host copy), as
    ``policy`` switches them: ``runner_guard``'s, then the verifier's PATH (``verifier_policy``)."""
    importable = imports.names if imports is not None else frozenset()
    # The detector reads the change before the guards revert any of it (``suspicious.PREFIX``
    # marks its events among the tamper events; the verify phase counts them apart).
    events = suspicious.scan(current, pristine)
    events += runner_guard.restore_for_verify(current, pristine, policy, importable)
    if policy.guard_verifier_path:
        task, workdir = sandbox.spec.task, str(sandbox.paths.workdir)
        events += path_guard.guard_workspace(current, pristine, sandbox.env, task, workdir)
    return events


def check_requirements(
    name: str, caps: Capabilities, integrity: IntegrityPolicy, limits_unenforced_ok: Collection[str] | None = None
) -> None:
    """Refuses a backend that cannot enforce the integrity policy it is given, or (for
    backends that pass ``limits_unenforced_ok``) a resource limit not in that list."""
    needed = {
        "network_isolation": integrity.isolate_network,
        "kills_process_tree": integrity.kill_agent_processes,
        "hides_verifier_files": integrity.hide_tests_and_solution or integrity.protect_reward_files,
        "squashes_git_history": integrity.squash_git_history,
        "wall_time_limit": True,
    }
    missing = [cap for cap, required in needed.items() if required and not getattr(caps, cap)]
    if missing:
        raise CapabilityError(f"backend {name!r} lacks capabilities {missing} that the integrity policy requires")
    if limits_unenforced_ok is not None:
        _check_limits(name, caps, limits_unenforced_ok)


def _check_limits(name: str, caps: Capabilities, accepted: Collection[str]) -> None:
    unenforced = [limit for limit in LIMITS if not getattr(caps, f"{limit}_limit")]
    refused = [limit for limit in unenforced if limit not in accepted]
    if refused:
        raise CapabilityError(
            f"backend {name!r} cannot enforce the {', '.join(refused)} limit(s) on this host ({caps.limits_detail}); "
            f"make the host's cgroups usable, or accept running without: "
            f"[sandbox.{name}] limits_unenforced_ok = {unenforced}"
        )
    if unenforced:
        log.warning(
            "resource limits NOT enforced (accepted by limits_unenforced_ok)",
            extra={"kv": {"backend": name, "unenforced": unenforced, "detail": caps.limits_detail}},
        )
    else:
        log.info("resource limits enforced", extra={"kv": {"backend": name, "detail": caps.limits_detail}})


def unpack_tar(data: bytes, src: PurePosixPath, dst: Path, policy: tarsafe.Policy = "data") -> None:
    """Unpacks a tar of sandbox path ``src`` (arcname = its name) so that it lands
    at ``dst`` (merged into what is there), whatever ``dst`` is named. ``policy``:
    ``tarsafe``'s (``tar`` keeps symlinks as they are, for copies of a workspace)."""
    import io
    import shutil
    import tarfile
    import tempfile

    dst.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        if dst.name == src.name:
            tarsafe.extractall(tar, dst.parent, policy)
            return
        scratch = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dst.parent))
        try:
            tarsafe.extractall(tar, scratch, policy)
            unpacked = scratch / src.name
            if unpacked.is_dir() and not unpacked.is_symlink():
                shutil.copytree(unpacked, dst, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.move(unpacked, dst)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
