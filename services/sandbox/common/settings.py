"""Settings of the sandbox service (``[sandbox]`` in a config file, env prefix ``HARNESSRL_SANDBOX_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from harnessrl import paths
from harnessrl.config import ServiceSettings

# The test files a task ships in its workspace: restored from the pristine
# snapshot before verify when they existed there, deleted when the agent created
# them. What the runner or the interpreter loads implicitly (config files,
# conftest.py, plugins, .pth, shadowing modules, bytecode) is not a list of names
# but ``runner_guard``'s routes (``guard_runner_routes``).
DEFAULT_PROTECTED = ("test_*.py", "*_test.py")
# Directories whose every file is protected the same way.
DEFAULT_PROTECTED_DIRS = ("tests", "test")


class IntegrityPolicy(BaseModel):
    """Reward-integrity defences (invariant 6). Every one is on in production;
    switching one off exists only so the red-team suite can prove that the
    defence is what makes its cheat fail."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    squash_git_history: bool = Field(default=True, description="One-commit history; no original object reachable.")
    hide_tests_and_solution: bool = Field(default=True, description="Tests and solution absent during the agent phase.")
    restore_pristine_files: bool = Field(
        default=True, description="Restore the workspace's test files (protected_globs/dirs) before verify."
    )
    guard_runner_routes: bool = Field(
        default=True,
        description="Before verify, revert every change of the agent's that the test runner or the interpreter "
        "would load implicitly (config files, conftest, plugin metadata, .pth, shadowing modules, bytecode); "
        "see runner_guard.py.",
    )
    harden_verifier_env: bool = Field(
        default=True,
        description="The verifier runs with PYTHONPYCACHEPREFIX at a fresh directory (no __pycache__ is read) "
        "and PYTHONNOUSERSITE=1.",
    )
    guard_verifier_path: bool = Field(
        default=True,
        description="Before verify (which runs as the task's user, often root, with the task's network), revert "
        "every change of the agent's in a workspace directory on the verifier's PATH and (docker) on root's "
        "implicit routes outside it (PATH, /etc, /root, /usr/local, cron), and clear its files' set-id bits; "
        "see verifier_policy.py.",
    )
    isolate_network: bool = Field(default=True, description="Agent phase reaches only the proxy.")
    kill_agent_processes: bool = Field(default=True, description="Every agent-phase process dead before verify.")
    protect_reward_files: bool = Field(
        default=True, description="/logs/verifier invisible to the agent, fresh for verify."
    )
    suspicious: Literal["flag", "zero"] = Field(
        default="flag",
        description="What a hit of the reward-hack detector on the agent's change does (defences/suspicious.py): "
        "'flag' counts it (outcome, capture, dashboard); 'zero' also makes the trial's reward 0.",
    )
    protected_globs: tuple[str, ...] = Field(default=DEFAULT_PROTECTED, description="File-name patterns (fnmatch).")
    protected_dirs: tuple[str, ...] = Field(default=DEFAULT_PROTECTED_DIRS, description="Directory names.")


# Resource limits a backend enforces through the host's cgroups (or its engine).
EnforcedLimit = Literal["memory", "pids", "cpu"]
_CGROUP_ROOT_HELP = (
    "Where the host's cgroups are mounted: the cgroup2 mount itself (unified hierarchy) "
    "or the directory holding the v1 controllers."
)
_UNENFORCED_HELP = (
    "Limits this host may leave unenforced (memory, pids, cpu): the backend then starts with a warning "
    "naming them; without this it refuses to start when it cannot enforce one."
)


class LocalBackendSettings(BaseModel):
    """The bubblewrap backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bwrap: str = Field(default="bwrap", description="bubblewrap binary.")
    verify_network: Literal["none", "auto", "host"] = Field(
        default="auto",
        description="Network of a verifier whose task asks for a public one (Harbor's default): 'auto' (a "
        "bubblewrap sandbox has no network of its own to give, so such a task's trials are refused at start, "
        "naming this setting, as docker's 'auto' on an engine without a bridge: its verifier may need the "
        "network to fetch its test tools, and would score 0 for want of it), 'none' (such a verifier runs with "
        "no network: for tasks whose tests need none) or 'host', the worker host's network, "
        "which also lets the agent's code, which the verifier runs, reach every loopback service of the "
        "host (Redis, the proxy, the capture store): only where nothing there must be kept from it.",
    )
    host_uid: int | None = Field(
        default=None,
        ge=1,
        description="Unprivileged host uid to drop to when the worker is root (mounts must be traversable).",
    )
    hidden_paths: tuple[str, ...] = Field(
        default=(
            "/etc/shadow",
            "/etc/gshadow",
            "/etc/shadow-",
            "/etc/gshadow-",
            "/etc/sudoers",
            "/etc/sudoers.d",
            "/etc/ssh",
        ),
        description="Host files and directories masked inside the sandbox (under a read-only system path).",
    )
    system_paths: tuple[str, ...] = Field(
        default=("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"),
        description="Host paths mounted read-only as the base system (symlinks are recreated).",
    )
    extra_ro_paths: tuple[str, ...] = Field(
        default=(), description="More host paths mounted read-only at the same place."
    )
    python: str = Field(
        default="/usr/bin/python3", description="Interpreter inside the sandbox for the proxy forwarder."
    )
    disk_poll_s: float = Field(default=0.5, gt=0, description="How often the disk watchdog measures the workspace.")
    tmp_size_mb: int = Field(
        default=512, gt=0, description="Size of the sandbox's /tmp (tmpfs, charged to its memory)."
    )
    cgroup_root: Path = Field(default=Path("/sys/fs/cgroup"), description=_CGROUP_ROOT_HELP)
    limits_unenforced_ok: tuple[EnforcedLimit, ...] = Field(default=(), description=_UNENFORCED_HELP)
    memory_rlimit_fallback: bool = Field(
        default=False,
        description="Without a memory cgroup, cap each exec's address space (RLIMIT_AS) at its memory limit "
        "instead. Breaks Node and Bun harnesses (Claude Code, OpenCode, Codex): they reserve far more address "
        "space than they use.",
    )


class DockerBackendSettings(BaseModel):
    """The Docker backend (one container per trial on a Docker engine)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str | None = Field(
        default=None,
        description="Engine address, e.g. unix:///run/docker.sock; unset: DOCKER_HOST or the default socket.",
    )
    build_network: str = Field(
        default="host", description="Network of `docker build` steps (RUN apt-get/pip): host, none or default."
    )
    pull: bool = Field(default=True, description="Pull [environment] docker_image when it is not present locally.")
    api_timeout_s: float = Field(default=120.0, gt=0, description="Timeout of one engine API call.")
    disk_poll_s: float = Field(
        default=0.5,
        gt=0,
        description="How often the disk watchdog measures a container's writable layer where the storage "
        "driver has no quota (overlay2 on ext4: --storage-opt size is refused there).",
    )
    cgroup_root: Path = Field(
        default=Path("/sys/fs/cgroup"),
        description=_CGROUP_ROOT_HELP + " Read for the containers' OOM kills and pids-limit hits.",
    )
    limits_unenforced_ok: tuple[EnforcedLimit, ...] = Field(default=(), description=_UNENFORCED_HELP)
    verify_network: str = Field(
        default="auto",
        min_length=1,
        description="Docker network of a verifier whose task asks for a public network (its fresh container; "
        "the agent's always has none): 'auto' (the engine's 'bridge' network where it has one; an engine "
        "without one refuses such a task's trials at start, naming this setting: its verifier could fail to "
        "fetch its test tools and score 0), 'none' (such a verifier runs with no network), a network the "
        "engine has, or "
        "'host', which also lets the agent's code, which the verifier runs, reach every loopback service of "
        "the worker's host (Redis, the proxy, the capture store): only where nothing there must be kept "
        "from it.",
    )
    warm_pool: int = Field(
        default=0,
        ge=0,
        le=256,
        description="Containers kept created and started per task (its prepared image, mounts and limits) before a "
        "trial asks for one, each handed to exactly one trial and removed after it (backends/docker_pool.py); the "
        "pool learns a task from its first trial and refills in the background. 0: off, every trial creates and "
        "starts its own (~0.4-0.5 s of the engine's time here). A worker's concurrency is a good size; each idle "
        "one holds an init and a sleep process.",
    )
    warm_pool_tasks: int = Field(
        default=4,
        ge=1,
        le=64,
        description="How many tasks the warm pool keeps containers for at once; the least recently asked for is "
        "drained first.",
    )


# -- Kubernetes backend ---------------------------------------------------------
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# Volume sources a runtime volume may name (one key of a Kubernetes ``Volume``).
RUNTIME_VOLUME_SOURCES = ("hostPath", "persistentVolumeClaim", "image", "nfs", "csi", "ephemeral", "configMap")


class RuntimeVolume(BaseModel):
    """A read-only volume holding harness installs (npm prefix, venvs, their
    interpreter), mounted in the agent container at ``mount_path``. Harness
    install paths are worker paths; each must lie under one ``mount_path``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_DNS_LABEL, description="Volume name in the pod (a DNS label).")
    mount_path: str = Field(description="Absolute path in the agent container, also the worker path it stands for.")
    source: dict[str, Any] = Field(
        description="One Kubernetes volume source, e.g. {hostPath: {path: /opt/tools, type: Directory}}, "
        "{persistentVolumeClaim: {claimName: tools, readOnly: true}} or {image: {reference: REF}}."
    )
    sub_path: str | None = Field(default=None, description="subPath of the volume to mount.")

    @field_validator("mount_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or value.rstrip("/") == "" or ".." in value.split("/"):
            raise ValueError(f"mount_path must be an absolute path other than / (got {value!r})")
        return value.rstrip("/")

    @field_validator("source")
    @classmethod
    def _one_source(cls, value: dict[str, Any]) -> dict[str, Any]:
        keys = sorted(value)
        if len(keys) != 1 or keys[0] not in RUNTIME_VOLUME_SOURCES or not isinstance(value[keys[0]], dict):
            raise ValueError(f"source must have exactly one of {list(RUNTIME_VOLUME_SOURCES)} (a mapping), got {keys}")
        return value


class KubernetesBackendSettings(BaseModel):
    """The Kubernetes backend (one pod per trial; see backends/kubernetes.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field(default="harnessrl", pattern=_DNS_LABEL, description="Namespace of the trial pods.")
    kubeconfig: Path | None = Field(default=None, description="kubeconfig file; default: in-cluster, then ~/.kube.")
    context: str | None = Field(default=None, description="kubeconfig context.")
    agent_uid: int = Field(default=1000, ge=1, le=2**31 - 1, description="uid/gid of the agent container.")
    verifier_uid: int = Field(
        default=0,
        ge=0,
        le=2**31 - 1,
        description="uid/gid of the verifier container when the task sets no numeric [verifier] user: the uid of "
        "your task images' USER (Harbor runs the verifier as the image's USER; 0, root, for nearly every task).",
    )
    helper_image: str | None = Field(
        default=None,
        description="Image of the root helper container (uploads, ownership); default: the task's image.",
    )
    relay_image: str = Field(
        default="docker.io/alpine/socat:1.8.0.0",
        min_length=1,
        description="Image with socat for the relay sidecar to the proxy (pin it by digest in production).",
    )
    proxy_address: str | None = Field(
        default=None,
        description="host:port the relay dials (the proxy's Service, or an IP); default: host:port of proxy_url.",
    )
    proxy_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "harnessrl-proxy"},
        min_length=1,
        description="Labels of the proxy pods: the only egress of the agent phase.",
    )
    proxy_namespace: str | None = Field(
        default=None, pattern=_DNS_LABEL, description="Namespace of the proxy pods; default: namespace."
    )
    proxy_target_port: int | None = Field(
        default=None, ge=1, le=65535, description="The proxy pods' port (after the Service); default: proxy_address's."
    )
    dns_namespace: str = Field(default="kube-system", pattern=_DNS_LABEL, description="Namespace of the cluster DNS.")
    dns_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"k8s-app": "kube-dns"}, min_length=1, description="Labels of the cluster DNS pods."
    )
    runtime_volumes: tuple[RuntimeVolume, ...] = Field(
        default=(), description="Read-only volumes holding the harness installs (none: only script harnesses run)."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = Field(default=(), description="Secret names for private registries.")
    runtime_class_name: str | None = Field(default=None, description="RuntimeClass (gVisor, Kata) of the pods.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="nodeSelector of the pods.")
    start_timeout_s: float = Field(default=300.0, gt=0, description="Scheduling + image pull + init, per pod.")

    @field_validator("proxy_address")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            host, sep, port = value.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"proxy_address must be host:port (got {value!r})")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> KubernetesBackendSettings:
        if self.agent_uid == self.verifier_uid:
            raise ValueError(
                f"agent_uid and verifier_uid must differ (both {self.agent_uid}): the agent must not write the reward"
            )
        for attr in ("name", "mount_path"):
            values = [getattr(v, attr) for v in self.runtime_volumes]
            if len(values) != len(set(values)):
                raise ValueError(f"runtime_volumes: duplicate {attr} in {values}")
        return self


class Settings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESSRL_SANDBOX_", extra="forbid", validate_default=True)

    backend: str = Field(default="local", description="Sandbox backend: local, docker or kubernetes.")
    queue_url: str = Field(default="memory://", description="memory:// (in-process) or redis://host:port/db.")
    concurrency: int = Field(default=4, ge=1, le=256, description="Trials one worker runs at once.")
    work_dir: Path = Field(default_factory=lambda: paths.home() / "sandbox" / "trials", description="Trial dirs.")
    cache_dir: Path = Field(default_factory=lambda: paths.home() / "sandbox" / "cache", description="Layer cache.")
    artifacts_dir: Path = Field(
        default_factory=lambda: paths.home() / "sandbox" / "artifacts",
        description="Logs kept per trial, in <artifacts_dir>/<run id>/<trial id>.",
    )
    artifacts_flat: bool = Field(
        default=False,
        description="artifacts_dir is the folder of the one trial this runner runs (harnessrl trial run: "
        "<run dir>/artifacts), not a root of run and trial folders.",
    )
    keep_trial_dirs: bool = Field(default=False, description="Keep workspaces after teardown (debugging).")
    lease_s: float = Field(default=30.0, gt=0, description="A worker that misses heartbeats this long loses its trial.")
    heartbeat_s: float = Field(default=5.0, gt=0)
    max_attempts: int = Field(default=2, ge=1, le=10, description="Attempts of a trial whose worker died.")
    crash_retries: int = Field(
        default=1,
        ge=0,
        le=9,
        description="Retries of a trial whose attempt raised out of the worker's own code (a bug, a capture store "
        "that refuses it). Such a crash usually repeats, so after this many (and never past max_attempts) the trial "
        "ends env_setup_failed with an error naming the crash, finalized so its group completes.",
    )
    default_agent_timeout_s: float = Field(default=1800.0, gt=0)
    default_verifier_timeout_s: float = Field(default=600.0, gt=0)
    max_memory_mb: int = Field(default=8192, gt=0)
    default_memory_mb: int = Field(default=2048, gt=0)
    max_storage_mb: int = Field(default=10240, gt=0)
    default_storage_mb: int = Field(default=2048, gt=0)
    pids_limit: int = Field(default=512, gt=0)
    output_limit_bytes: int = Field(default=1 << 20, gt=0, description="Bounded capture of a harness's stdout+stderr.")
    proxy_url: str | None = Field(
        default=None, description="Proxy base URL for admin calls, e.g. http://127.0.0.1:8080."
    )
    proxy_admin_token: SecretStr | None = None
    proxy_uds_path: Path | None = Field(default=None, description="The proxy's Unix socket; relayed to when set.")
    capture_target: str | None = Field(default=None, description="host:port of the capture store (FinalizeTrajectory).")
    capture_token: SecretStr | None = None
    proxy_port_in_sandbox: int = Field(
        default=4100, ge=1024, le=65535, description="Loopback port forwarding to the proxy."
    )
    local: LocalBackendSettings = LocalBackendSettings()
    kubernetes: KubernetesBackendSettings = KubernetesBackendSettings()
    docker: DockerBackendSettings = DockerBackendSettings()
    integrity: IntegrityPolicy = IntegrityPolicy()
