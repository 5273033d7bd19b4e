"""The Docker backend's warm pool (``[sandbox.docker] warm_pool``) on a real engine (the
session's private dockerd): a warm container serves exactly one trial, the next trial gets
a fresh one, a trial sees the same sandbox from a warm container as from one started for
it, the red-team cheats that the start's defences stop still score 0 from a warm
container, and a drained pool (the backend's close, a worker's stop) leaves no container
and no slot directory behind."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import pytest

from harnessrl.localservers import DockerEngine
from services.sandbox.backends.base import ExecRequest, Limits, Phase, Sandbox, SandboxSpec
from services.sandbox.backends.docker import LABEL_MANAGED, DockerBackend
from services.sandbox.backends.docker_exec import ContainerExec
from services.sandbox.backends.docker_pool import SLOT_PREFIX, WarmPool
from services.sandbox.common.paths import TrialDirs
from services.sandbox.common.settings import DockerBackendSettings
from services.sandbox.queue.memory import MemoryQueue
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec, TrialState
from services.sandbox.trial.runner import TrialRunner
from services.sandbox.worker import Worker
from tests.integration import test_sandbox_redteam as redteam
from tests.integration.test_sandbox_docker import everyday_task
from tests.sandbox_support import settings_for

# What the agent sees of its sandbox: who it is, its capabilities, network, mounts (with
# their options), limits, processes, files, env and git history.
FINGERPRINT = r"""
id; grep -E '^(CapEff|CapBnd|CapPrm|NoNewPrivs|Seccomp):' /proc/self/status
ls /sys/class/net
awk '{print $4, $5, $6}' /proc/self/mountinfo | sort
cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max 2>/dev/null
for p in /proc/[0-9]*; do [ "${p#/proc/}" -lt $$ ] && cat $p/comm; done 2>/dev/null | sort
find / /logs /logs/agent /logs/artifacts /home/agent /run/harnessrl /tmp -maxdepth 1 -printf '%M %u:%g %p\n' | sort
env | sort; pwd; git log --oneline | wc -l; git status --short | wc -l
"""


def pooled(tmp: Path, engine: DockerEngine, size: int = 1, **settings: Any) -> DockerBackend:
    docker_settings = DockerBackendSettings(host=engine.host, warm_pool=size, verify_network="none")
    return DockerBackend(settings_for(tmp, backend="docker", docker=docker_settings, **settings))


def pool_of(backend: DockerBackend) -> WarmPool:
    assert backend.pool is not None
    return backend.pool


def spec_for(backend: DockerBackend, task: Path, name: str) -> SandboxSpec:
    trial_id = f"{name}-{uuid.uuid4().hex[:6]}"
    return SandboxSpec(
        trial_id=trial_id,
        task=load_task(task),
        dirs=TrialDirs(backend.settings.work_dir / trial_id),
        limits=Limits(memory_mb=256, storage_mb=64, pids=64),
    )


def container_of(box: Sandbox) -> str:
    assert isinstance(box.handle, ContainerExec)
    return str(box.handle.container.id)


def warm_ids(backend: DockerBackend) -> set[str]:
    managed = backend.client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"})
    return {c.id for c in managed if c.name.startswith(f"harnessrl-{SLOT_PREFIX}")}


def left_behind(backend: DockerBackend) -> tuple[list[str], list[str]]:
    """The managed containers and the pool's slot directories that still exist."""
    managed = backend.client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"})
    work = backend.settings.work_dir
    slots = [p.name for p in work.iterdir() if p.name.startswith(SLOT_PREFIX)] if work.is_dir() else []
    return [c.name for c in managed], slots


async def agent_sh(backend: DockerBackend, box: Sandbox, script: str) -> str:
    request = ExecRequest(argv=["/bin/bash", "-c", script], phase=Phase.AGENT, env=dict(box.env), timeout_s=30)
    result = await backend.exec(box, request)
    assert result.exit_code == 0, result.output
    return result.output.decode()


@pytest.fixture
async def backend(tmp_path: Path, docker_engine: DockerEngine) -> AsyncIterator[DockerBackend]:
    b = pooled(tmp_path, docker_engine)
    yield b
    await b.close()


async def test_a_warm_container_serves_one_trial_and_the_next_gets_a_fresh_one(
    backend: DockerBackend, tmp_path: Path
) -> None:
    task, pool = everyday_task(tmp_path / "tasks"), pool_of(backend)
    first = await backend.start(spec_for(backend, task, "first"))  # the pool learns the task: a miss
    await pool.settled()
    (warm,) = warm_ids(backend)
    assert (pool.hits, pool.misses, pool.ready()) == (0, 1, 1)

    second = await backend.start(spec_for(backend, task, "second"))
    assert container_of(second) == warm and pool.hits == 1
    # The slot's mounts are the trial's own directories now: what the agent writes lands there.
    await agent_sh(backend, second, "echo mine > /home/agent/note && echo log > /logs/agent/a.log")
    assert (second.spec.dirs.home(Phase.AGENT) / "note").read_text() == "mine\n"
    assert (second.spec.dirs.agent_logs / "a.log").read_text() == "log\n"
    # The engine's own copies in and out mount the same directories again (by the slot's path).
    await backend.download(second, PurePosixPath("/home/agent/note"), tmp_path / "note")
    assert (tmp_path / "note").read_text() == "mine\n"
    (tmp_path / "up").write_text("up\n")
    await backend.upload(second, tmp_path / "up", PurePosixPath("/home/agent/up"))
    assert (second.spec.dirs.home(Phase.AGENT) / "up").read_text() == "up\n"
    await pool.settled()
    (refilled,) = warm_ids(backend)
    assert refilled != warm
    renamed = backend.client.containers.get(warm)
    assert renamed.name == f"harnessrl-{second.spec.trial_id}"

    await backend.stop(second)
    await pool.settled()
    with pytest.raises(docker.errors.NotFound):
        backend.client.containers.get(warm)  # used once, never handed out again
    assert not second.spec.dirs.root.exists()
    third = await backend.start(spec_for(backend, task, "third"))
    assert container_of(third) == refilled
    assert "note" not in await agent_sh(backend, third, "ls -a /home/agent /logs/agent")

    for box in (first, third):
        await backend.stop(box)
    await backend.close()
    assert left_behind(backend) == ([], [])
    after = await backend.start(spec_for(backend, task, "after"))  # a drained pool: the usual start
    await backend.stop(after)
    assert pool.ready() == 0 and left_behind(backend) == ([], [])


async def test_a_trial_sees_the_same_sandbox_from_a_warm_container(backend: DockerBackend, tmp_path: Path) -> None:
    task, pool = everyday_task(tmp_path / "tasks"), pool_of(backend)
    views = []
    for name in ("cold", "warm"):
        box = await backend.start(spec_for(backend, task, name))
        await pool.settled()
        host = (await agent_sh(backend, box, "hostname")).strip()
        view = await agent_sh(backend, box, FINGERPRINT)
        view = view.replace(container_of(box), "ID").replace(host, "ID").replace(str(box.spec.dirs.root), "TRIAL")
        views.append(view)  # a slot's path would differ: the mounts show the trial's directory
        await backend.stop(box)
    assert pool.hits == 1
    assert "TRIAL/home/agent /home/agent rw" in views[0] and "NoNewPrivs:\t1" in views[0], views[0]
    assert views[1].splitlines() == views[0].splitlines()


async def test_a_worker_stop_drains_the_pool(tmp_path: Path, docker_engine: DockerEngine) -> None:
    backend = pooled(tmp_path, docker_engine, size=2, concurrency=1)
    task, queue = everyday_task(tmp_path / "tasks"), MemoryQueue()
    worker = Worker(backend.settings, queue, TrialRunner(backend.settings, backend), name="pool")
    stop = asyncio.Event()
    serving = asyncio.ensure_future(worker.run(stop))
    for i in range(3):
        await queue.submit(TrialSpec(trial_id=f"w{i}-{uuid.uuid4().hex[:6]}", task_path=str(task), harness="oracle"))
    done = 0
    async for record in queue.watch("", []):
        if record.state == TrialState.DONE:
            assert record.outcome is not None and record.outcome.reward == 1.0, record.outcome
            done += 1
            if done == 3:
                break
    assert pool_of(backend).hits >= 1
    stop.set()
    await serving
    assert left_behind(backend) == ([], [])


# The cheats the start's defences stop (the image's squashed history, tests and solution
# absent, no network, /logs/verifier root's): each must score 0 from a warm container too.
START_CHEATS = ["read the fix from git history", "read the solution", "download the fix", "write the reward file"]


@pytest.mark.parametrize("cheat", START_CHEATS)
async def test_start_cheats_score_zero_from_a_warm_container(
    tmp_path: Path, docker_engine: DockerEngine, cheat: str
) -> None:
    task = redteam.build_redteam_task(tmp_path / "redteam")
    backend = pooled(tmp_path, docker_engine)
    runner = TrialRunner(backend.settings, backend)
    try:
        first = await runner.run(
            TrialSpec(trial_id=f"warmup-{uuid.uuid4().hex[:6]}", task_path=str(task), harness="nop")
        )
        assert first.termination_reason == TerminationReason.COMPLETED, first.error
        await pool_of(backend).settled()
        (tmp_path / "www").mkdir()
        with redteam.serve_fix(tmp_path / "www") as port:
            script = redteam.CHEATS[cheat][1].replace("$FIX_PORT", str(port))
            spec = TrialSpec(
                trial_id=f"rt-{uuid.uuid4().hex[:6]}",
                task_path=str(task),
                harness="shell",
                harness_options={"script": script},
            )
            outcome = await runner.run(spec)
        assert pool_of(backend).hits == 1, "the cheat ran in a warm container"
        assert outcome.termination_reason == TerminationReason.COMPLETED, outcome.error
        assert outcome.reward == 0.0, f"{cheat}: scored {outcome.reward} from a warm container"
    finally:
        await backend.close()
    assert left_behind(backend) == ([], [])
