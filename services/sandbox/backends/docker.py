"""The Docker backend: one container per trial (docker SDK), images built from
``environment/Dockerfile`` once per environment hash (the engine's build cache
does the rest) or pulled from ``[environment] docker_image``.

The container starts on its own internal network (no route out) with the
proxy's Unix socket bound in;
the agent phase runs as uid 1000 with every capability dropped behind the same
in-sandbox forwarder as the local backend; tests are copied in only for
verify, into a /logs/verifier recreated by root. No Docker engine runs on the
development machines: ``container_spec`` is tested, live tests skip.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

from services.sandbox.backends.base import (
    Backend,
    Capabilities,
    ExecRequest,
    ExecResult,
    Network,
    Phase,
    Sandbox,
    SandboxSpec,
    unpack_tar,
)
from services.sandbox.backends.limits import BoundedOutput
from services.sandbox.errors import BackendUnavailable, EnvSetupError
from services.sandbox.paths import SandboxPaths
from services.sandbox.settings import Settings

LABEL_MANAGED = "io.harnessrl.managed"
LABEL_TRIAL = "io.harnessrl.trial"
NET_DIR = "/run/harnessrl-net"
FORWARDER = Path(__file__).with_name("forwarder.py")


def image_tag(spec: SandboxSpec) -> str:
    return spec.task.config.environment.docker_image or f"harnessrl-env:{spec.task.environment_hash()[:24]}"


def network_name(spec: SandboxSpec) -> str:
    return f"harnessrl-{spec.trial_id}"[:63]


def container_spec(spec: SandboxSpec, image: str, workdir: str) -> dict[str, Any]:
    """Keyword arguments of ``client.containers.create`` for one trial."""
    limits = spec.limits
    volumes = {}
    if spec.proxy_socket is not None:
        volumes[str(spec.proxy_socket)] = {"bind": f"{NET_DIR}/proxy.sock", "mode": "rw"}
    volumes[str(FORWARDER)] = {"bind": f"{NET_DIR}/forwarder.py", "mode": "ro"}
    for path in spec.ro_mounts:
        volumes[str(path)] = {"bind": str(path), "mode": "ro"}
    kwargs: dict[str, Any] = {
        "image": image,
        "command": ["sleep", "infinity"],
        "name": f"harnessrl-{spec.trial_id}"[:63],
        "detach": True,
        "working_dir": workdir,
        "labels": {LABEL_MANAGED: "true", LABEL_TRIAL: spec.trial_id},
        # A per-trial internal network: no route out; the verify phase may join "bridge".
        "network": network_name(spec),
        "mem_limit": f"{limits.memory_mb}m",
        "memswap_limit": f"{limits.memory_mb}m",
        "pids_limit": limits.pids,
        "cap_drop": ["ALL"],
        "cap_add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"],
        "security_opt": ["no-new-privileges"],
        "tmpfs": {"/tmp": f"size={limits.storage_mb}m"},
        "storage_opt": {"size": f"{limits.storage_mb}m"},
        "volumes": volumes,
        "init": True,
    }
    if limits.cpus:
        kwargs["nano_cpus"] = int(limits.cpus * 1e9)
    return kwargs


def exec_argv(request: ExecRequest) -> tuple[list[str], str]:
    """The command and user of an exec. Agent and verifier run as uid 1000; the
    agent's command is wrapped by the forwarder when it may reach the proxy."""
    argv = list(request.argv)
    if request.network == Network.PROXY_ONLY and request.proxy_port:
        fwd = [f"{NET_DIR}/forwarder.py", f"127.0.0.1:{request.proxy_port}", f"{NET_DIR}/proxy.sock", "--"]
        argv = ["python3", *fwd, *argv]
    return ["timeout", "-s", "KILL", str(int(request.timeout_s) + 1), *argv], "1000:1000"


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        try:
            import docker

            self.client = docker.from_env(timeout=30)
            self.client.ping()
        except Exception as e:
            raise BackendUnavailable(f"no Docker engine reachable: {e}") from e
        self.capabilities = Capabilities(
            builds_dockerfile=True,
            prebuilt_images=True,
            network_isolation=True,
            kills_process_tree=True,
            hides_verifier_files=True,
            squashes_git_history=True,
            memory_limit=True,
            pids_limit=True,
            disk_limit=True,
            wall_time_limit=True,
            non_root=True,
        )
        super().__init__(settings.integrity)

    async def _image(self, spec: SandboxSpec) -> str:
        tag = image_tag(spec)
        if spec.task.config.environment.docker_image:
            await asyncio.to_thread(self.client.images.pull, tag)
            return tag
        try:
            await asyncio.to_thread(self.client.images.get, tag)
        except Exception:  # noqa: BLE001 - not built yet
            try:
                await asyncio.to_thread(
                    self.client.images.build, path=str(spec.task.environment_dir), tag=tag, rm=True, forcerm=True
                )
            except Exception as e:
                raise EnvSetupError(f"task {spec.task.task_id}: docker build failed: {e}") from e
        return tag

    async def start(self, spec: SandboxSpec) -> Sandbox:
        image = await self._image(spec)
        inspect = await asyncio.to_thread(self.client.api.inspect_image, image)
        workdir = spec.task.config.environment.workdir or inspect["Config"].get("WorkingDir") or "/app"
        env = dict(e.split("=", 1) for e in inspect["Config"].get("Env") or [])
        env |= spec.task.config.environment.env
        labels = {LABEL_MANAGED: "true", LABEL_TRIAL: spec.trial_id}
        await asyncio.to_thread(self.client.networks.create, network_name(spec), internal=True, labels=labels)
        container = await asyncio.to_thread(self.client.containers.create, **container_spec(spec, image, workdir))
        await asyncio.to_thread(container.start)
        sandbox = Sandbox(spec=spec, paths=SandboxPaths.for_workdir(workdir), env=env, handle=container)
        await self._root(sandbox, f"mkdir -p /logs/agent {workdir} && chown -R 1000:1000 /logs/agent {workdir}")
        return sandbox

    async def _root(self, sandbox: Sandbox, script: str) -> None:
        code, out = await asyncio.to_thread(sandbox.handle.exec_run, ["sh", "-c", script], user="0")  # type: ignore[attr-defined]
        if code != 0:
            raise EnvSetupError(f"sandbox {sandbox.spec.trial_id}: {script!r} failed: {out[-500:]!r}")

    async def exec(self, sandbox: Sandbox, request: ExecRequest, cancel: asyncio.Event | None = None) -> ExecResult:
        container = sandbox.handle
        if request.phase == Phase.VERIFY:
            await self._root(
                sandbox, "rm -rf /logs/verifier && mkdir -p /logs/verifier && chown 1000:1000 /logs/verifier"
            )
        argv, user = exec_argv(request)
        started = time.monotonic()
        bridge = self.client.networks.get("bridge") if request.network == Network.PUBLIC else None
        if bridge is not None:
            await asyncio.to_thread(bridge.connect, container)
        try:
            code, raw = await asyncio.to_thread(
                container.exec_run,  # type: ignore[attr-defined]
                argv,
                user=user,
                environment=request.env,
                workdir=request.cwd or str(sandbox.paths.workdir),
            )
        finally:
            if bridge is not None:
                await asyncio.to_thread(bridge.disconnect, container)
        sink = BoundedOutput(sandbox.spec.limits.output_limit_bytes)
        sink.feed(raw or b"")
        if request.phase == Phase.AGENT and self.integrity.kill_agent_processes:
            await asyncio.to_thread(container.exec_run, ["kill", "-9", "-1"], user="1000:1000")  # type: ignore[attr-defined]
        return ExecResult(
            exit_code=code,
            timed_out=code in (124, 137) and time.monotonic() - started >= request.timeout_s,
            output=sink.value(),
            output_bytes=sink.total,
            output_truncated=sink.truncated,
            duration_s=time.monotonic() - started,
        )

    async def upload(self, sandbox: Sandbox, src: Path, dst: PurePosixPath) -> None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(src, arcname=dst.name)
        await self._root(sandbox, f"mkdir -p {dst.parent} && rm -rf {dst}")
        await asyncio.to_thread(sandbox.handle.put_archive, str(dst.parent), buffer.getvalue())  # type: ignore[attr-defined]

    async def download(self, sandbox: Sandbox, src: PurePosixPath, dst: Path) -> None:
        try:
            stream, _ = await asyncio.to_thread(sandbox.handle.get_archive, str(src))  # type: ignore[attr-defined]
        except Exception as e:
            raise FileNotFoundError(f"{src} does not exist in sandbox {sandbox.spec.trial_id}") from e
        data = b"".join(stream)
        await asyncio.to_thread(unpack_tar, data, src, dst)

    async def stop(self, sandbox: Sandbox) -> None:
        try:
            await asyncio.to_thread(sandbox.handle.remove, force=True)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - already gone
            pass
        try:
            network = await asyncio.to_thread(self.client.networks.get, network_name(sandbox.spec))
            await asyncio.to_thread(network.remove)
        except Exception:  # noqa: BLE001 - already gone
            pass

    async def cleanup_orphans(self) -> int:
        """Removes labelled containers that stopped (exited or never started); a
        running one may belong to a live worker on another host."""
        containers = await asyncio.to_thread(
            self.client.containers.list,
            all=True,
            filters={"label": f"{LABEL_MANAGED}=true", "status": ["exited", "created", "dead"]},
        )
        for container in containers:
            await asyncio.to_thread(container.remove, force=True)
        return len(containers)
