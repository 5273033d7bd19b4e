"""The local backend on a cgroup v2 hierarchy with the memory, pids and cpu
controllers, for real: detection, memory.max, pids.max and cpu.max written and
enforced, the OOM kill and the pids limit counted, and whole trials ending with
their reasons.

This machine binds those controllers to cgroup v1, so here every test skips and
says why; ``test_sandbox_cgroups_vm.py`` runs this module in a VM whose kernel
mounts cgroup2 with them (``tests/cgroup_vm.py``), and fails if any test skips there.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.sandbox.backends.base import ExecRequest, Limits, Phase, Sandbox, SandboxSpec
from services.sandbox.backends.cgroups import GROUP_DIR, LIMITS, WORKER_LEAF, PhaseCgroup, read_keyed
from services.sandbox.backends.local import LocalBackend
from services.sandbox.common.paths import TrialDirs
from services.sandbox.common.settings import IntegrityPolicy, LocalBackendSettings
from services.sandbox.factory import build_worker
from services.sandbox.queue.memory import MemoryQueue
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec, TrialState
from tests.cgroup_support import cgroup2_mount, my_v2_cgroup, read_words, this_process_in_a_fresh_cgroup
from tests.sandbox_support import make_task, settings_for, wait_for_state

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
WANTED = set(LIMITS)


def _why_no_v2_controllers(mount: Path | None) -> str | None:
    """Why the limits cannot be had on cgroup v2 here (the kernel's own account), or None."""
    if mount is None:
        return "no cgroup2 mount here"
    missing = WANTED - read_words(mount / "cgroup.controllers")
    if not missing:
        return None
    v1 = {}
    for line in Path("/proc/cgroups").read_text().splitlines()[1:]:
        name, hierarchy, *_ = line.split()
        v1[name] = hierarchy
    bound = ", ".join(f"{c} in v1 hierarchy {v1.get(c, '?')}" for c in sorted(missing))
    return (
        f"the cgroup2 hierarchy at {mount} lacks {sorted(missing)}: the kernel binds a controller to one "
        f"hierarchy, and this host binds them to v1 (/proc/cgroups: {bound}); "
        "test_sandbox_cgroups_vm.py runs this module in a VM with them on v2"
    )


@pytest.fixture
def v2_worker() -> Iterator[tuple[Path, Path]]:
    """(the cgroup2 mount, a fresh cgroup there holding this test process as a worker's
    own cgroup would, with memory, pids and cpu delegated to it)."""
    mount = cgroup2_mount()
    why = _why_no_v2_controllers(mount)
    if why is not None:
        pytest.skip(why)
    assert mount is not None
    root_control = mount / "cgroup.subtree_control"
    if not WANTED <= read_words(root_control):  # the root may hold processes and still delegate
        root_control.write_text(" ".join(f"+{c}" for c in sorted(WANTED)))
    with this_process_in_a_fresh_cgroup(mount) as own:
        yield mount, own


def backend_on(tmp_path: Path, mount: Path, integrity: IntegrityPolicy | None = None) -> LocalBackend:
    return LocalBackend(settings_for(tmp_path, integrity, local=LocalBackendSettings(cgroup_root=mount)))


def test_v2_detection_enforces_every_limit(tmp_path: Path, v2_worker: tuple[Path, Path]) -> None:
    mount, own = v2_worker
    backend = backend_on(tmp_path, mount)
    caps, support = backend.capabilities, backend.cgroup_support
    assert caps.memory_limit and caps.pids_limit and caps.cpu_limit and not backend.memory_rlimit
    assert caps.limits_detail.startswith(f"cgroup v2 at {mount}") and "not enforced" not in caps.limits_detail
    assert support.unified == own / GROUP_DIR and support.v2_controllers == WANTED
    # v2's no-internal-process rule: to delegate, the worker moved into a leaf of its cgroup.
    assert my_v2_cgroup(mount) == own / WORKER_LEAF
    assert WANTED <= read_words(own / GROUP_DIR / "cgroup.subtree_control")


async def start(backend: LocalBackend, tmp_path: Path, limits: Limits) -> Sandbox:
    spec = SandboxSpec(
        trial_id="t",
        task=load_task(make_task(tmp_path / "tasks")),
        dirs=TrialDirs(backend.settings.work_dir / "t"),
        limits=limits,
    )
    return await backend.start(spec)


def agent_sh(script: str, timeout_s: float = 30) -> ExecRequest:
    return ExecRequest(
        argv=["/bin/bash", "-c", script], phase=Phase.AGENT, env={"PATH": "/usr/bin:/bin"}, timeout_s=timeout_s
    )


async def test_v2_exec_group_holds_the_exec_under_its_limits(tmp_path: Path, v2_worker: tuple[Path, Path]) -> None:
    mount, own = v2_worker
    # Leftovers outlive the exec when this defence is off: the group stays to be read.
    backend = backend_on(tmp_path, mount, IntegrityPolicy(kill_agent_processes=False))
    box = await start(backend, tmp_path, Limits(memory_mb=200, pids=40, storage_mb=64, cpus=0.5))
    try:
        result = await backend.exec(box, agent_sh("setsid sleep 300 < /dev/null > /dev/null 2>&1 &"))
        assert result.exit_code == 0, result.output
        group = box.handle.cgroups[0]  # type: ignore[attr-defined]
        assert group.paths == [group.unified] and group.unified.parent == own / GROUP_DIR
        assert (group.unified / "memory.max").read_text().strip() == str(200 * 1024 * 1024)
        assert (group.unified / "pids.max").read_text().strip() == "40"
        assert (group.unified / "cpu.max").read_text().strip() == "50000 100000"
        leftover = group.pids_alive()
        assert len(leftover) == 1 and "sleep" in _cmdline(leftover[0])
    finally:
        await backend.stop(box)
    assert not group.unified.exists()


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text()


async def test_v2_memory_max_oom_kills_the_hog(tmp_path: Path, v2_worker: tuple[Path, Path]) -> None:
    backend = backend_on(tmp_path, v2_worker[0])
    box = await start(backend, tmp_path, Limits(memory_mb=128, pids=64, storage_mb=64))
    try:
        result = await backend.exec(box, agent_sh("python3 -c 'x = bytearray(1 << 30); print(len(x))'"))
    finally:
        await backend.stop(box)
    # Killed by the kernel at memory.max, not a MemoryError: the limit is the cgroup's.
    assert result.oom_killed and result.exit_code != 0 and b"MemoryError" not in result.output, result


async def test_v2_fork_bomb_stops_at_pids_max(tmp_path: Path, v2_worker: tuple[Path, Path]) -> None:
    backend = backend_on(tmp_path, v2_worker[0])
    box = await start(backend, tmp_path, Limits(memory_mb=256, pids=32, storage_mb=64))
    try:
        result = await backend.exec(box, agent_sh("bomb() { bomb | bomb & }; bomb; sleep 2", timeout_s=10))
    finally:
        await backend.stop(box)
    assert result.pids_limit_hit, result


async def test_v2_cpu_max_throttles_a_busy_loop(tmp_path: Path, v2_worker: tuple[Path, Path]) -> None:
    backend = backend_on(tmp_path, v2_worker[0])
    group = PhaseCgroup.create(backend.cgroup_support, f"cpu-{uuid.uuid4().hex[:8]}", 64, 16, cpus=0.05)
    procs = group.procs_files()[0]
    busy = await asyncio.create_subprocess_exec("/bin/sh", "-c", f"echo $$ > {procs}; while :; do :; done")
    try:
        assert group.unified is not None
        stat: dict[str, int] = {}
        # The kernel throttles it within a period or two (100 ms each); throttled_usec grows
        # only when a throttled period ends, so a loaded host can show nr_throttled 1 and
        # throttled_usec 0 for a moment (seen in the VM): wait for both.
        for _ in range(1000):
            stat = read_keyed(group.unified / "cpu.stat")
            if stat.get("nr_throttled", 0) > 0 and stat.get("throttled_usec", 0) > 0:
                break
            await asyncio.sleep(0.01)
        assert stat.get("nr_throttled", 0) > 0 and stat.get("throttled_usec", 0) > 0, stat
    finally:
        busy.kill()
        await busy.wait()
        group.remove()


TOML = """\
schema_version = "1.4"
[agent]
timeout_sec = {agent_timeout}
[verifier]
timeout_sec = 30
[environment]
memory_mb = 256
storage_mb = 40
"""

# name -> (harness script, agent timeout, expected reason, expected reward, expected event)
CASES = {
    "oom": (
        "python3 -c 'x = bytearray(1 << 30)'; echo hello > hello.txt",
        60,
        TerminationReason.COMPLETED,
        1.0,
        "agent:oom_killed",
    ),
    "fork-bomb": ("b() { b | b & }; b; sleep 30", 6, TerminationReason.AGENT_TIMEOUT, 0.0, "agent:pids_limit_hit"),
}


async def test_v2_trials_end_with_their_reasons(tmp_path: Path, v2_worker: tuple[Path, Path]) -> None:
    settings = settings_for(
        tmp_path, pids_limit=64, local=LocalBackendSettings(cgroup_root=v2_worker[0], verify_network="none")
    )
    queue = MemoryQueue()
    worker = build_worker(settings, queue, name="w")
    stop = asyncio.Event()
    serving = asyncio.ensure_future(worker.run(stop))
    for name, (script, agent_timeout, *_) in CASES.items():
        task = make_task(tmp_path / "tasks", name, toml=TOML.format(agent_timeout=agent_timeout))
        await queue.submit(
            TrialSpec(trial_id=f"v2-{name}", task_path=str(task), harness="shell", harness_options={"script": script})
        )
    try:
        records = {name: await wait_for_state(queue, f"v2-{name}", TrialState.DONE, 300) for name in CASES}
    finally:
        stop.set()
        await serving
    for name, (_, _, reason, reward, event) in CASES.items():
        outcome = records[name].outcome
        assert outcome is not None
        assert (outcome.termination_reason, outcome.reward) == (reason, reward), (name, outcome)
        assert event in outcome.events, (name, outcome.events)
