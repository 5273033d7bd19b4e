"""Resource limits on cgroup v1 and v2: which limits a backend can enforce on the
host, the refusal when one cannot be (or the explicit acceptance, logged), and
the v2 code paths against the host's real cgroup2 hierarchy.

This machine is hybrid: v1 memory/pids/cpu controllers, plus a cgroup2 mount
that holds no controller but hugetlb (the kernel binds a controller to one
hierarchy). So the v2 tests exercise what v2 itself does here (groups, moving
processes, cgroup.procs, cgroup.kill, the no-internal-process rule with hugetlb,
finding a container's cgroup from /proc) and read memory.events/pids.events in
the kernel's format from files written by the test: memory.max, pids.max and
cpu.max cannot be written, nor an OOM kill observed, on a v2 group here.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harnessrl.localservers import DockerEngine
from services.sandbox.backends.base import ExecRequest, Limits, Phase, Sandbox, SandboxSpec
from services.sandbox.backends.cgroups import (
    GROUP_DIR,
    WORKER_LEAF,
    CgroupSupport,
    EventFiles,
    PhaseCgroup,
    container_event_files,
    enable_controllers,
    read_keyed,
)
from services.sandbox.backends.docker_exec import ContainerExec
from services.sandbox.backends.local import LocalBackend, cgroup_prefix
from services.sandbox.common.errors import CapabilityError
from services.sandbox.common.paths import TrialDirs
from services.sandbox.common.settings import DockerBackendSettings, IntegrityPolicy, LocalBackendSettings
from services.sandbox.task.model import load_task
from tests.cgroup_support import cgroup2_mount, my_v2_cgroup, read_words, this_process_in_a_fresh_cgroup
from tests.sandbox_support import make_task, settings_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
ALL = ("memory", "pids", "cpu")


def local(tmp_path: Path, integrity: IntegrityPolicy | None = None, **cfg: object) -> LocalBackend:
    return LocalBackend(settings_for(tmp_path, integrity=integrity, local=LocalBackendSettings(**cfg)))  # type: ignore[arg-type]


async def run(backend: LocalBackend, tmp_path: Path, script: str) -> tuple[Sandbox, str]:
    spec = SandboxSpec(
        trial_id="t",
        task=load_task(make_task(tmp_path / "tasks")),
        dirs=TrialDirs(backend.settings.work_dir / "t"),
        limits=Limits(memory_mb=256, storage_mb=64, pids=64),
    )
    box = await backend.start(spec)
    request = ExecRequest(
        argv=["/bin/bash", "-c", script], phase=Phase.AGENT, env={"PATH": "/usr/bin:/bin"}, timeout_s=20
    )
    result = await backend.exec(box, request)
    assert result.exit_code == 0, result.output
    return box, result.output.decode().strip()


# -- enforce, refuse, or accept explicitly ------------------------------------------


def test_unenforceable_limits_refuse_to_start(tmp_path: Path) -> None:
    empty = tmp_path / "no-cgroups"
    empty.mkdir()
    with pytest.raises(CapabilityError, match=r"memory, pids, cpu limit\(s\).*limits_unenforced_ok"):
        local(tmp_path, cgroup_root=empty)
    with pytest.raises(CapabilityError, match=r"cannot enforce the pids, cpu limit"):
        local(tmp_path, cgroup_root=empty, limits_unenforced_ok=("memory",))


async def test_accepted_unenforced_limits_start_and_say_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    empty = tmp_path / "no-cgroups"
    empty.mkdir()
    with caplog.at_level(logging.WARNING):
        backend = local(tmp_path, cgroup_root=empty, limits_unenforced_ok=ALL)
    warned = [r for r in caplog.records if "NOT enforced" in r.getMessage()]
    assert warned and warned[0].kv["unenforced"] == list(ALL)  # type: ignore[attr-defined]
    assert not (backend.capabilities.memory_limit or backend.capabilities.pids_limit)
    # No silent RLIMIT_AS in its place (Node and Bun harnesses die under one).
    box, out = await run(backend, tmp_path, "ulimit -v")
    await backend.stop(box)
    assert out == "unlimited"


async def test_rlimit_as_only_when_asked_for(tmp_path: Path) -> None:
    empty = tmp_path / "no-cgroups"
    empty.mkdir()
    backend = local(tmp_path, cgroup_root=empty, limits_unenforced_ok=("pids", "cpu"), memory_rlimit_fallback=True)
    assert backend.capabilities.memory_limit and "RLIMIT_AS" in backend.capabilities.limits_detail
    box, out = await run(backend, tmp_path, "ulimit -v")
    await backend.stop(box)
    assert out == str(256 * 1024)


def test_this_hosts_default_enforces_every_limit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    if os.geteuid() != 0 or not (Path("/sys/fs/cgroup/memory/cgroup.procs")).exists():
        pytest.skip("needs root on a cgroup v1 host (this project's machines)")
    with caplog.at_level(logging.WARNING):
        backend = LocalBackend(settings_for(tmp_path))  # no setting changed
    caps = backend.capabilities
    assert caps.memory_limit and caps.pids_limit and caps.cpu_limit
    assert caps.limits_detail.startswith("cgroup v1 at /sys/fs/cgroup")
    assert not [r for r in caplog.records if "NOT enforced" in r.getMessage()]
    assert not backend.memory_rlimit


# -- cgroup v2 against the host's cgroup2 hierarchy -----------------------------------


@pytest.fixture
def worker_in_v2() -> Iterator[tuple[Path, Path]]:
    """(the cgroup2 mount, a fresh cgroup there holding this test process, as a worker's
    own cgroup would); the process moves back and the cgroup goes after the test."""
    mount = cgroup2_mount()
    if mount is None or not os.access(mount / "cgroup.procs", os.W_OK):
        pytest.skip("no writable cgroup2 hierarchy here")
    with this_process_in_a_fresh_cgroup(mount) as own:
        yield mount, own


async def test_v2_exec_groups_list_and_kill_their_processes(tmp_path: Path, worker_in_v2: tuple[Path, Path]) -> None:
    mount, own = worker_in_v2
    # Leftovers outlive the exec when this defence is off: the v2 group must find and kill them at stop.
    keep = IntegrityPolicy(kill_agent_processes=False)
    backend = local(tmp_path, keep, cgroup_root=mount, limits_unenforced_ok=ALL)
    support = backend.cgroup_support
    assert support.version == "v2" and support.unified == own / GROUP_DIR
    assert "exec groups under" in backend.capabilities.limits_detail
    box, _ = await run(backend, tmp_path, "setsid sleep 300 < /dev/null > /dev/null 2>&1 &")
    group = box.handle.cgroups[0]  # type: ignore[attr-defined]
    assert group.unified is not None and group.unified.parent == own / GROUP_DIR
    leftovers = group.pids_alive()
    assert leftovers and (group.unified / "cgroup.procs").read_text().split() == [str(p) for p in leftovers]
    assert (group.unified / "cgroup.kill").exists()  # kernel 5.14+: killed in one write
    await backend.stop(box)
    assert not group.unified.exists()
    assert not [pid for pid in leftovers if _running(pid)]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_v2_groups_of_dead_workers_are_swept(tmp_path: Path, worker_in_v2: tuple[Path, Path]) -> None:
    mount, own = worker_in_v2
    backend = local(tmp_path, cgroup_root=mount, limits_unenforced_ok=ALL)
    orphan = backend.settings.work_dir / "dead-trial-1"
    orphan.mkdir(parents=True)
    (orphan / ".owner").touch()
    group = PhaseCgroup.create(backend.cgroup_support, f"{cgroup_prefix(orphan)}agent-0", 64, 16)
    assert group.procs_files() == [str(own / GROUP_DIR / group.name / "cgroup.procs")]
    leftover = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", f"echo $$ > {group.procs_files()[0]}; exec sleep 300"
    )
    try:
        for _ in range(500):
            if leftover.pid in group.pids_alive():
                break
            await asyncio.sleep(0.01)
        assert leftover.pid in group.pids_alive()
        assert await backend.cleanup_orphans() == 1
        assert await asyncio.wait_for(leftover.wait(), 5) == -9
        assert not (own / GROUP_DIR / group.name).exists()
    finally:
        if leftover.returncode is None:
            leftover.kill()
            await leftover.wait()


@pytest.fixture
def hugetlb_delegated(worker_in_v2: tuple[Path, Path]) -> Iterator[tuple[Path, Path]]:
    """hugetlb enabled for the root's children: the one controller this host's v2 has,
    so v2's no-internal-process rule can be met for real. Restored after."""
    mount, own = worker_in_v2
    if "hugetlb" not in read_words(mount / "cgroup.controllers"):
        pytest.skip("no controller in this host's cgroup2 hierarchy")
    enabled_here = "hugetlb" not in read_words(mount / "cgroup.subtree_control")
    if enabled_here:
        (mount / "cgroup.subtree_control").write_text("+hugetlb")
    try:
        yield mount, own
    finally:
        if enabled_here:  # children first: a child that still hands it on keeps it enabled
            (own / "cgroup.subtree_control").write_text("-hugetlb")
            (mount / "cgroup.subtree_control").write_text("-hugetlb")


def test_v2_worker_moves_into_a_leaf_to_delegate_controllers(hugetlb_delegated: tuple[Path, Path]) -> None:
    mount, own = hugetlb_delegated
    # The rule is real here: a cgroup holding a process cannot give its children a controller.
    with pytest.raises(OSError) as refused:
        fd = os.open(own / "cgroup.subtree_control", os.O_WRONLY)
        try:
            os.write(fd, b"+hugetlb")
        finally:
            os.close(fd)
    assert refused.value.errno == errno.EBUSY
    assert enable_controllers(own, {"hugetlb"}) == {"hugetlb"}
    assert my_v2_cgroup(mount) == own / WORKER_LEAF
    assert read_words(own / "cgroup.procs") == set()
    # A second detection (another worker sharing the cgroup, or a restart) uses the leaf's parent.
    support = CgroupSupport.detect(mount)
    assert support.unified == own / GROUP_DIR and my_v2_cgroup(mount) == own / WORKER_LEAF


def test_v2_keyed_files_parse_as_the_kernel_writes_them(tmp_path: Path, worker_in_v2: tuple[Path, Path]) -> None:
    _, own = worker_in_v2
    assert read_keyed(own / "cgroup.events") == {"populated": 1, "frozen": 0}  # a real v2 file
    # memory.events and pids.events need their controllers, bound to v1 here: the kernel's format.
    group = PhaseCgroup(name="x", unified=tmp_path)
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 0\noom_kill 0\noom_group_kill 0\n")
    (tmp_path / "pids.events").write_text("max 0\n")
    assert not group.oom_killed() and not group.pids_limit_hit()
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 40\noom 1\noom_kill 1\noom_group_kill 0\n")
    (tmp_path / "pids.events").write_text("max 3\n")
    assert group.oom_killed() and group.pids_limit_hit()


# -- the docker backend: a container's cgroup on any version and driver ------------------


def test_container_cgroup_is_found_from_its_init_process(worker_in_v2: tuple[Path, Path]) -> None:
    mount, own = worker_in_v2
    container = own / "some-runtime-path"
    container.mkdir()
    init = subprocess.Popen(["sh", "-c", f"echo $$ > {container}/cgroup.procs; exec sleep 300"])
    try:
        for _ in range(500):
            if str(init.pid) in (container / "cgroup.procs").read_text().split():
                break
            time.sleep(0.01)
        proc = Path(f"/proc/{init.pid}/cgroup").read_text()
        files = container_event_files(mount, "c0ffee", proc)
        assert files == EventFiles(oom=container / "memory.events", pids=container / "pids.events")
        assert files.read() == (0, 0)  # no memory/pids controller on this host's v2: nothing counted
    finally:
        init.kill()
        init.wait()


@pytest.mark.parametrize(
    ("v2", "layout"),
    [
        (True, "docker/ID"),
        (True, "system.slice/docker-ID.scope"),
        (False, "docker/ID"),
        (False, "system.slice/docker-ID.scope"),
    ],
)
def test_container_cgroup_by_driver_when_its_process_is_not_visible(tmp_path: Path, v2: bool, layout: str) -> None:
    cid = "ab12" * 16
    rel = layout.replace("ID", cid)
    if v2:
        (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "memory.events").write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\n")
        (tmp_path / rel / "pids.events").write_text("max 7\n")
    else:
        (tmp_path / "memory" / rel).mkdir(parents=True)
        (tmp_path / "pids" / rel).mkdir(parents=True)
        (tmp_path / "memory" / rel / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
        (tmp_path / "pids" / rel / "pids.events").write_text("max 7\n")
    assert container_event_files(tmp_path, cid, None).read() == (2, 7)
    assert container_event_files(tmp_path, "other", None) == EventFiles()


async def test_docker_engine_limits_and_the_containers_cgroup(tmp_path: Path, docker_engine: DockerEngine) -> None:
    from services.sandbox.backends.docker import DockerBackend

    backend = DockerBackend(
        settings_for(
            tmp_path, backend="docker", docker=DockerBackendSettings(host=docker_engine.host, verify_network="none")
        )
    )
    info = backend.client.info()
    caps = backend.capabilities
    assert caps.memory_limit and caps.pids_limit and caps.cpu_limit
    assert f"cgroup v{info.get('CgroupVersion') or '1'}, {info['CgroupDriver']} driver" in caps.limits_detail
    spec = SandboxSpec(
        trial_id=f"cg-{uuid.uuid4().hex[:8]}",
        task=load_task(make_task(tmp_path / "tasks")),
        dirs=TrialDirs(backend.settings.work_dir / "cg"),
        limits=Limits(memory_mb=256, storage_mb=64, pids=64),
    )
    box = await backend.start(spec)
    handle = box.handle
    assert isinstance(handle, ContainerExec)
    state = handle.container.attrs["State"]
    try:
        assert handle.counters() == (0, 0)
        found = handle.events
        assert found is not None and found.oom is not None and found.pids is not None
        assert found.oom.is_file() and found.pids.is_file() and handle.container.id in str(found.oom)
        # A worker in another pid namespace cannot read /proc/<pid>: the driver's own path finds the same files.
        pid, state["Pid"], handle.events = state["Pid"], 0, None
        assert handle.counters() == (0, 0) and handle.events == found
        state["Pid"] = pid
    finally:
        await backend.stop(box)
