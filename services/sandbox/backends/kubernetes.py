"""The Kubernetes backend: one pod per trial (kubernetes client), from a
prebuilt ``[environment] docker_image`` (a cluster builds no Dockerfiles).

Each pod carries labels for orphan cleanup, resource limits, an
``activeDeadlineSeconds`` covering every phase, no service-account token, a
non-root security context; a per-trial NetworkPolicy lets the agent phase
reach the proxy pods and nothing else, and is replaced by the verifier's
policy for verify. No cluster runs on the development machines: the manifest
builders are tested, live tests skip.
"""

from __future__ import annotations

import asyncio
import base64
import io
import re
import shlex
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from services.sandbox.backends.base import (
    Backend,
    Capabilities,
    ExecRequest,
    ExecResult,
    Phase,
    Sandbox,
    SandboxSpec,
    unpack_tar,
)
from services.sandbox.errors import BackendUnavailable, EnvSetupError
from services.sandbox.paths import SandboxPaths
from services.sandbox.settings import Settings

MANAGED_BY = {"app.kubernetes.io/managed-by": "harnessrl-sandbox"}
TRIAL_LABEL = "harnessrl.io/trial"
RUN_LABEL = "harnessrl.io/run"
PROXY_SELECTOR = {"app.kubernetes.io/name": "harnessrl-proxy"}
_CHUNK = 64 * 1024


def dns_name(trial_id: str) -> str:
    """A valid pod name for a trial id (lower-case, [a-z0-9-], <= 63 chars)."""
    name = re.sub(r"[^a-z0-9-]+", "-", trial_id.lower()).strip("-")
    return f"hrl-{name}"[:63].rstrip("-")


def labels(spec: SandboxSpec, run_id: str = "") -> dict[str, str]:
    out = {**MANAGED_BY, TRIAL_LABEL: dns_name(spec.trial_id)}
    if run_id:
        out[RUN_LABEL] = re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)[:63]
    return out


def pod_manifest(spec: SandboxSpec, *, deadline_s: int, namespace: str, run_id: str = "") -> dict[str, Any]:
    task, limits = spec.task, spec.limits
    if not task.config.environment.docker_image:
        raise EnvSetupError(f"task {task.task_id}: the kubernetes backend needs a prebuilt [environment] docker_image")
    resources = {"memory": f"{limits.memory_mb}Mi", "ephemeral-storage": f"{limits.storage_mb}Mi"}
    if limits.cpus:
        resources["cpu"] = str(limits.cpus)
    env = [{"name": k, "value": v} for k, v in sorted(task.config.environment.env.items())]
    container: dict[str, Any] = {
        "name": "sandbox",
        "image": task.config.environment.docker_image,
        "command": ["sleep", "infinity"],
        "workingDir": task.config.environment.workdir or "/app",
        "env": env,
        "resources": {"limits": resources, "requests": resources},
        "securityContext": {
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": dns_name(spec.trial_id), "namespace": namespace, "labels": labels(spec, run_id)},
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": deadline_s,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"fsGroup": 1000},
            "containers": [container],
        },
    }


def network_policy(
    spec: SandboxSpec, phase: Phase, *, namespace: str, proxy_port: int, public: bool = False
) -> dict[str, Any]:
    """Agent phase: egress only to the proxy pods (and DNS); verify: none, or all when public."""
    egress: list[dict[str, Any]]
    if phase == Phase.AGENT:
        egress = [
            {
                "to": [{"podSelector": {"matchLabels": PROXY_SELECTOR}}],
                "ports": [{"protocol": "TCP", "port": proxy_port}],
            },
            {"to": [{"namespaceSelector": {}}], "ports": [{"protocol": "UDP", "port": 53}]},
        ]
    else:
        egress = [{}] if public else []
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


def orphan_selector() -> str:
    return ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())


class KubernetesBackend(Backend):
    name = "kubernetes"
    namespace = "harnessrl"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        try:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self.core = client.CoreV1Api()
            self.net = client.NetworkingV1Api()
            self.core.get_api_resources()
        except Exception as e:
            raise BackendUnavailable(f"no Kubernetes cluster reachable: {e}") from e
        self.capabilities = Capabilities(
            builds_dockerfile=False,
            prebuilt_images=True,
            network_isolation=True,
            kills_process_tree=True,
            hides_verifier_files=True,
            squashes_git_history=False,
            memory_limit=True,
            pids_limit=False,
            disk_limit=True,
            wall_time_limit=True,
            non_root=True,
        )
        super().__init__(settings.integrity)

    def _deadline(self, spec: SandboxSpec) -> int:
        cfg = spec.task.config
        agent = cfg.agent.timeout_sec or self.settings.default_agent_timeout_s
        return int(cfg.environment.build_timeout_sec + agent + cfg.verifier.timeout_sec + 120)

    async def start(self, spec: SandboxSpec) -> Sandbox:
        manifest = pod_manifest(spec, deadline_s=self._deadline(spec), namespace=self.namespace)
        policy = network_policy(
            spec, Phase.AGENT, namespace=self.namespace, proxy_port=self.settings.proxy_port_in_sandbox
        )
        await asyncio.to_thread(self.net.create_namespaced_network_policy, self.namespace, policy)
        await asyncio.to_thread(self.core.create_namespaced_pod, self.namespace, manifest)
        await self._wait_running(manifest["metadata"]["name"], spec.task.config.environment.build_timeout_sec)
        workdir = spec.task.config.environment.workdir or "/app"
        return Sandbox(
            spec=spec,
            paths=SandboxPaths.for_workdir(workdir),
            env=dict(spec.task.config.environment.env),
            handle=manifest["metadata"]["name"],
        )

    async def _wait_running(self, pod: str, timeout_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            status = (await asyncio.to_thread(self.core.read_namespaced_pod, pod, self.namespace)).status
            if status.phase == "Running":
                return
            if status.phase in ("Failed", "Succeeded") or asyncio.get_running_loop().time() > deadline:
                raise EnvSetupError(f"pod {pod} did not start: phase {status.phase}, {status.message or ''}")
            await asyncio.sleep(1)

    def _run(self, pod: str, argv: list[str], timeout_s: float) -> tuple[int, str]:
        """One exec in the pod: (exit code, stdout+stderr text)."""
        from kubernetes.stream import stream

        resp = stream(
            self.core.connect_get_namespaced_pod_exec,
            pod,
            self.namespace,
            command=argv,
            stderr=True,
            stdout=True,
            stdin=False,
            tty=False,
            _preload_content=False,
        )
        resp.run_forever(timeout=timeout_s)
        out = resp.read_stdout() + resp.read_stderr()
        code = resp.returncode
        resp.close()
        return (code if code is not None else 124), out

    async def exec(self, sandbox: Sandbox, request: ExecRequest, cancel: asyncio.Event | None = None) -> ExecResult:
        pod = str(sandbox.handle)
        if request.phase == Phase.VERIFY:
            public = sandbox.spec.task.config.verifier.network_mode == "public"
            policy = network_policy(sandbox.spec, Phase.VERIFY, namespace=self.namespace, proxy_port=0, public=public)
            await asyncio.to_thread(self.net.replace_namespaced_network_policy, pod, self.namespace, policy)
        env = [f"{k}={v}" for k, v in request.env.items()]
        argv = ["timeout", "-s", "KILL", str(int(request.timeout_s)), "env", *env, *request.argv]
        code, out = await asyncio.to_thread(self._run, pod, argv, request.timeout_s + 30)
        if request.phase == Phase.AGENT and self.integrity.kill_agent_processes:
            await asyncio.to_thread(self._run, pod, ["kill", "-9", "-1"], 30)
        data = out.encode()
        limit = sandbox.spec.limits.output_limit_bytes
        return ExecResult(
            exit_code=code,
            timed_out=code in (124, 137),
            output=data[-limit:],
            output_bytes=len(data),
            output_truncated=len(data) > limit,
        )

    async def upload(self, sandbox: Sandbox, src: Path, dst: PurePosixPath) -> None:
        """tar, base64, appended in argv-sized chunks, then unpacked in the pod."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(src, arcname=dst.name)
        payload = base64.b64encode(buffer.getvalue()).decode()
        pod, tmp = str(sandbox.handle), f"/tmp/.hrl-upload-{dst.name}.b64"
        await asyncio.to_thread(self._run, pod, ["rm", "-f", tmp], 30)
        for i in range(0, len(payload), _CHUNK):
            script = f"printf %s {shlex.quote(payload[i : i + _CHUNK])} >> {tmp}"
            await asyncio.to_thread(self._run, pod, ["sh", "-c", script], 60)
        unpack = f"mkdir -p {dst.parent} && rm -rf {dst} && base64 -d {tmp} | tar xzf - -C {dst.parent} && rm -f {tmp}"
        code, out = await asyncio.to_thread(self._run, pod, ["sh", "-c", unpack], 120)
        if code != 0:
            raise EnvSetupError(f"upload to {dst} failed: {out[-500:]}")

    async def download(self, sandbox: Sandbox, src: PurePosixPath, dst: Path) -> None:
        script = f"tar czf - -C {src.parent} {src.name} | base64 -w0"
        code, out = await asyncio.to_thread(self._run, str(sandbox.handle), ["sh", "-c", script], 120)
        if code != 0:
            raise FileNotFoundError(f"{src} does not exist in sandbox {sandbox.spec.trial_id}: {out[-300:]}")
        await asyncio.to_thread(unpack_tar, base64.b64decode(out), src, dst)

    async def stop(self, sandbox: Sandbox) -> None:
        for delete in (self.core.delete_namespaced_pod, self.net.delete_namespaced_network_policy):
            try:
                await asyncio.to_thread(delete, str(sandbox.handle), self.namespace)
            except Exception:  # noqa: BLE001 - already gone
                pass

    async def cleanup_orphans(self) -> int:
        """Deletes finished pods (a dead worker's pod ends Failed at its activeDeadlineSeconds)."""
        pods = await asyncio.to_thread(self.core.list_namespaced_pod, self.namespace, label_selector=orphan_selector())
        done = [p for p in pods.items if p.status and p.status.phase in ("Failed", "Succeeded")]
        for pod in done:
            await asyncio.to_thread(self.core.delete_namespaced_pod, pod.metadata.name, self.namespace)
            await asyncio.to_thread(self.net.delete_namespaced_network_policy, pod.metadata.name, self.namespace)
        return len(done)
