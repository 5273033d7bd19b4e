"""The warm pool's own bookkeeping (backends/docker_pool.py), with a launch that makes a
slot's directories and hands back a token instead of a container: keys, adoption of a
slot, eviction, draining while a launch is under way, releases behind a trial. The pool
on a real engine: tests/integration/test_sandbox_docker_pool.py."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from services.sandbox.backends.base import Limits, SandboxSpec
from services.sandbox.backends.docker_pool import SLOT_PREFIX, PoolKey, WarmPool
from services.sandbox.common.paths import TrialDirs
from services.sandbox.task.model import load_task

HELLO = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "examples" / "hello"


class Engine:
    """Stands in for the engine: a launch writes a marker into the slot's HOME."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.removed: list[str] = []
        self.gate: asyncio.Event | None = None

    async def launch(self, spec: SandboxSpec, key: PoolKey) -> str:
        if self.gate is not None:
            await self.gate.wait()
        spec.dirs.create()
        spec.dirs.home("agent").mkdir(parents=True)
        (spec.dirs.home("agent") / "slot").write_text(spec.trial_id)
        self.started.append(spec.trial_id)
        return spec.trial_id

    async def remove(self, container: object) -> None:
        self.removed.append(str(container))


def spec(tmp: Path, trial_id: str, mounts: tuple[Path, ...] = ()) -> SandboxSpec:
    dirs = TrialDirs(tmp / "work" / trial_id)
    return SandboxSpec(trial_id=trial_id, task=load_task(HELLO), dirs=dirs, limits=Limits(), ro_mounts=mounts)


def key(s: SandboxSpec, image: str = "sha256:a") -> PoolKey:
    return PoolKey.of(s, image, "/app", disk_quota=False, setup="")


def slots(tmp: Path) -> list[Path]:
    return sorted(p for p in (tmp / "work").iterdir() if p.name.startswith(SLOT_PREFIX))


async def rename(container: object) -> None:
    return None


def test_a_mount_replaced_under_its_path_is_another_key(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    before = key(spec(tmp_path, "a", (tools,)))
    assert key(spec(tmp_path, "b", (tools,))) == before
    shutil.rmtree(tools)
    tools.mkdir()  # a reinstall: a warm container would still mount the old directory
    assert key(spec(tmp_path, "c", (tools,))) != before
    assert key(spec(tmp_path, "d", (tools,)), image="sha256:b") != key(spec(tmp_path, "e", (tools,)))


async def test_a_trial_adopts_a_slot_and_the_slot_path_leads_to_it(tmp_path: Path) -> None:
    engine = Engine()
    pool = WarmPool(tmp_path / "work", 1, 2, engine.launch, engine.remove)
    first = spec(tmp_path, "first")
    assert await pool.take(key(first), first, rename) is None  # learns the task
    await pool.settled()
    (slot,) = slots(tmp_path)
    second = spec(tmp_path, "second")
    warm = await pool.take(key(second), second, rename)
    assert warm is not None and warm.container == slot.name and warm.dirs.root == slot
    assert (second.dirs.home("agent") / "slot").read_text() == slot.name
    assert slot.is_symlink() and slot.resolve() == second.dirs.root.resolve()
    assert (pool.hits, pool.misses) == (1, 1)
    await pool.drain()
    assert engine.removed == [s for s in engine.started if s != slot.name]
    assert [p for p in slots(tmp_path) if not p.is_symlink()] == []


async def test_the_task_asked_for_least_recently_is_drained(tmp_path: Path) -> None:
    engine = Engine()
    pool = WarmPool(tmp_path / "work", 1, 1, engine.launch, engine.remove)
    a, b = spec(tmp_path, "a"), spec(tmp_path, "b")
    await pool.take(key(a), a, rename)
    await pool.settled()
    assert pool.ready(key(a)) == 1
    await pool.take(key(b, image="sha256:b"), b, rename)
    assert pool.ready(key(a)) == 0 and engine.removed == engine.started[:1]
    await pool.settled()
    assert pool.ready() == 1
    await pool.drain()
    assert sorted(engine.removed) == sorted(engine.started) and slots(tmp_path) == []


async def test_drain_waits_for_a_launch_under_way_and_removes_it(tmp_path: Path) -> None:
    engine = Engine()
    engine.gate = asyncio.Event()
    pool = WarmPool(tmp_path / "work", 1, 1, engine.launch, engine.remove)
    a = spec(tmp_path, "a")
    await pool.take(key(a), a, rename)
    draining = asyncio.ensure_future(pool.drain())
    await asyncio.sleep(0)
    assert not draining.done()
    engine.gate.set()
    await draining
    assert len(engine.started) == 1 and engine.removed == engine.started and slots(tmp_path) == []
    assert await pool.take(key(a), a, rename) is None and pool.ready() == 0  # drained: no refill


async def test_releases_run_behind_until_drained_then_inline(tmp_path: Path) -> None:
    engine = Engine()
    pool = WarmPool(tmp_path / "work", 1, 1, engine.launch, engine.remove)
    done: list[str] = []
    gate = asyncio.Event()

    async def release() -> None:
        await gate.wait()
        done.append("behind")

    await pool.behind(release)
    assert done == []  # returned before the release ran
    draining = asyncio.ensure_future(pool.drain())
    await asyncio.sleep(0)
    assert not draining.done()  # a drain waits for the releases under way
    gate.set()
    await draining
    assert done == ["behind"]

    async def inline() -> None:
        done.append("inline")

    await pool.behind(inline)
    assert done == ["behind", "inline"]
