"""A compose task's sidecars on the Docker backend (``services.sandbox.task.compose``).

No bridge may be made, and the agent phase keeps ``--network none``, so a trial's
services share one network namespace, as a Kubernetes pod's containers do:

- a *holder* container (the trial's image, ``sleep``, ``--network none``, no
  capability) owns it, with every service name (``main`` too) mapped to 127.0.0.1
  in its hosts file, which the containers that join it share;
- each sidecar joins it (``network_mode: container:<holder>``) in dependency
  order, once what it depends on holds (started, healthy, or exited 0), with its
  own image, command, environment, user and healthcheck;
- the main container (the agent's), and later the verifier's fresh one, join it
  too, after every service is running or healthy, as ``docker compose up --wait``.

So a service is reachable by name from the agent and from the verifier (as in
Harbor, where the services and main share a network), and nothing else is: the
namespace has only ``lo``; the model proxy is the worker's relay on one port of
it. Every container carries the trial's and the worker's labels, so ``stop``
removes them and ``cleanup_orphans`` reaps a dead worker's.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from docker.errors import APIError, BuildError, NotFound
from requests.exceptions import RequestException

from services.sandbox.backends import docker_images
from services.sandbox.backends import docker_service_relay as service_relay
from services.sandbox.backends.base import SandboxSpec
from services.sandbox.backends.docker_exec import worker_identity
from services.sandbox.backends.docker_specs import LABEL_MANAGED, LABEL_TRIAL, LABEL_WORKER
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.task import compose_env, dockerfile
from services.sandbox.task.compose import MAIN, Build, ComposeSpec, Service

LABEL_SERVICE = "io.harnessrl.service"
SERVICE_REPO = "harnessrl-svc"
HOLDER_USER = "65534:65534"
# How long the services may take to be running or healthy (``up --wait`` has no bound of its own).
READY_TIMEOUT_S = 300.0
_POLL_S = 0.25


@dataclass
class ServiceGroup:
    """A trial's holder and sidecars, in start order (removed in reverse)."""

    holder: Any
    hosts: dict[str, str] = field(default_factory=dict)  # every service name -> 127.0.0.1
    sidecars: dict[str, Any] = field(default_factory=dict)
    relays: list[asyncio.Server] = field(default_factory=list)  # a public verifier's (docker_service_relay)

    @property
    def network_mode(self) -> str:
        return f"container:{self.holder.id}"

    def containers(self) -> list[Any]:
        return [*reversed(self.sidecars.values()), self.holder]


def labels(spec: SandboxSpec, service: str) -> dict[str, str]:
    return {
        LABEL_MANAGED: "true",
        LABEL_TRIAL: spec.trial_id,
        LABEL_WORKER: worker_identity(),
        LABEL_SERVICE: service,
    }


def holder_spec(spec: SandboxSpec, compose: ComposeSpec, image: str, *, isolate_network: bool) -> dict[str, Any]:
    """``containers.create`` arguments of the namespace's holder."""
    return {
        "image": image,
        "command": ["sleep", "infinity"],
        "detach": True,
        "user": HOLDER_USER,
        "labels": labels(spec, "_holder"),
        "network_mode": "none" if isolate_network else "host",
        "extra_hosts": dict.fromkeys(compose.names, "127.0.0.1"),
        "mem_limit": "32m",
        "pids_limit": 8,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "init": True,
    }


def sidecar_spec(spec: SandboxSpec, service: Service, image: str, network_mode: str) -> dict[str, Any]:
    """``containers.create`` arguments of one sidecar: its own image and settings, the trial's
    memory and pids limits, no new privileges, in the holder's network namespace."""
    kwargs: dict[str, Any] = {
        "image": image,
        "detach": True,
        "labels": labels(spec, service.name),
        "network_mode": network_mode,
        "environment": dict(service.environment),
        "mem_limit": f"{spec.limits.memory_mb}m",
        "memswap_limit": f"{spec.limits.memory_mb}m",
        "pids_limit": spec.limits.pids,
        "security_opt": ["no-new-privileges"],
    }
    if service.command is not None:
        kwargs["command"] = list(service.command)
    if service.entrypoint is not None:
        kwargs["entrypoint"] = list(service.entrypoint)
    if service.working_dir:
        kwargs["working_dir"] = service.working_dir
    if service.user:
        kwargs["user"] = service.user
    if service.init is not None:
        kwargs["init"] = service.init
    if service.healthcheck is not None:
        check = service.healthcheck
        kwargs["healthcheck"] = {
            "test": list(check.test),
            "interval": max(int(check.interval_s * 1e9), 1_000_000),
            "timeout": max(int(check.timeout_s * 1e9), 1_000_000),
            "retries": check.retries,
            "start_period": int(check.start_period_s * 1e9),
        }
    return kwargs


def _field(service: str, key: str) -> str:
    return f"environment/docker-compose.yaml: services.{service}.{key}"


class ComposeRunner:
    """Starts and removes a trial's services on one engine."""

    def __init__(self, client: Any, *, build_network: str, pull: bool) -> None:
        self.client = client
        self.build_network = build_network
        self.pull = pull
        self._locks: dict[str, asyncio.Lock] = {}

    async def up(self, spec: SandboxSpec, holder_image: str, *, isolate_network: bool) -> ServiceGroup:
        """The holder and every sidecar, running (or healthy where checked); on failure nothing is left."""
        compose = spec.task.compose
        assert compose is not None
        # ${MAIN_IMAGE_NAME} as a sidecar's image: Harbor's name of main's image, so the trial's own.
        images = {
            s.name: holder_image if s.image == compose_env.MAIN_IMAGE else await self.image_for(spec, s)
            for s in compose.services
        }
        holder = await self._call(
            self.client.containers.create, **holder_spec(spec, compose, holder_image, isolate_network=isolate_network)
        )
        group = ServiceGroup(holder, hosts=dict.fromkeys(compose.names, "127.0.0.1"))
        try:
            await self._call(holder.start)
            await self._call(holder.reload)
            deadline = time.monotonic() + READY_TIMEOUT_S
            for service in compose.services:
                await self.wait(group, service.depends_on, service.name, deadline)
                kwargs = sidecar_spec(spec, service, images[service.name], group.network_mode)
                try:
                    container = await self._call(self.client.containers.create, **kwargs)
                except APIError as e:
                    raise EnvSetupError(f"{_field(service.name, 'image')}: the container create failed: {e}") from e
                group.sidecars[service.name] = container
                await self._call(container.start)
            await self.wait(group, compose.main_depends_on, MAIN, deadline)
            # As ``up --wait``: every service running, or healthy where it has a healthcheck.
            await self.wait(group, {name: "ready" for name in group.sidecars}, MAIN, deadline)
        except BaseException:
            await self.down(group)
            raise
        return group

    async def down(self, group: ServiceGroup) -> list[str]:
        """Removes every container of the group; returns what could not be removed."""
        await service_relay.close(group.relays)
        failed = []
        for container in group.containers():
            try:
                await asyncio.to_thread(container.remove, force=True, v=True)
            except NotFound:
                pass
            except (APIError, RequestException) as e:
                failed.append(f"{container.id[:12]}: {e}")
        return failed

    async def relay_into(self, group: ServiceGroup, container: Any) -> None:
        """The services' TCP ports, relayed into ``container``'s own network namespace."""
        await service_relay.close(group.relays)
        holder_pid, pid = int(group.holder.attrs["State"]["Pid"]), int(container.attrs["State"]["Pid"])
        group.relays = await service_relay.relay_services(holder_pid, pid)

    # -- images ------------------------------------------------------------------------
    async def image_for(self, spec: SandboxSpec, service: Service) -> str:
        if service.build is not None:
            build = service.build
            key = hashlib.sha256(f"{build.context}\0{build.dockerfile}\0{sorted(build.args.items())}".encode())
            tag = f"{SERVICE_REPO}:{key.hexdigest()[:24]}"
            # Built every time: the engine's cache makes an unchanged build quick and never stale.
            async with self._locks.setdefault(tag, asyncio.Lock()):
                return await asyncio.wait_for(
                    asyncio.to_thread(self._build, service, tag), spec.task.config.environment.build_timeout_sec
                )
        assert service.image is not None
        try:
            return str((await asyncio.to_thread(self.client.images.get, service.image)).id)
        except NotFound:
            pass
        if not self.pull:
            raise EnvSetupError(f"{_field(service.name, 'image')}: {service.image!r} is not present and pulling is off")
        try:
            return str((await asyncio.to_thread(self.client.images.pull, service.image)).id)
        except APIError as e:
            raise EnvSetupError(
                f"{_field(service.name, 'image')}: {service.image!r} is not present and could not be pulled: "
                f"{e.explanation or e}"
            ) from e

    def _build(self, service: Service, tag: str) -> str:
        build = service.build
        assert build is not None
        try:
            image, _ = docker_images.engine_build(
                self.client,
                path=str(build.context),
                dockerfile=build.dockerfile,
                buildargs=dict(build.args),
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode=self.build_network,
            )
        except BuildError as e:
            tail = docker_images.build_log_tail(e.build_log, 1000)
            hint = self._missing_bases(build)
            raise EnvSetupError(f"{_field(service.name, 'build')}: docker build failed: {e.msg}{hint}\n{tail}") from e
        except APIError as e:
            raise EnvSetupError(f"{_field(service.name, 'build')}: docker build failed: {e.explanation or e}") from e
        except dockerfile.DockerfileError as e:
            raise EnvSetupError(f"{_field(service.name, 'build')}: {build.dockerfile}: {e}") from e
        return str(image.id)

    def _missing_bases(self, build: Build) -> str:
        """As the main build says it: the base images the engine lacks (``missing_bases_hint``)."""
        try:
            text = (build.context / build.dockerfile).read_text()
        except OSError:
            return ""
        return docker_images.missing_bases_hint(self.client, docker_images.base_images_of(text, dict(build.args)) or [])

    # -- readiness -----------------------------------------------------------------------
    async def wait(self, group: ServiceGroup, conditions: dict[str, str], owner: str, deadline: float) -> None:
        """Until each named service meets its condition (``ready``: running, or healthy when
        it has a healthcheck; or exited 0); EnvSetupError naming the service when it cannot."""
        for name, condition in conditions.items():
            container = group.sidecars[name]
            while True:
                await self._call(container.reload)
                state = container.attrs.get("State") or {}
                health = (state.get("Health") or {}).get("Status")
                status, code = state.get("Status"), state.get("ExitCode")
                if self._met(condition, status, code, health, name, owner):
                    break
                if status in ("exited", "dead"):
                    logs = (await self._call(container.logs, tail=20)).decode(errors="replace")
                    raise EnvSetupError(
                        f"{_field(name, 'command')}: the service exited with code {code} before it was "
                        f"{condition.removeprefix('service_')} (needed by {owner}); its last output: {logs[-800:]}"
                    )
                if health == "unhealthy":
                    log = ((state.get("Health") or {}).get("Log") or [{}])[-1].get("Output", "")
                    raise EnvSetupError(
                        f"{_field(name, 'healthcheck')}: the service is unhealthy (needed by {owner}): {log[-500:]}"
                    )
                if time.monotonic() > deadline:
                    raise EnvSetupError(
                        f"{_field(name, 'healthcheck')}: not {condition.removeprefix('service_')} after "
                        f"{READY_TIMEOUT_S:.0f} s (needed by {owner}; state {status}, health {health})"
                    )
                await asyncio.sleep(_POLL_S)

    @staticmethod
    def _met(condition: str, status: str | None, code: Any, health: str | None, name: str, owner: str) -> bool:
        exited_ok = status == "exited" and code == 0
        if condition == "service_completed_successfully":
            return exited_ok
        if condition == "service_started":
            return status == "running" or exited_ok
        if condition == "service_healthy" and health is None:
            raise EnvSetupError(
                f"{_field(owner, 'depends_on')}.{name}: condition service_healthy, but {name!r} has no healthcheck"
            )
        if health is None:  # "ready" without a healthcheck
            return status == "running" or exited_ok
        return health == "healthy" or (condition == "ready" and exited_ok)

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)
