"""What the Docker backend asks the engine for, as data: the trial's container and the
verifier's (``containers.create`` keyword arguments), and root's scripts around the
phases. Pure functions of the sandbox spec, tested without an engine
(tests/unit/test_sandbox_specs.py); ``docker.py`` runs them."""

from __future__ import annotations

import shlex
from pathlib import Path, PurePosixPath
from typing import Any

from services.sandbox.backends.base import Phase, SandboxSpec
from services.sandbox.backends.docker_exec import worker_identity
from services.sandbox.common.paths import SandboxPaths

LABEL_MANAGED = "io.harnessrl.managed"
LABEL_TRIAL = "io.harnessrl.trial"
LABEL_WORKER = "io.harnessrl.worker"
LABEL_VERIFY = "io.harnessrl.verify"
SANDBOX_USER = "1000:1000"
VERIFY_HOME = "/run/harnessrl-verify/home"


def container_name(spec: SandboxSpec) -> str:
    return f"harnessrl-{spec.trial_id}"[:63]


def container_spec(
    spec: SandboxSpec,
    image: str,
    workdir: str,
    *,
    isolate_network: bool,
    disk_quota: bool,
    network_mode: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``client.containers.create`` for one trial; ``network_mode``:
    a compose task's shared namespace (``container:<holder>``, ``docker_compose``)."""
    limits, dirs, paths = spec.limits, spec.dirs, SandboxPaths.for_workdir(workdir)
    volumes = {str(p): {"bind": str(p), "mode": "ro"} for p in spec.ro_mounts}
    volumes[str(dirs.home(Phase.AGENT))] = {"bind": str(paths.home), "mode": "rw"}
    volumes[str(dirs.runtime / Phase.AGENT)] = {"bind": str(paths.runtime), "mode": "ro"}
    # The agent's logs land on the worker directly (no copy out after the phase).
    volumes[str(dirs.agent_logs)] = {"bind": str(paths.agent_logs), "mode": "rw"}
    # Harbor's publish folder, bind-mounted as Harbor mounts it (the verifier's too).
    volumes[str(dirs.published)] = {"bind": str(paths.published), "mode": "rw"}
    kwargs: dict[str, Any] = {
        "image": image,
        "command": ["sleep", "infinity"],
        "name": container_name(spec),
        "detach": True,
        "working_dir": workdir,
        "labels": {LABEL_MANAGED: "true", LABEL_TRIAL: spec.trial_id, LABEL_WORKER: worker_identity()},
        # No network at all; the proxy comes in through the worker's relay. Host
        # networking only when the red-team suite switches isolation off.
        "network_mode": network_mode or ("none" if isolate_network else "host"),
        "mem_limit": f"{limits.memory_mb}m",
        "memswap_limit": f"{limits.memory_mb}m",
        "pids_limit": limits.pids,
        "cap_drop": ["ALL"],
        "cap_add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"],
        "security_opt": ["no-new-privileges"],
        "tmpfs": {"/tmp": f"size={limits.storage_mb}m,mode=1777"},
        "volumes": volumes,
        "init": True,
    }
    if disk_quota:
        kwargs["storage_opt"] = {"size": f"{limits.storage_mb}m"}
    if limits.cpus:
        kwargs["nano_cpus"] = int(limits.cpus * 1e9)
    return kwargs


def setup_script(ro_mounts: tuple[Path, ...], closed_dirs: list[str], *, protect_reward_files: bool = True) -> str:
    """Root's first exec, only when needed (the prepared image did the rest): the
    sandbox user may traverse to the read-only runtime mounts (an image's /root is
    0700), and owns /logs/verifier when that defence is off. '' when nothing is needed."""
    closed = set(closed_dirs)
    parents = sorted({str(p) for m in ro_mounts for p in PurePosixPath(m).parents if str(p) in closed})
    lines = [] if protect_reward_files else ["mkdir -p /logs/verifier && chown 1000:1000 /logs/verifier"]
    if parents:
        lines.append(f"chmod o+x {' '.join(_q(p) for p in parents)}")
    return " && ".join(lines)


def verify_container_spec(
    spec: SandboxSpec, image: str, workdir: str, *, network_mode: str, disk_quota: bool
) -> dict[str, Any]:
    """Keyword arguments of the verifier's container: the agent's, from the commit of its final
    filesystem, with the verifier's network and none of the agent's mounts but its logs (read-only)
    and /logs/artifacts (read-write, as Harbor's verifier has it)."""
    kwargs = container_spec(spec, image, workdir, isolate_network=True, disk_quota=disk_quota)
    paths = SandboxPaths.for_workdir(workdir)
    kwargs["name"] = f"harnessrl-verify-{spec.trial_id}"[:63]
    kwargs["labels"] = {**kwargs["labels"], LABEL_VERIFY: "true"}
    kwargs["network_mode"] = network_mode
    kwargs["volumes"] = {
        str(spec.dirs.agent_logs): {"bind": str(paths.agent_logs), "mode": "ro"},
        str(spec.dirs.published): {"bind": str(paths.published), "mode": "rw"},
    }
    return kwargs


def verify_script(
    *, owner: str = "1000:1000", protect_reward_files: bool = True, clear_agent_leftovers: bool = True
) -> str:
    """Root's exec before verify: a fresh reward dir and HOME, the verifier's (``owner``, a
    chown USER[:GROUP]); an empty /tmp, since the agent's leftovers (its processes, its
    files there) are gone with it."""
    who = _q(owner)
    lines = [f"rm -rf /run/harnessrl-verify && mkdir -p {VERIFY_HOME} && chown {who} {VERIFY_HOME}"]
    if protect_reward_files:
        lines.append(f"rm -rf /logs/verifier && mkdir -p /logs/verifier && chown {who} /logs/verifier")
    if clear_agent_leftovers:
        lines.append("find /tmp -mindepth 1 -delete")
    return " && ".join(lines)


def _q(text: str) -> str:
    return shlex.quote(text)
