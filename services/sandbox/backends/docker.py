"""The Docker backend: one container per trial on a Docker engine (docker SDK),
from the task's own image (``docker_images.ImageStore``: built from
``environment/Dockerfile``, or ``[environment] docker_image``; squashed once
per image and workdir).

Isolation and integrity, phase by phase:
- The container runs with ``--network none``: only ``lo``. The agent reaches
  the proxy through ``netns.NetnsRelay``, a worker-side listener made inside
  the container's network namespace on the loopback port the harness is told;
  it needs nothing in the image and closes when the agent phase ends.
- The agent runs as uid 1000 with every capability dropped and
  ``no-new-privileges``; the harness's runtime (its install paths) is mounted
  read-only at the same path, its HOME and runtime dirs from the worker.
- The verifier runs as Harbor runs it (the task's user, the image's USER by
  default; the task's network) in a fresh container made from a commit of the
  agent's, after every uid-1000 process is killed (``prepare_verify``: why, there).
- Tests are copied in only for verify, into a ``/logs/verifier`` recreated by
  root; ``/logs`` is root's, so the agent can create nothing there. The verifier
  gets a fresh ``/tmp`` and HOME; the agent's plants on its routes are removed.
- Limits: memory (+swap), pids, CPUs; disk by ``--storage-opt size`` where the
  storage driver has quotas, else by a watchdog over the container's writable
  layer and its HOME (overlay2 on ext4 has none: the create would be refused).
- Cancellation and timeouts kill the exec's processes mid-run.
- Containers carry their worker's identity; a dead worker's are reaped.
- With ``warm_pool`` on, a trial's container is one started before it asked (for it alone,
  with everything above) and its containers are removed behind it (``docker_pool``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from docker.errors import APIError, NotFound
from requests.exceptions import RequestException

from services.sandbox.backends import docker_files as files
from services.sandbox.backends import docker_images as images
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
from services.sandbox.backends.docker_compose import ComposeRunner, ServiceGroup
from services.sandbox.backends.docker_exec import ContainerExec, worker_identity, worker_is_dead
from services.sandbox.backends.docker_pool import SLOT_PREFIX, PoolKey, Warm, WarmPool, unlink_slot
from services.sandbox.backends.docker_specs import (
    LABEL_MANAGED,
    LABEL_TRIAL,
    LABEL_VERIFY,
    LABEL_WORKER,
    SANDBOX_USER,
    VERIFY_HOME,
    container_name,
    container_spec,
    setup_script,
    verify_container_spec,
    verify_script,
)
from services.sandbox.backends.docker_steps import next_agent_container
from services.sandbox.backends.limits import watch_disk
from services.sandbox.common.errors import BackendUnavailable, EnvSetupError, SandboxLost
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.common.settings import Settings
from services.sandbox.defences import module_shadow, path_guard
from services.sandbox.task import verifier_policy

log = logging.getLogger(__name__)


class DockerBackend(Backend):
    name = "docker"
    runs_steps = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cfg = settings.docker
        try:
            import docker

            kwargs: dict[str, Any] = {"timeout": int(self.cfg.api_timeout_s)}
            self.client = (
                docker.DockerClient(base_url=self.cfg.host, **kwargs) if self.cfg.host else docker.from_env(**kwargs)
            )
            info = self.client.info()
        except Exception as e:
            raise BackendUnavailable(f"no Docker engine reachable: {e}") from e
        self.verify_network = self._verify_network()
        status = dict(info.get("DriverStatus") or [])
        # Quotas need overlay2 over xfs with pquota (we cannot see the mount option: try, then fall back).
        self.disk_quota = info.get("Driver") == "overlay2" and status.get("Backing Filesystem") == "xfs"
        # Without quotas, the watchdog measures the writable layer: needs the data root on this host.
        self.watch_layers = Path(info.get("DockerRootDir") or "/nonexistent").is_dir()
        self.cgroup_root = self.cfg.cgroup_root
        self.images = images.ImageStore(
            self.client,
            build_network=self.cfg.build_network,
            pull=self.cfg.pull,
            cache_dir=settings.cache_dir,
            engine=self.cfg.host or os.environ.get("DOCKER_HOST") or "at the default socket",
        )
        self.compose = ComposeRunner(self.client, build_network=self.cfg.build_network, pull=self.cfg.pull)
        self.capabilities = Capabilities(
            builds_dockerfile=True,
            prebuilt_images=True,
            network_isolation=True,
            kills_process_tree=True,
            hides_verifier_files=True,
            squashes_git_history=True,
            # The engine enforces these itself (runc on v1 or v2); its info says which it can.
            memory_limit=info.get("MemoryLimit") is not False,
            pids_limit=info.get("PidsLimit") is not False,
            cpu_limit=info.get("CpuCfsQuota") is not False,
            limits_detail=f"engine on cgroup v{info.get('CgroupVersion') or '1'}, {info.get('CgroupDriver')} driver",
            disk_limit=self.disk_quota or self.watch_layers,
            wall_time_limit=True,
            non_root=True,
        )
        super().__init__(settings.integrity, self.cfg.limits_unenforced_ok)
        self.pool: WarmPool | None = None
        if self.cfg.warm_pool:
            work_dir, keys = settings.work_dir, self.cfg.warm_pool_tasks
            self.pool = WarmPool(work_dir, self.cfg.warm_pool, keys, self._warm_launch, self._remove)

    async def _warm_launch(self, spec: SandboxSpec, key: PoolKey) -> Any:
        return await self._launch(spec, key.image, key.workdir, key.setup)

    # -- lifecycle ---------------------------------------------------------------
    def _verify_network(self) -> str:
        """The network a public verifier gets, checked now rather than at a first trial's verify.
        Never the host's unless asked: the verifier runs the agent's code."""
        wanted = self.cfg.verify_network
        name = "bridge" if wanted == "auto" else wanted
        try:
            self.client.networks.get(name)
        except NotFound as e:
            if wanted == "auto":
                self.public_verify_network_missing = (
                    "[sandbox.docker] verify_network = 'auto' found no 'bridge' network on the engine: name one it "
                    "has (or 'host'), or 'none' to verify such tasks with no network"
                )
                log.warning("public verifiers refused: %s", self.public_verify_network_missing)
                return "none"
            raise BackendUnavailable(
                f"[sandbox.docker] verify_network = {wanted!r}: the engine has no such network "
                "(docker network ls; host is always there)"
            ) from e
        return name

    async def start(self, spec: SandboxSpec) -> Sandbox:
        prepared = await self.images.image_for(spec.task, squash=self.integrity.squash_git_history)
        image = prepared.image
        inspect = await self._api(self.client.api.inspect_image, image)
        workdir = images.workdir_of(inspect, spec.task)
        compose = spec.task.compose
        env = (
            images.image_env(inspect) | (compose.main_environment if compose else {}) | spec.task.config.environment.env
        )
        policy = self.integrity.protect_reward_files
        setup = setup_script(spec.ro_mounts, prepared.closed_dirs, protect_reward_files=policy)
        # A compose task's services first, in the namespace the main container then joins (never pooled).
        up = compose is not None and bool(compose.services)
        warm = None if up else await self._warm(spec, image, workdir, setup)
        container, group = (warm.container if warm else None), None
        if container is None:
            group = await self.compose.up(spec, image, isolate_network=self.integrity.isolate_network) if up else None
            try:
                container = await self._launch(spec, image, workdir, setup, group)
            except BaseException:
                if group is not None:
                    await self.compose.down(group)
                raise
        handle = ContainerExec(self.client, container, cgroup_root=self.cgroup_root, services=group)
        handle.slot = warm.dirs.root if warm else None
        handle.image = image
        handle.image_user = str((inspect.get("Config") or {}).get("User") or "")
        return Sandbox(spec=spec, paths=SandboxPaths.for_workdir(workdir), env=env, handle=handle)

    async def _warm(self, spec: SandboxSpec, image: str, workdir: str, setup: str) -> Warm | None:
        """A warm container of the pool for this trial (``docker_pool``), or None."""
        if self.pool is None:
            return None
        try:
            key = PoolKey.of(spec, image, workdir, disk_quota=self.disk_quota, setup=setup)
        except OSError:
            return None  # a read-only mount that is not there: the usual start says so

        async def rename(container: Any) -> None:
            await self._api(container.rename, container_name(spec))

        return await self.pool.take(key, spec, rename)

    async def _launch(self, spec: SandboxSpec, image: str, workdir: str, setup: str, group: Any = None) -> Any:
        """Creates and starts a trial's container (or a warm one's, for a pool slot's spec) with
        root's ``setup`` run; removed again if any of it fails."""
        dirs = spec.dirs.create()  # the logs folders too
        for host_dir in (dirs.home(Phase.AGENT), dirs.runtime / Phase.AGENT):
            host_dir.mkdir(parents=True, exist_ok=True)
        for owned in (dirs.agent_logs, dirs.published):
            await asyncio.to_thread(_chown_tree, owned, 1000)
        container = await self._create(spec, image, workdir, group)
        try:
            await self._api(container.start)
            await self._api(container.reload)
            if setup:
                await ContainerExec(self.client, container, cgroup_root=self.cgroup_root).root(setup)
        except BaseException:
            with contextlib.suppress(APIError, RequestException, SandboxLost):
                await self._remove(container)
            raise
        return container

    async def _remove(self, container: Any) -> None:
        with contextlib.suppress(NotFound):
            await self._api(container.remove, force=True, v=True)

    async def close(self) -> None:
        """Drains the warm pool (its containers removed); trials' sandboxes are their stop's."""
        if self.pool is not None:
            await self.pool.drain()

    async def _create(self, spec: SandboxSpec, image: str, workdir: str, group: ServiceGroup | None) -> Any:
        isolate, network_mode = self.integrity.isolate_network, group.network_mode if group else None
        kwargs = container_spec(
            spec, image, workdir, isolate_network=isolate, disk_quota=self.disk_quota, network_mode=network_mode
        )
        try:
            return await asyncio.to_thread(self.client.containers.create, **kwargs)
        except Exception as e:
            if self.disk_quota and "storage-opt" in str(e).lower():
                # No pquota on this xfs: the watchdog instead, for this and every later trial.
                self.disk_quota = False
                kwargs.pop("storage_opt")
                return await self._api(self.client.containers.create, **kwargs)
            raise EnvSetupError(f"sandbox {spec.trial_id}: container create failed: {e}") from e

    # -- verify in a fresh container ------------------------------------------------
    async def prepare_verify(self, sandbox: Sandbox, user: str, network: Network) -> list[str]:
        """The verifier runs as Harbor runs it: as the task's user (the image's USER, root for
        most images) with the task's network, in a container made from a commit of the agent's
        final filesystem. Harbor verifies in the agent's own container, so everything the
        agent changed, in the workspace or outside it, is what the verifier sees; a fresh
        container from that commit keeps exactly that (the commit holds files, not processes:
        no agent process, setsid daemon or cron job can live on into a root verifier) and
        is the only way to give the verify phase a network the agent's container never had
        (an engine cannot add one to a ``--network none`` container without a bridge).
        Then root cleans the agent's plants on root's implicit routes (``verifier_policy``).
        With ``kill_agent_processes`` off (red-team only) it verifies in the agent's
        container, with its (no) network."""
        handle, policy = _handle(sandbox), self.integrity
        # What the agent changed outside its mounts, read before its container goes.
        guarded = policy.guard_verifier_path or policy.guard_runner_routes
        diff = (await self._api(handle.container.diff) or []) if guarded else []
        handle.agent_diff = diff  # the verifier's lookup paths, once known (``restore_protected``)
        if policy.kill_agent_processes:
            await self._fresh_container(sandbox, network)
        owner = _exec_user(user, handle.image_user)
        await handle.root(
            verify_script(
                owner=owner,
                protect_reward_files=policy.protect_reward_files,
                clear_agent_leftovers=policy.kill_agent_processes,
            )
        )
        if not policy.guard_verifier_path:
            return []
        path = verifier_policy.verifier_path(sandbox.env, sandbox.spec.task)
        changes = path_guard.route_changes(diff, path, sandbox.paths.workdir)
        return await self._clear(sandbox, changes, path_guard.ROOT_ROUTE)

    async def _clear(self, sandbox: Sandbox, changes: path_guard.RouteChanges, route: str) -> list[str]:
        """Removes the agent's added files of ``changes`` and restores its changed ones from
        the image, in the verifier's container, as root; tamper events ``route:PATH``."""
        script = path_guard.clear_script(changes.added, changes.changed, 1000)
        lines = (await _handle(sandbox).root(script)).decode(errors="replace").splitlines()
        removed = [line[1:] for line in lines if line.startswith("-")]
        changed = [line[1:] for line in lines if line.startswith("~")]
        if changed:
            await self._restore_from_image(sandbox, changed)
        events = [f"{route}:{p} (added)" for p in removed]
        return events + [f"{route}:{p} (changed)" for p in changed]

    async def _restore_from_image(self, sandbox: Sandbox, paths: list[str]) -> None:
        """Copies ``paths`` as the prepared image has them into the verifier's container."""
        handle, spec = _handle(sandbox), sandbox.spec
        labels = {LABEL_MANAGED: "true", LABEL_TRIAL: spec.trial_id, LABEL_WORKER: worker_identity()}
        source = await self._api(
            self.client.containers.create, handle.image, command=["true"], network_mode="none", labels=labels
        )
        try:
            for path in paths:
                stream, _ = await self._api(source.get_archive, path)
                data = await asyncio.to_thread(b"".join, stream)
                await self._api(handle.container.put_archive, str(PurePosixPath(path).parent), data)
        finally:
            await self._api(source.remove, force=True, v=True)

    async def _fresh_container(self, sandbox: Sandbox, network: Network) -> None:
        handle, spec = _handle(sandbox), sandbox.spec
        labels = {
            LABEL_MANAGED: "true",
            LABEL_TRIAL: spec.trial_id,
            LABEL_WORKER: worker_identity(),
            LABEL_VERIFY: "true",
        }
        image = await self._api(handle.container.commit, conf={"Labels": labels})
        handle.verify_image = image.id
        await self._api(handle.container.remove, force=True, v=True)
        network_mode = self.verify_network if network == Network.PUBLIC else "none"
        group = handle.services
        if group is not None and network_mode == "none":
            network_mode = group.network_mode  # the services' namespace: reachable by name, as Harbor
        kwargs = verify_container_spec(
            spec, image.id, str(sandbox.paths.workdir), network_mode=network_mode, disk_quota=self.disk_quota
        )
        relay = group is not None and network_mode != group.network_mode
        if relay:  # a public verifier: its network, and the services by name through the worker's relays
            kwargs["extra_hosts"] = group.hosts
        if not self.disk_quota:
            kwargs.pop("storage_opt", None)
        try:
            container = await asyncio.to_thread(self.client.containers.create, **kwargs)
        except (APIError, RequestException) as e:
            raise EnvSetupError(f"sandbox {spec.trial_id}: the verifier's container create failed: {e}") from e
        handle.container, handle.events = container, None
        await self._api(container.start)
        await self._api(container.reload)
        if relay and group is not None:
            await self.compose.relay_into(group, container)

    async def next_step(self, sandbox: Sandbox) -> None:
        """A new agent container from the last verifier's filesystem (``docker_steps``)."""
        await next_agent_container(self, sandbox)

    async def stop(self, sandbox: Sandbox) -> None:
        handle = _handle(sandbox)
        if handle.stopped:
            return
        handle.stopped = True
        await handle.close_relay()
        if self.pool is not None:  # off the trial's path, as its container came (``docker_pool``)
            await self.pool.behind(functools.partial(self._release, sandbox))
        else:
            await self._release(sandbox)

    async def _release(self, sandbox: Sandbox) -> None:
        handle = _handle(sandbox)
        # v: a container's anonymous volumes go with it (an image's VOLUME; a verifier's
        # commit records the agent container's mount points as volumes of its own).
        removals = [(functools.partial(handle.container.remove, v=True), "container")]
        for commit in [handle.verify_image, *reversed(handle.step_images)]:  # a child before its parent
            if commit:
                removals.append((functools.partial(self.client.images.remove, commit), "verifier's commit"))
        for remove, what in removals:
            try:
                await asyncio.to_thread(remove, force=True)
            except (APIError, RequestException) as e:
                # Gone already (404), or the engine is down: stopping must not replace the trial's
                # outcome; what a down engine keeps is reaped by cleanup_orphans. Anything else
                # is a bug and raises.
                if not isinstance(e, NotFound):
                    kv = {"trial": sandbox.spec.trial_id, "error": str(e)}
                    log.warning(f"{what} not removed", extra={"kv": kv})
        if handle.services is not None:
            for failed in await self.compose.down(handle.services):
                log.warning(
                    "compose service not removed", extra={"kv": {"trial": sandbox.spec.trial_id, "error": failed}}
                )
        if not self.settings.keep_trial_dirs:
            await asyncio.to_thread(shutil.rmtree, sandbox.spec.dirs.root, True)
        if handle.slot is not None:
            await asyncio.to_thread(unlink_slot, handle.slot)

    async def cleanup_orphans(self) -> int:
        """Removes managed containers that stopped, and running ones whose worker
        (on this host) is dead; a live worker's, or another host's, are left."""
        containers = await self._api(self.client.containers.list, all=True, filters={"label": f"{LABEL_MANAGED}=true"})
        removed = 0
        for container in containers:
            stopped = container.status in ("exited", "created", "dead")
            if stopped or worker_is_dead(container.labels.get(LABEL_WORKER, "")):
                await asyncio.to_thread(container.remove, force=True, v=True)
                removed += 1
                slot = container.labels.get(LABEL_TRIAL, "")
                if slot.startswith(SLOT_PREFIX):  # a warm container's slot (its trial label names it)
                    await asyncio.to_thread(unlink_slot, self.settings.work_dir / slot)
        # A dead worker's commits for its verifiers (their containers are gone above).
        commits = await self._api(self.client.images.list, filters={"label": f"{LABEL_VERIFY}=true"})
        for image in commits:
            if worker_is_dead((image.labels or {}).get(LABEL_WORKER, "")):
                await asyncio.to_thread(self.client.images.remove, image.id, force=True)
        return removed

    # -- exec --------------------------------------------------------------------
    async def exec(self, sandbox: Sandbox, request: ExecRequest, cancel: asyncio.Event | None = None) -> ExecResult:
        handle, limits = _handle(sandbox), sandbox.spec.limits
        env = dict(request.env)
        user = SANDBOX_USER
        if request.phase == Phase.VERIFY:
            user = _exec_user(request.user, handle.image_user) if request.user is not None else SANDBOX_USER
            root = request.user is not None and verifier_policy.is_root(request.user, handle.image_user)
            if not root:
                env["HOME"] = VERIFY_HOME
            # else root's own, as Harbor's (the engine's default: /root, which test.sh scripts name
            # as ~/.local/bin); the agent could not write there, and its files there are removed.
        else:
            env.setdefault("HOME", str(sandbox.paths.home))
            # What the harness adapter wrote into HOME since start is the worker's: give it to the agent.
            await asyncio.to_thread(_chown_tree, sandbox.spec.dirs.home(Phase.AGENT), 1000)
        if request.network == Network.PROXY_ONLY and request.proxy_port and sandbox.spec.proxy_socket is not None:
            await handle.open_relay(request.proxy_port, sandbox.spec.proxy_socket)
        disk_full = asyncio.Event()
        watchdog = self._disk_watchdog(sandbox, disk_full)
        try:
            result = await handle.run(
                request.argv,
                user=user,
                env=env,
                workdir=request.cwd or str(sandbox.paths.workdir),
                stdin=request.stdin,
                timeout_s=request.timeout_s,
                output_limit=limits.output_limit_bytes,
                stop=[disk_full, *([cancel] if cancel else [])],
            )
        finally:
            if watchdog is not None:
                watchdog.cancel()
            await handle.close_relay()
        # The agent's leftovers die before verify; the verifier's die with the container.
        if request.phase == Phase.AGENT and self.integrity.kill_agent_processes:
            result.killed_leftovers = await handle.kill_user(SANDBOX_USER)
        result.disk_exceeded = disk_full.is_set()
        return result

    def _disk_watchdog(self, sandbox: Sandbox, event: asyncio.Event) -> asyncio.Future[None] | None:
        if self.disk_quota or not self.watch_layers:
            return None
        handle = _handle(sandbox)
        watched = [Path(p) for p in [handle.upper_dir()] if p] + [sandbox.spec.dirs.home(Phase.AGENT)]
        limit = sandbox.spec.limits.storage_mb * 1024 * 1024
        return asyncio.ensure_future(watch_disk(watched, limit, self.cfg.disk_poll_s, event))

    # -- files (docker_files) -----------------------------------------------------
    async def upload(self, sandbox: Sandbox, src: Path, dst: PurePosixPath) -> None:
        await files.upload(self, sandbox, src, dst)

    async def download(self, sandbox: Sandbox, src: PurePosixPath, dst: Path) -> None:
        await files.download(self, sandbox, src, dst)

    async def snapshot_pristine(self, sandbox: Sandbox) -> None:
        await files.snapshot_pristine(self, sandbox)

    async def restore_protected(
        self, sandbox: Sandbox, imports: module_shadow.VerifierImports | None = None
    ) -> list[str]:
        return await files.restore_protected(self, sandbox, imports)

    async def _api(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """An engine call in a thread; an unreachable engine is a lost sandbox."""
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except Exception as e:
            if _engine_down(e):
                raise SandboxLost(f"Docker engine unreachable: {e}") from e
            raise


def _chown_tree(root: Path, uid: int) -> None:
    if os.geteuid() != 0 or not root.is_dir():
        return
    for path in (root, *root.rglob("*")):
        os.lchown(path, uid, uid)


def _exec_user(user: str | None, image_user: str) -> str:
    """The docker exec user (and chown owner) of Harbor's verifier ``user``: itself when
    named, else the image's USER, else root."""
    return user or image_user or "0"


def _engine_down(error: Exception) -> bool:
    import requests

    return isinstance(error, requests.exceptions.ConnectionError) or "connection" in str(error).lower()


def _handle(sandbox: Sandbox) -> ContainerExec:
    assert isinstance(sandbox.handle, ContainerExec)
    return sandbox.handle
