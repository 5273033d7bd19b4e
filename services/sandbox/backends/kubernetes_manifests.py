"""What the Kubernetes backend sends to the cluster, as plain data: the trial
pod and its NetworkPolicies (the shell plans of its execs are in
``kubernetes_plans.py``). No I/O here, so all of it is unit-tested without a cluster.

One pod per trial, four containers that share only the volumes below:

* ``agent`` (the task's image, ``agent_uid``): runs the harness;
* ``verifier`` (the task's image, ``verifier_uid``): runs ``tests/test.sh``;
* ``helper`` (root with CHOWN/DAC_OVERRIDE/FOWNER only): the worker's hands for
  uploads, downloads and ownership changes; it runs nothing of the agent's;
* ``relay`` (socat, trials with a model only): 127.0.0.1:<proxy port> in the pod's
  network namespace, forwarding to the proxy.

Kubernetes exec cannot choose a user, so identity is per container: the agent
never holds the verifier's uid and never mounts /logs/verifier. An init
container copies the image's workdir into the shared workspace volume.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from services.sandbox.backends import kubernetes_compose
from services.sandbox.backends.base import Phase, SandboxSpec
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.common.settings import IntegrityPolicy, KubernetesBackendSettings

MANAGED_BY = {"app.kubernetes.io/managed-by": "harnessrl-sandbox"}
TRIAL_LABEL = "harnessrl.io/trial"
RUN_LABEL = "harnessrl.io/run"
AGENT, VERIFIER, HELPER, RELAY, INIT = "agent", "verifier", "helper", "relay", "workspace"
HELPER_ROOT = PurePosixPath("/hrl")
RELAY_UID = 65532
_HELPER_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
# A root verifier's (Harbor's tests/test.sh runs apt-get as root: dpkg chowns, apt drops to _apt).
_ROOT_VERIFIER_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"]
_SIDECAR_RESOURCES = {"limits": {"memory": "256Mi", "cpu": "500m"}, "requests": {"memory": "32Mi", "cpu": "10m"}}
_SLEEP = ["sleep", "infinity"]


def dns_name(trial_id: str) -> str:
    """A valid pod name for a trial id (lower-case, [a-z0-9-], <= 63 chars)."""
    name = re.sub(r"[^a-z0-9-]+", "-", trial_id.lower()).strip("-")
    return f"hrl-{name}"[:63].rstrip("-")


def labels(spec: SandboxSpec, run_id: str = "") -> dict[str, str]:
    out = {**MANAGED_BY, TRIAL_LABEL: dns_name(spec.trial_id)}
    if run_id:
        out[RUN_LABEL] = re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)[:63].strip("-_.")
    return out


def orphan_selector() -> str:
    return ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())


@dataclass(frozen=True)
class Volume:
    """One emptyDir of the trial and who mounts it (``rw``, ``ro`` or None)."""

    name: str
    path: PurePosixPath
    agent: str | None
    verifier: str | None
    owner: str = "root"  # who owns what the worker copies in: agent, verifier or root


def volume_table(paths: SandboxPaths, policy: IntegrityPolicy) -> list[Volume]:
    """What each identity may see: the table the integrity defences rest on
    (the Kubernetes twin of ``LocalBackend._phase_mounts``). The helper mounts
    every volume read-write under /hrl/<name>."""
    hide = policy.hide_tests_and_solution
    return [
        Volume("workspace", paths.workdir, "rw", "rw", "agent"),
        Volume("agent-logs", paths.agent_logs, "rw", "ro", "agent"),
        # Harbor's publish folder. Not the verifier's: a link the agent planted there would carry
        # its writes anywhere, and here no worker-side sweep reaches the pod's volume first.
        Volume("artifacts", paths.published, "rw", None, "agent"),
        Volume("verifier-logs", paths.verifier_logs, None if policy.protect_reward_files else "rw", "rw", "verifier"),
        Volume("tests", paths.tests, None if hide else "ro", "rw"),
        Volume("solution", paths.solution, "ro", None if hide else "ro"),
        Volume("agent-home", paths.home, "rw", None, "agent"),
        Volume("verifier-home", paths.home, None, "rw", "verifier"),
        Volume("runtime", paths.runtime, "ro", None),
    ]


def helper_path(table: list[Volume], dst: PurePosixPath) -> tuple[Volume, PurePosixPath]:
    """The volume holding sandbox path ``dst`` and where ``dst`` is in the helper.
    The first match wins: HOME means the agent's (the worker writes no verifier HOME)."""
    for vol in table:
        if dst.is_relative_to(vol.path):
            return vol, HELPER_ROOT / vol.name / dst.relative_to(vol.path)
    valid = sorted({str(v.path) for v in table})
    raise EnvSetupError(f"the kubernetes backend copies files only under {valid}; {dst} is none of them")


def check_workdir(paths: SandboxPaths) -> None:
    reserved = [paths.logs, paths.tests, paths.solution, paths.runtime, paths.home, HELPER_ROOT]
    for path in reserved:
        if paths.workdir.is_relative_to(path) or path.is_relative_to(paths.workdir):
            raise EnvSetupError(f"workdir {paths.workdir} overlaps {path}, which the sandbox reserves")


@dataclass(frozen=True)
class ProxyTarget:
    """Where the relay dials and what the NetworkPolicy lets through."""

    host: str
    port: int
    target_port: int
    pod_labels: dict[str, str]
    namespace: str

    @property
    def needs_dns(self) -> bool:
        try:
            ipaddress.ip_address(self.host.strip("[]"))
        except ValueError:
            return True
        return False


def proxy_target(cfg: KubernetesBackendSettings, proxy_url: str | None) -> ProxyTarget | None:
    """The proxy as pods reach it: ``proxy_address``, else the host:port of ``proxy_url``."""
    address = cfg.proxy_address
    if address is None and proxy_url:
        netloc = proxy_url.split("://", 1)[-1].split("/", 1)[0]
        default = "443" if proxy_url.startswith("https") else "80"
        address = netloc if netloc.rpartition(":")[2].isdigit() else f"{netloc}:{default}"
    if address is None:
        return None
    host, _, port = address.rpartition(":")
    if host in ("localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0"):
        raise EnvSetupError(
            f"the proxy address {address} is the worker's loopback, which no pod reaches; "
            "set [sandbox.kubernetes] proxy_address to the proxy's Service (host:port)"
        )
    return ProxyTarget(
        host=host,
        port=int(port),
        target_port=cfg.proxy_target_port or int(port),
        pod_labels=dict(cfg.proxy_pod_labels),
        namespace=cfg.proxy_namespace or cfg.namespace,
    )


def verifier_uid(spec: SandboxSpec, cfg: KubernetesBackendSettings) -> int:
    """Harbor's verifier user as a uid: the task's ``[verifier] user`` ('root' or a number),
    else ``verifier_uid`` (the images' USER, root by default). A pod's user is a number:
    a name is refused, naming the field."""
    user = spec.task.config.verifier.user
    if user is None:
        return cfg.verifier_uid
    text = str(user).split(":")[0]
    if text == "root":
        return 0
    if text.isdigit():
        return int(text)
    raise EnvSetupError(
        f"task {spec.task.task_id}: [verifier] user = {user!r}: the kubernetes backend runs a container as a "
        "numeric uid only (securityContext.runAsUser); give the uid"
    )


def _security(uid: int | None, caps: list[str] | None = None, read_only_root: bool = False) -> dict[str, Any]:
    sec: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], **({"add": caps} if caps else {})},
        "seccompProfile": {"type": "RuntimeDefault"},
        "privileged": False,
    }
    if uid is None:
        sec |= {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False}
    else:
        sec |= {"runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": True}
    if read_only_root:
        sec["readOnlyRootFilesystem"] = True
    return sec


def _mounts(table: list[Volume], who: str) -> list[dict[str, Any]]:
    out = []
    for vol in table:
        access = getattr(vol, who)
        if access is not None:
            out.append({"name": vol.name, "mountPath": str(vol.path), "readOnly": access == "ro"})
    return out


def _runtime_mounts(spec: SandboxSpec, cfg: KubernetesBackendSettings) -> list[dict[str, Any]]:
    """The harness installs, read-only; each install path must lie in one runtime volume."""
    for path in spec.ro_mounts:
        if not any(PurePosixPath(path).is_relative_to(v.mount_path) for v in cfg.runtime_volumes):
            have = [v.mount_path for v in cfg.runtime_volumes] or "none"
            raise EnvSetupError(
                f"harness install {path} is in no [sandbox.kubernetes] runtime_volumes entry (mount paths: {have}); "
                "a pod sees harness installs only through a runtime volume"
            )
    mounts = []
    for vol in cfg.runtime_volumes:
        mount = {"name": f"rt-{vol.name}", "mountPath": vol.mount_path, "readOnly": True}
        if vol.sub_path:
            mount["subPath"] = vol.sub_path
        mounts.append(mount)
    return mounts


def _runtime_volume_sources(cfg: KubernetesBackendSettings) -> list[dict[str, Any]]:
    out = []
    for vol in cfg.runtime_volumes:
        ((kind, source),) = vol.source.items()
        if kind in ("persistentVolumeClaim", "csi"):
            source = {**source, "readOnly": True}
        out.append({"name": f"rt-{vol.name}", kind: source})
    return out


def init_script(workdir: PurePosixPath, agent_uid: int) -> str:
    """Copies the image's workdir into the shared workspace, owned by the agent."""
    w, ws = shlex.quote(str(workdir)), HELPER_ROOT / "workspace"
    return (
        f"set -e; if [ ! -d {w} ]; then echo 'workdir {workdir} is not a directory in the image' >&2; exit 1; fi; "
        f"cp -a {w}/. {ws}/; chown -R {agent_uid}:{agent_uid} {ws} {HELPER_ROOT / 'agent-logs'}"
    )


def pod_manifest(
    spec: SandboxSpec,
    cfg: KubernetesBackendSettings,
    policy: IntegrityPolicy,
    *,
    deadline_s: int,
    proxy: ProxyTarget | None,
    proxy_port: int,
    run_id: str = "",
) -> dict[str, Any]:
    env_cfg, limits = spec.task.config.environment, spec.limits
    image = env_cfg.docker_image
    if not image:
        raise EnvSetupError(
            f"task {spec.task.task_id}: the kubernetes backend needs a prebuilt [environment] docker_image"
        )
    paths = SandboxPaths.for_workdir(env_cfg.workdir)
    check_workdir(paths)
    table = volume_table(paths, policy)
    quota = {"memory": f"{limits.memory_mb}Mi", "ephemeral-storage": f"{limits.storage_mb}Mi"}
    if limits.cpus:
        quota["cpu"] = str(limits.cpus)
    # Agent and verifier never run at once: only the agent reserves the trial's quota.
    small = {"memory": "64Mi", "cpu": "10m", "ephemeral-storage": "64Mi"}
    env_vars = kubernetes_compose.main_environment(spec) | env_cfg.env
    env = [{"name": k, "value": v} for k, v in sorted(env_vars.items())]

    def sandbox_container(
        name: str, uid: int, requests: dict[str, str], mounts: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {
            "name": name,
            "image": image,
            "imagePullPolicy": cfg.image_pull_policy,
            "command": _SLEEP,
            "workingDir": str(paths.workdir),
            "env": env,
            "resources": {"limits": quota, "requests": requests},
            "securityContext": _security(uid),
            "volumeMounts": mounts,
        }

    helper_mounts = [{"name": v.name, "mountPath": str(HELPER_ROOT / v.name)} for v in table]
    # The verifier as Harbor runs it: the task's user, root unless the task or the images say
    # otherwise; a root verifier gets the few capabilities apt and dpkg need, nothing more.
    uid = verifier_uid(spec, cfg)
    if uid == cfg.agent_uid:
        raise EnvSetupError(
            f"task {spec.task.task_id}: [verifier] user = {uid} is the agent's uid: the agent must not write the reward"
        )
    verifier = sandbox_container(VERIFIER, uid, small, _mounts(table, "verifier"))
    if uid == 0:
        verifier["securityContext"] = _security(None, _ROOT_VERIFIER_CAPS)
    containers = [
        sandbox_container(AGENT, cfg.agent_uid, quota, _mounts(table, "agent") + _runtime_mounts(spec, cfg)),
        verifier,
        {
            "name": HELPER,
            "image": cfg.helper_image or image,
            "imagePullPolicy": cfg.image_pull_policy,
            "command": _SLEEP,
            "resources": _SIDECAR_RESOURCES,
            "securityContext": _security(None, _HELPER_CAPS),
            "volumeMounts": helper_mounts,
        },
    ]
    if proxy is not None:
        containers.append(
            {
                "name": RELAY,
                "image": cfg.relay_image,
                "imagePullPolicy": cfg.image_pull_policy,
                "command": [
                    "socat",
                    f"TCP-LISTEN:{proxy_port},bind=127.0.0.1,fork,reuseaddr",
                    f"TCP:{proxy.host}:{proxy.port}",
                ],
                "resources": _SIDECAR_RESOURCES,
                "securityContext": _security(RELAY_UID, read_only_root=True),
            }
        )
    # A compose task's services: more containers of the pod, reachable by name (kubernetes_compose).
    containers += kubernetes_compose.sidecars(spec, cfg, image)
    init = {
        "name": INIT,
        "image": image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["sh", "-c", init_script(paths.workdir, cfg.agent_uid)],
        "resources": _SIDECAR_RESOURCES,
        "securityContext": _security(None, _HELPER_CAPS),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [m for m in helper_mounts if m["name"] in ("workspace", "agent-logs")],
    }
    volumes = [{"name": v.name, "emptyDir": {"sizeLimit": f"{limits.storage_mb}Mi"}} for v in table]
    body: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": deadline_s,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "shareProcessNamespace": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "terminationGracePeriodSeconds": 0,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [init],
        "containers": containers,
        "volumes": volumes + _runtime_volume_sources(cfg),
    }
    if spec.task.compose is not None:
        body["hostAliases"] = kubernetes_compose.host_aliases(spec.task.compose)
    if cfg.runtime_class_name:
        body["runtimeClassName"] = cfg.runtime_class_name
    if cfg.node_selector:
        body["nodeSelector"] = dict(cfg.node_selector)
    if cfg.image_pull_secrets:
        body["imagePullSecrets"] = [{"name": name} for name in cfg.image_pull_secrets]
    name = dns_name(spec.trial_id)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": labels(spec, run_id)},
        "spec": body,
    }


def network_policy(
    spec: SandboxSpec,
    phase: Phase,
    *,
    namespace: str,
    proxy: ProxyTarget | None,
    dns: tuple[str, dict[str, str]] = ("kube-system", {"k8s-app": "kube-dns"}),
    isolate: bool = True,
    public: bool = False,
) -> dict[str, Any]:
    """Agent phase: egress to the proxy pods alone (plus the cluster DNS when the
    proxy is a name); verify: nothing, or everything when the verifier is public.
    No ingress ever (exec goes through the kubelet, not the pod network)."""
    egress: list[dict[str, Any]] = []
    if phase != Phase.VERIFY and not isolate:
        egress = [{}]
    elif phase != Phase.VERIFY and proxy is not None:
        egress.append(
            {
                "to": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": proxy.namespace}},
                        "podSelector": {"matchLabels": proxy.pod_labels},
                    }
                ],
                "ports": [{"protocol": "TCP", "port": proxy.target_port}],
            }
        )
        if proxy.needs_dns:
            dns_ns, dns_labels = dns
            egress.append(
                {
                    "to": [
                        {
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": dns_ns}},
                            "podSelector": {"matchLabels": dns_labels},
                        }
                    ],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                }
            )
    elif phase == Phase.VERIFY and public:
        egress = [{}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": dns_name(spec.trial_id), "namespace": namespace, "labels": labels(spec)},
        "spec": {
            "podSelector": {"matchLabels": {TRIAL_LABEL: dns_name(spec.trial_id)}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }
