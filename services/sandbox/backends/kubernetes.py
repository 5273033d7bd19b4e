"""The Kubernetes backend: one pod per trial (kubernetes client), from a
prebuilt ``[environment] docker_image`` (a cluster builds no Dockerfiles).

The pod, its NetworkPolicies and every shell plan are built in
``kubernetes_manifests.py`` (tested without a cluster); this module does the
I/O: create the per-trial NetworkPolicy first (the pod never runs without it),
then the pod; squash the workspace's git history on the worker and copy it
back; route each exec to the container of its phase's identity; stream its
output with a worker-side deadline and ``cancel``, after which the phase's
processes are killed from inside their container.
"""

from __future__ import annotations

import asyncio
import io
import logging
import shutil
import tarfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any

from services.sandbox.backends import kubernetes_manifests as km
from services.sandbox.backends import kubernetes_plans as plans
from services.sandbox.backends.base import (
    Backend,
    Capabilities,
    ExecRequest,
    ExecResult,
    Network,
    Phase,
    Sandbox,
    SandboxSpec,
)
from services.sandbox.backends.kubernetes_manifests import dns_name, network_policy, orphan_selector, pod_manifest
from services.sandbox.backends.limits import BoundedOutput
from services.sandbox.common.errors import BackendUnavailable, EnvSetupError
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.common.settings import Settings
from services.sandbox.defences import integrity

log = logging.getLogger(__name__)

__all__ = ["KubernetesBackend", "dns_name", "network_policy", "orphan_selector", "pod_manifest"]

_CHUNK = 256 * 1024
_POLL_S = 0.2
# Worker-side grace past a command's own timeout before the stream is cut.
_GRACE_S = 15.0
# Variables the container runtime sets that are no part of the image's ENV.
_RUNTIME_ENV = ("HOSTNAME", "HOME", "KUBERNETES_")
STDIN_FILE = ".stdin"


class KubernetesBackend(Backend):
    name = "kubernetes"
    runs_steps = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cfg = settings.kubernetes
        self.namespace = self.cfg.namespace
        # A proxy on the worker's loopback is a configuration error, caught before any trial.
        self.proxy = km.proxy_target(self.cfg, settings.proxy_url)
        try:
            from kubernetes import client, config

            if self.cfg.kubeconfig or self.cfg.context:
                config.load_kube_config(
                    config_file=str(self.cfg.kubeconfig) if self.cfg.kubeconfig else None, context=self.cfg.context
                )
            else:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()
            self.core = client.CoreV1Api()
            self.net = client.NetworkingV1Api()
            # Exec streams patch their ApiClient while connecting: their own client, one connect at a time.
            self._exec_api = client.CoreV1Api(client.ApiClient())
            self._connect_lock = threading.Lock()
            self.core.get_api_resources()
        except Exception as e:
            raise BackendUnavailable(f"no Kubernetes cluster reachable: {e}") from e
        self.capabilities = Capabilities(
            builds_dockerfile=False,
            prebuilt_images=True,
            network_isolation=True,
            kills_process_tree=True,
            hides_verifier_files=True,
            squashes_git_history=True,
            memory_limit=True,
            pids_limit=False,  # a kubelet setting (podPidsLimit), not a pod's
            disk_limit=True,
            wall_time_limit=True,
            non_root=True,
        )
        super().__init__(settings.integrity)

    # -- lifecycle ---------------------------------------------------------------
    def _deadline(self, spec: SandboxSpec) -> int:
        """The pod's activeDeadlineSeconds: a dead worker's pod ends after every phase's time.
        A multi-step task's steps each count their agent (setup.sh and healthcheck run under
        the same bound) and verifier timeouts."""
        cfg = spec.task.config
        agent = cfg.agent.timeout_sec or self.settings.default_agent_timeout_s
        phases = agent + (cfg.verifier.timeout_sec or self.settings.default_verifier_timeout_s)
        if spec.task.steps:
            phases = sum(
                2 * (s.config.agent.timeout_sec or agent) + s.config.verifier.timeout_sec for s in spec.task.steps
            )
        return int(self.cfg.start_timeout_s + phases + 300)

    def _policy(self, spec: SandboxSpec, phase: Phase, public: bool = False) -> dict[str, Any]:
        return network_policy(
            spec,
            phase,
            namespace=self.namespace,
            proxy=self.proxy if spec.proxy_socket is not None else None,
            dns=(self.cfg.dns_namespace, dict(self.cfg.dns_pod_labels)),
            isolate=self.integrity.isolate_network,
            public=public,
        )

    async def start(self, spec: SandboxSpec) -> Sandbox:
        if spec.proxy_socket is not None and self.proxy is None:
            raise EnvSetupError(
                "the trial needs the proxy but neither proxy_url nor [sandbox.kubernetes] proxy_address is set"
            )
        manifest = pod_manifest(
            spec,
            self.cfg,
            self.integrity,
            deadline_s=self._deadline(spec),
            proxy=self.proxy if spec.proxy_socket is not None else None,
            proxy_port=self.settings.proxy_port_in_sandbox,
        )
        pod = manifest["metadata"]["name"]
        paths = SandboxPaths.for_workdir(spec.task.config.environment.workdir)
        sandbox = Sandbox(spec=spec, paths=paths, env=dict(spec.task.config.environment.env), handle=pod)
        policy = self._policy(spec, Phase.AGENT)
        # The policy exists before the pod, so the pod never has a moment of open egress.
        await asyncio.to_thread(self.net.create_namespaced_network_policy, self.namespace, policy)
        try:
            await asyncio.to_thread(self.core.create_namespaced_pod, self.namespace, manifest)
            await self._wait_ready(pod, self.cfg.start_timeout_s)
            sandbox.env = {**await self._image_env(pod), **spec.task.config.environment.env}
        except BaseException:
            # No Sandbox reaches the runner, so nobody else would delete them.
            await self.stop(sandbox)
            raise
        return sandbox

    async def _wait_ready(self, pod: str, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            status = (await asyncio.to_thread(self.core.read_namespaced_pod, pod, self.namespace)).status
            waiting = _problem(status)
            if status.phase == "Running" and all(c.ready for c in status.container_statuses or []):
                return
            if status.phase in ("Failed", "Succeeded") or waiting is not None or loop.time() > deadline:
                detail = waiting or status.message or status.reason or "not ready in time"
                raise EnvSetupError(f"pod {pod} did not start (phase {status.phase}): {detail}")
            await asyncio.sleep(1)

    async def _image_env(self, pod: str) -> dict[str, str]:
        """The image's ENV as the agent container has it (the worker never pulls the image)."""
        code, out = await self._call(pod, km.AGENT, ["cat", "/proc/1/environ"])
        if code != 0:
            raise EnvSetupError(f"pod {pod}: reading the image's environment failed: {out[-300:]!r}")
        env = dict(item.split("=", 1) for item in out.decode(errors="replace").split("\0") if "=" in item)
        return {k: v for k, v in env.items() if not k.startswith(_RUNTIME_ENV)}

    async def stop(self, sandbox: Sandbox) -> None:
        for delete in (self.core.delete_namespaced_pod, self.net.delete_namespaced_network_policy):
            try:
                await asyncio.to_thread(delete, str(sandbox.handle), self.namespace)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if not self.settings.keep_trial_dirs:
            await asyncio.to_thread(shutil.rmtree, sandbox.spec.dirs.root, True)

    async def cleanup_orphans(self) -> int:
        """Deletes finished pods (a dead worker's pod ends Failed at its activeDeadlineSeconds)."""
        pods = await asyncio.to_thread(self.core.list_namespaced_pod, self.namespace, label_selector=orphan_selector())
        done = [p for p in pods.items if p.status and p.status.phase in ("Failed", "Succeeded")]
        for pod in done:
            for delete in (self.core.delete_namespaced_pod, self.net.delete_namespaced_network_policy):
                try:
                    await asyncio.to_thread(delete, pod.metadata.name, self.namespace)
                except Exception:  # noqa: BLE001 - another worker got there first
                    pass
        return len(done)

    async def next_step(self, sandbox: Sandbox) -> None:
        """Between the steps of a multi-step task: the pod goes on (the agent's container
        keeps its filesystem and HOME, as Harbor's does); the verify phase's volumes and the
        last agent's logs are emptied, the workspace is the agent's again, and the agent's
        NetworkPolicy (the proxy only) replaces the verify phase's before the agent runs."""
        pod, spec = str(sandbox.handle), sandbox.spec
        await asyncio.to_thread(
            self.net.replace_namespaced_network_policy, pod, self.namespace, self._policy(spec, Phase.AGENT)
        )
        await self._helper(pod, plans.next_step_script(self.cfg.agent_uid))

    # -- integrity ---------------------------------------------------------------
    async def snapshot_pristine(self, sandbox: Sandbox) -> None:
        """Downloads the workspace, squashes its git history on the worker (the
        image need not have git) and copies it back: the pod's workspace and the
        pristine snapshot are the same one-commit tree."""
        pristine = sandbox.spec.dirs.root / "pristine"
        await self.download(sandbox, sandbox.paths.workdir, pristine)
        if self.integrity.squash_git_history:
            try:
                squashed = await integrity.squash_all_git(pristine)
            except RuntimeError as e:
                raise EnvSetupError(f"squashing the workspace's git history failed: {e}") from e
            if squashed:
                await self.upload(sandbox, pristine, sandbox.paths.workdir)

    # -- exec --------------------------------------------------------------------
    async def exec(self, sandbox: Sandbox, request: ExecRequest, cancel: asyncio.Event | None = None) -> ExecResult:
        pod, paths, spec = str(sandbox.handle), sandbox.paths, sandbox.spec
        table = km.volume_table(paths, self.integrity)
        container = km.VERIFIER if request.phase == Phase.VERIFY else km.AGENT
        stdin_path = None
        if request.phase == Phase.VERIFY:
            # Harbor's verifier network (verifier_policy: the runner resolved it), egress to all or none.
            policy = self._policy(spec, Phase.VERIFY, public=request.network == Network.PUBLIC)
            await asyncio.to_thread(self.net.replace_namespaced_network_policy, pod, self.namespace, policy)
            uid = km.verifier_uid(spec, self.cfg)
            script = plans.verify_prep_script(table, uid, self.integrity.protect_reward_files)
            await self._helper(pod, script)
        else:
            stdin_path = await self._agent_files(sandbox, request)
        env = {**request.env, "HOME": str(paths.home), "USER": container}
        argv = plans.exec_argv(request, cwd=request.cwd or str(paths.workdir), env=env, stdin_path=stdin_path)
        sink = BoundedOutput(spec.limits.output_limit_bytes)
        started = time.monotonic()
        code, stopped = await self._stream(pod, container, argv, sink, request.timeout_s + _GRACE_S, cancel)
        duration = time.monotonic() - started
        kill = stopped is not None or request.phase != Phase.AGENT or self.integrity.kill_agent_processes
        sweep = await self._sweep(pod, container, kill)
        if request.phase == Phase.AGENT:
            await self._pull_home(sandbox)
        timed_out = stopped == "deadline" or (code in (124, 137) and duration >= request.timeout_s)
        return ExecResult(
            exit_code=code if code is not None else 137,
            timed_out=timed_out,
            output=sink.value(),
            output_bytes=sink.total,
            output_truncated=sink.truncated,
            oom_killed=sweep.get("oom", 0) > 0,
            killed_leftovers=sweep.get("leftovers", 0) if kill else 0,
            duration_s=duration,
        )

    async def _agent_files(self, sandbox: Sandbox, request: ExecRequest) -> str | None:
        """The harness's per-trial HOME and runtime files (written by its adapter
        on the worker) and the command's stdin, copied into their volumes."""
        dirs, paths = sandbox.spec.dirs, sandbox.paths
        runtime, home = dirs.runtime / Phase.AGENT, dirs.home(Phase.AGENT)
        await asyncio.to_thread(_write_stdin_file, runtime, request.stdin)
        await asyncio.to_thread(home.mkdir, parents=True, exist_ok=True)
        await self.upload(sandbox, home, paths.home)
        await self.upload(sandbox, runtime, paths.runtime)
        return None if request.stdin is None else str(paths.runtime / STDIN_FILE)

    async def _pull_home(self, sandbox: Sandbox) -> None:
        """Copies the agent's HOME back, where ``collect_logs`` of the adapter reads it."""
        home = sandbox.spec.dirs.home(Phase.AGENT)
        try:
            await asyncio.to_thread(shutil.rmtree, home, True)
            await self.download(sandbox, sandbox.paths.home, home)
        except (FileNotFoundError, EnvSetupError) as e:
            log.info("agent HOME not copied back", extra={"kv": {"trial": sandbox.spec.trial_id, "error": str(e)}})

    async def _sweep(self, pod: str, container: str, kill: bool) -> dict[str, int]:
        try:
            _, out = await self._call(pod, container, ["sh", "-c", plans.sweep_script(kill)], timeout_s=60)
        except Exception as e:  # noqa: BLE001 - a dead container has no process left
            log.info("sweep failed", extra={"kv": {"pod": pod, "container": container, "error": str(e)}})
            return {}
        return plans.parse_sweep(out.decode(errors="replace"))

    async def _helper(self, pod: str, script: str, stdin: bytes | None = None) -> bytes:
        code, out = await self._call(pod, km.HELPER, ["sh", "-c", script], stdin=stdin, timeout_s=300)
        if code != 0:
            raise EnvSetupError(f"pod {pod}: {script[:200]!r} failed ({code}): {out[-500:].decode(errors='replace')}")
        return out

    async def _call(
        self, pod: str, container: str, argv: list[str], stdin: bytes | None = None, timeout_s: float = 120
    ) -> tuple[int, bytes]:
        """A short exec whose whole output is wanted (downloads, plans)."""
        sink = BoundedOutput(1 << 40)
        code, stopped = await self._stream(pod, container, argv, sink, timeout_s, None, stdin=stdin)
        if stopped is not None:
            raise EnvSetupError(f"pod {pod}: {argv[:3]} in {container} did not finish ({stopped}, limit {timeout_s}s)")
        return (code if code is not None else 137), sink.value()

    async def _stream(
        self,
        pod: str,
        container: str,
        argv: list[str],
        sink: BoundedOutput,
        deadline_s: float,
        cancel: asyncio.Event | None,
        stdin: bytes | None = None,
    ) -> tuple[int | None, str | None]:
        """Runs one exec; returns (exit code, None) or (None, "cancelled"/"deadline")."""
        stop = threading.Event()
        watcher = asyncio.ensure_future(_set_when(cancel, stop)) if cancel is not None else None
        try:
            return await asyncio.to_thread(self._stream_sync, pod, container, argv, sink, deadline_s, stop, stdin)
        finally:
            stop.set()  # also when this coroutine is cancelled: the thread closes its stream
            if watcher is not None:
                watcher.cancel()

    def _stream_sync(
        self,
        pod: str,
        container: str,
        argv: list[str],
        sink: BoundedOutput,
        deadline_s: float,
        stop: threading.Event,
        stdin: bytes | None,
    ) -> tuple[int | None, str | None]:
        from kubernetes.stream import stream

        with self._connect_lock:
            resp = stream(
                self._exec_api.connect_get_namespaced_pod_exec,
                pod,
                self.namespace,
                container=container,
                command=argv,
                stderr=True,
                stdout=True,
                stdin=stdin is not None,
                tty=False,
                binary=True,
                _preload_content=False,
            )
        deadline = time.monotonic() + deadline_s
        try:
            for i in range(0, len(stdin or b""), _CHUNK):
                resp.write_stdin((stdin or b"")[i : i + _CHUNK])
            while resp.is_open():
                if stop.is_set() or time.monotonic() > deadline:
                    return None, "cancelled" if stop.is_set() else "deadline"
                resp.update(timeout=_POLL_S)
                for chunk in (resp.read_stdout(timeout=0), resp.read_stderr(timeout=0)):
                    if chunk:
                        sink.feed(chunk)
            try:
                return resp.returncode, None
            except (TypeError, KeyError, IndexError, ValueError):
                # The stream closed without a status (kubelet or connection lost).
                return None, "lost"
        finally:
            resp.close()

    # -- files -------------------------------------------------------------------
    async def upload(self, sandbox: Sandbox, src: Path, dst: PurePosixPath) -> None:
        """A tar of ``src`` streamed into the helper, which owns the volumes."""
        vol, target = km.helper_path(km.volume_table(sandbox.paths, self.integrity), dst)
        root = target == km.HELPER_ROOT / vol.name
        data = await asyncio.to_thread(_tar, src, dst, root)
        owner = {"agent": self.cfg.agent_uid, "verifier": km.verifier_uid(sandbox.spec, self.cfg)}.get(vol.owner, 0)
        await self._helper(str(sandbox.handle), plans.upload_script(target, root, len(data), owner), stdin=data)

    async def download(self, sandbox: Sandbox, src: PurePosixPath, dst: Path) -> None:
        _, target = km.helper_path(km.volume_table(sandbox.paths, self.integrity), src)
        code, out = await self._call(
            str(sandbox.handle), km.HELPER, ["sh", "-c", plans.download_script(target)], timeout_s=300
        )
        if code != 0 or not out:
            raise FileNotFoundError(f"{src} does not exist in sandbox {sandbox.spec.trial_id}: {out[-300:]!r}")
        try:
            await asyncio.to_thread(plans.unpack_download, out, dst)
        except (tarfile.TarError, OSError) as e:
            raise EnvSetupError(f"copying {src} out of sandbox {sandbox.spec.trial_id} failed: {e}") from e


async def _set_when(cancel: asyncio.Event, stop: threading.Event) -> None:
    await cancel.wait()
    stop.set()


def _tar(src: Path, dst: PurePosixPath, volume_root: bool) -> bytes:
    """A volume's root gets a directory's contents; any other path the entry itself."""
    if volume_root and not src.is_dir():
        raise EnvSetupError(f"{dst} is a directory of the sandbox; {src} is a file")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(src, arcname="." if volume_root else dst.name)
    return buffer.getvalue()


def _write_stdin_file(runtime: Path, stdin: bytes | None) -> None:
    runtime.mkdir(parents=True, exist_ok=True)
    if stdin is not None:
        (runtime / STDIN_FILE).write_bytes(stdin)


def _problem(status: Any) -> str | None:
    """Why a pod will never start (bad image, failed init), or None while it may."""
    fatal = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CrashLoopBackOff")
    for c in (status.init_container_statuses or []) + (status.container_statuses or []):
        state = c.state
        if state is not None and state.waiting is not None and state.waiting.reason in fatal:
            return f"container {c.name}: {state.waiting.reason}: {state.waiting.message or ''}".strip()
        if state is not None and state.terminated is not None and state.terminated.exit_code != 0:
            return f"container {c.name} exited {state.terminated.exit_code}: {state.terminated.message or ''}".strip()
    return None
