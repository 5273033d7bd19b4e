"""The local bubblewrap backend: isolation, the Dockerfile replay and its cache,
resource limits. Real bwrap, real cgroups, real processes."""

from __future__ import annotations

import shutil
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.sandbox.backends.base import ExecRequest, Limits, Network, Phase, Sandbox, SandboxSpec
from services.sandbox.backends.layers import LAYER_FORMAT
from services.sandbox.backends.local import LocalBackend, cgroup_prefix
from services.sandbox.common.errors import EnvSetupError, UnsupportedInstruction
from services.sandbox.common.paths import TrialDirs
from services.sandbox.common.settings import LocalBackendSettings
from services.sandbox.task.model import load_task
from tests.sandbox_support import make_task, settings_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(settings_for(tmp_path))


async def start(backend: LocalBackend, task_dir: Path, name: str = "t", **limits: int) -> Sandbox:
    spec = SandboxSpec(
        trial_id=name,
        task=load_task(task_dir),
        dirs=TrialDirs(backend.settings.work_dir / name),
        limits=Limits(**{"memory_mb": 256, "storage_mb": 64, "pids": 64, **limits}),
    )
    return await backend.start(spec)


async def sh(backend: LocalBackend, sandbox: Sandbox, script: str, phase: Phase = Phase.AGENT, limit_s: float = 20):
    request = ExecRequest(
        argv=["/bin/bash", "-c", script], phase=phase, env={"PATH": "/usr/bin:/bin"}, timeout_s=limit_s
    )
    return await backend.exec(sandbox, request)


@pytest.fixture
async def sandbox(backend: LocalBackend, tmp_path: Path) -> AsyncIterator[Sandbox]:
    box = await start(backend, make_task(tmp_path / "tasks"))
    yield box
    await backend.stop(box)


async def test_isolation(backend: LocalBackend, sandbox: Sandbox) -> None:
    # A server on the host's loopback: the sandbox's own loopback must not reach it.
    host_server = socket.create_server(("127.0.0.1", 0))
    port = host_server.getsockname()[1]
    script = """
    id -u; grep CapEff /proc/self/status
    touch /usr/x 2>&1 | grep -c 'Read-only'
    cat /etc/shadow 2>/dev/null | wc -c
    ls /work /root 2>&1 | grep -c 'No such file'
    ls /tests /solution /logs/verifier 2>&1 | grep -c 'No such file'
    echo ok > /app/out.txt && echo ok > /tmp/t && echo ok > ~/h && echo ok > /logs/agent/log && echo writes-ok
    python3 -c "import socket; socket.create_connection(('127.0.0.1', PORT), timeout=2)" 2>&1 | tail -1
    cat /proc/net/dev | grep -c ':'
    ps -e --no-headers | wc -l
    """
    with host_server:
        result = await sh(backend, sandbox, script.replace("PORT", str(port)))
    lines = result.output.decode().split("\n")
    assert result.exit_code == 0, result.output
    assert lines[0] == "1000"
    assert lines[1].split()[1] == "0000000000000000"
    assert lines[2:6] == ["1", "0", "2", "3"]
    assert lines[6] == "writes-ok"
    assert "refused" in lines[7]
    assert lines[8] == "1"  # only lo
    assert int(lines[9]) <= 4  # a fresh pid namespace: bash, ps, wc
    assert (sandbox.spec.dirs.workspace / "out.txt").read_text() == "ok\n"


async def test_background_processes_die_with_the_phase(backend: LocalBackend, sandbox: Sandbox) -> None:
    marker = sandbox.spec.dirs.workspace / "alive"
    result = await sh(backend, sandbox, "(setsid nohup bash -c 'sleep 1; touch /app/alive' &) ; exit 0")
    assert result.exit_code == 0
    import asyncio

    await asyncio.sleep(1.5)
    assert not marker.exists()


async def test_layer_replays_dockerfile_and_is_cached(backend: LocalBackend, tmp_path: Path) -> None:
    dockerfile = """\
    FROM debian:bookworm-slim
    ARG GREETING=hi
    ENV APP_HOME=/srv/app MODE="two words"
    WORKDIR $APP_HOME
    COPY README.md ./
    COPY lib/ /opt/lib/
    ADD bundle.tar.gz /opt/bundle/
    RUN echo "$GREETING $MODE" > built.txt && echo run >> /tmp/counter && id -u > uid.txt
    USER agent
    EXPOSE 8080
    CMD ["sleep", "1"]
    """
    import tarfile

    context = tmp_path / "ctx"
    (context / "inner").mkdir(parents=True)
    (context / "inner" / "x.txt").write_text("from tar\n")
    with tarfile.open(tmp_path / "bundle.tar.gz", "w:gz") as tar:
        tar.add(context / "inner" / "x.txt", arcname="x.txt")
    task_dir = make_task(tmp_path / "tasks", dockerfile=dockerfile, context={"lib/mod.py": "X = 1\n"})
    shutil.copy(tmp_path / "bundle.tar.gz", task_dir / "environment" / "bundle.tar.gz")
    box = await start(backend, task_dir)
    try:
        assert str(box.paths.workdir) == "/srv/app"
        assert box.env["APP_HOME"] == "/srv/app" and box.env["MODE"] == "two words"
        result = await sh(backend, box, "cat built.txt uid.txt README.md /opt/lib/mod.py /opt/bundle/x.txt; pwd")
        assert result.output.decode().split("\n")[:6] == [
            "hi two words",
            "0",
            "# repo",
            "X = 1",
            "from tar",
            "/srv/app",
        ]
        denied = await sh(backend, box, "echo x > /opt/lib/mod.py")
        assert denied.exit_code != 0  # layer roots outside the workdir are read-only
        layers = list((backend.settings.cache_dir / "layers").glob(f"*-v{LAYER_FORMAT}"))
        assert len(layers) == 1
        stamp = (layers[0] / "layer.json").stat().st_mtime_ns
        box2 = await start(backend, task_dir, name="t2")
        assert (layers[0] / "layer.json").stat().st_mtime_ns == stamp
        await backend.stop(box2)
    finally:
        await backend.stop(box)


@pytest.mark.parametrize(
    ("dockerfile", "fragment"),
    [
        ("FROM a AS b\nFROM c\n", "multi-stage"),
        ("FROM a\nCOPY --from=b /x /y\n", "COPY --from"),
        ("FROM a\nADD https://example.com/x /x\n", "URL"),
        ("FROM a\nONBUILD RUN x\n", "instruction ONBUILD"),
        ('FROM a\nSHELL ["/bin/bash", "-c"]\n', "instruction SHELL"),
        ("FROM a\nRUN --mount=type=cache,target=/x true\n", "RUN flags"),
    ],
)
async def test_unsupported_instruction_names_it_and_points_to_docker(
    backend: LocalBackend, tmp_path: Path, dockerfile: str, fragment: str
) -> None:
    with pytest.raises(UnsupportedInstruction) as info:
        await start(backend, make_task(tmp_path / "tasks", dockerfile=dockerfile))
    assert fragment in str(info.value) and "docker backend" in str(info.value) and "line 2" in str(info.value)


async def test_failing_run_and_host_writes_are_env_setup_errors(backend: LocalBackend, tmp_path: Path) -> None:
    with pytest.raises(EnvSetupError, match="exited with 3"):
        await start(backend, make_task(tmp_path / "a", dockerfile="FROM x\nWORKDIR /app\nRUN echo boom; exit 3\n"))
    with pytest.raises(EnvSetupError, match=r"line 3: 'RUN touch /usr/bin/evil' exited with 1 \(the host's system"):
        await start(backend, make_task(tmp_path / "b", dockerfile="FROM x\nWORKDIR /app\nRUN touch /usr/bin/evil\n"))
    with pytest.raises(EnvSetupError, match="not found"):
        await start(backend, make_task(tmp_path / "c", dockerfile="FROM x\nCOPY missing.txt /app/\n"))
    with pytest.raises(EnvSetupError, match="outside the build context"):
        await start(backend, make_task(tmp_path / "d", dockerfile="FROM x\nCOPY ../task.toml /app/\n"))
    prebuilt = make_task(tmp_path / "e", toml='[environment]\ndocker_image = "python:3.12"\n')
    (prebuilt / "environment" / "Dockerfile").unlink()
    with pytest.raises(EnvSetupError, match="cannot pull images, use the docker backend"):
        await start(backend, prebuilt)


async def test_agent_timeout_kills_the_hang(backend: LocalBackend, sandbox: Sandbox) -> None:
    result = await sh(backend, sandbox, "sleep 60 & sleep 60", limit_s=0.5)
    assert result.timed_out and result.duration_s < 10


async def test_an_execs_process_tree_cpu_counts_as_its_phases_component(
    backend: LocalBackend, sandbox: Sandbox
) -> None:
    """wait4's rusage of the exec: the CPU of a process the command started in the background
    and waited for (inside bubblewrap's pid namespace) is in it; the agent phase's counts as
    the harness's, the verify phase's as the sandbox's (harnessrl.cpu)."""
    from harnessrl import cpu

    burn = "python3 -c 'import time\nwhile time.process_time() < 0.3: pass' & wait; echo done"
    before = cpu.snapshot()
    result = await sh(backend, sandbox, burn)
    middle = cpu.snapshot()
    assert result.exit_code == 0 and result.output == b"done\n" and result.cpu_s is not None
    assert result.cpu_s >= 0.3
    assert middle["harness"] - before["harness"] == pytest.approx(result.cpu_s)
    verified = await sh(backend, sandbox, burn, phase=Phase.VERIFY)
    after = cpu.snapshot()
    assert verified.cpu_s is not None and verified.cpu_s >= 0.3
    assert after["harness"] == middle["harness"] and after["sandbox"] - middle["sandbox"] >= 0.3


async def test_output_flood_is_bounded(backend: LocalBackend, tmp_path: Path) -> None:
    box = await start(backend, make_task(tmp_path / "tasks"))
    try:
        spec = box.spec.model_copy(update={"limits": box.spec.limits.model_copy(update={"output_limit_bytes": 4096})})
        box.spec = spec
        result = await sh(backend, box, "head -c 50000000 /dev/zero | tr '\\0' 'x'; echo END")
        assert result.output_truncated and result.output_bytes > 50_000_000
        assert len(result.output) < 4096 + 100 and result.output.endswith(b"END\n")
    finally:
        await backend.stop(box)


async def test_memory_limit_ooms_the_hog(backend: LocalBackend, sandbox: Sandbox) -> None:
    result = await sh(backend, sandbox, "python3 -c 'x = bytearray(1024 * 1024 * 1024); print(len(x))'")
    assert result.exit_code != 0
    assert result.oom_killed or b"MemoryError" in result.output


async def test_fork_bomb_hits_the_pids_limit(backend: LocalBackend, sandbox: Sandbox) -> None:
    if not backend.capabilities.pids_limit:
        pytest.skip("no writable pids cgroup here")
    result = await sh(backend, sandbox, "bomb() { bomb | bomb & }; bomb; sleep 2", limit_s=5)
    assert result.pids_limit_hit


async def test_disk_fill_is_stopped(backend: LocalBackend, sandbox: Sandbox) -> None:
    script = "for i in $(seq 1 100); do head -c 10000000 /dev/zero > /app/f$i || break; done; sleep 5"
    result = await sh(backend, sandbox, script, limit_s=20)
    assert result.disk_exceeded or b"File too large" in result.output
    assert result.duration_s < 15


async def test_two_workers_running_one_trial_id_keep_to_their_own_cgroups(tmp_path: Path) -> None:
    """Trial ids repeat across runs: two workers on one machine (each its own work dir, one
    cgroup) run trial "t" at once; the end of one's exec (its sweep) and its stop must not
    reach the other's processes."""
    import asyncio

    a, b = LocalBackend(settings_for(tmp_path / "a")), LocalBackend(settings_for(tmp_path / "b"))
    box_a = await start(a, make_task(tmp_path / "task-a"))
    box_b = await start(b, make_task(tmp_path / "task-b"))
    try:
        assert box_a.spec.trial_id == box_b.spec.trial_id
        slow = asyncio.ensure_future(sh(a, box_a, "sleep 3; echo alive"))
        await asyncio.sleep(1)
        await sh(b, box_b, "sleep 60 & echo started")  # swept (killed) as the exec ends
        await b.stop(box_b)
        result = await slow
        assert result.exit_code == 0 and result.output.strip() == b"alive", result
    finally:
        await b.stop(box_b)
        await a.stop(box_a)


async def test_orphans_of_dead_workers_are_removed_live_ones_kept(backend: LocalBackend, sandbox: Sandbox) -> None:
    import asyncio

    from services.sandbox.backends.limits import PhaseCgroup

    orphan = backend.settings.work_dir / "dead-trial-1234"
    orphan.mkdir(parents=True)
    (orphan / ".owner").touch()
    group = PhaseCgroup.create(backend.cgroup_support, f"{cgroup_prefix(orphan)}agent-0", 64, 16)
    joins = "".join(f"echo $$ > {p}; " for p in group.procs_files())
    leftover = await asyncio.create_subprocess_exec("/bin/sh", "-c", f"{joins}exec sleep 300")
    try:
        for _ in range(200):
            if not group.paths or leftover.pid in group.pids_alive():
                break
            await asyncio.sleep(0.01)
        assert await backend.cleanup_orphans() == 1
        assert not orphan.exists() and sandbox.spec.dirs.root.exists()
        if group.paths:
            assert await asyncio.wait_for(leftover.wait(), 5) == -9
    finally:
        if leftover.returncode is None:
            leftover.kill()
            await leftover.wait()


@pytest.fixture
def host_server() -> Iterator[int]:
    """Something on the host's network the sandbox must (or may) not reach."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.mark.parametrize(
    "toml",
    [
        '[environment]\nnetwork_mode = "public"\n',
        '[environment]\nnetwork_mode = "no-network"\n',
        "[environment]\nallow_internet = false\n",
    ],
)
async def test_setup_network_is_the_builds_whatever_the_task_says(
    backend: LocalBackend, tmp_path: Path, host_server: int, toml: str
) -> None:
    """As in Harbor, network_mode / allow_internet govern the running phases, not the build."""
    probe = (
        f"curl -s -o /dev/null --max-time 3 http://127.0.0.1:{host_server}/ && echo up > net.txt || echo down > net.txt"
    )
    task = make_task(tmp_path / "tasks", toml=toml, dockerfile=f"FROM x\nWORKDIR /app\nRUN {probe}\n")
    box = await start(backend, task)
    try:
        assert (box.spec.dirs.workspace / "net.txt").read_text() == "up\n"
    finally:
        await backend.stop(box)


@pytest.mark.parametrize(
    ("verify_network", "network", "reachable"),
    [
        ("host", Network.PUBLIC, True),
        ("host", Network.NONE, False),
        ("none", Network.PUBLIC, False),
        ("auto", Network.PUBLIC, False),
    ],
    ids=["host-public", "host-none", "none-public", "default-public"],
)
async def test_verify_network_follows_the_request_and_the_setting(
    tmp_path: Path, host_server: int, verify_network: str, network: Network, reachable: bool
) -> None:
    """A verifier runs the agent's code: the host's network (and its loopback services)
    only where [sandbox.local] verify_network = 'host' says so; otherwise none (the default,
    'auto', refuses a public verifier's trial before any exec: test_sandbox_verifier_identity.py)."""
    if verify_network == "auto":
        assert LocalBackendSettings().verify_network == "auto"  # the default
    backend = LocalBackend(settings_for(tmp_path, local=LocalBackendSettings(verify_network=verify_network)))
    sandbox = await start(backend, make_task(tmp_path / "tasks"))
    probe = f"curl -s -o /dev/null --max-time 3 http://127.0.0.1:{host_server}/ && echo up || echo down"
    request = ExecRequest(
        argv=["/bin/bash", "-c", probe],
        phase=Phase.VERIFY,
        timeout_s=20,
        network=network,
        env={"PATH": "/usr/bin:/bin"},
    )
    try:
        result = await backend.exec(sandbox, request)
    finally:
        await backend.stop(sandbox)
    assert result.output.decode().strip() == ("up" if reachable else "down")


async def test_cpu_quota_from_the_task(backend: LocalBackend) -> None:
    from services.sandbox.backends.limits import PhaseCgroup

    if backend.cgroup_support.cpu is None:
        pytest.skip("no writable cpu cgroup here")
    group = PhaseCgroup.create(backend.cgroup_support, "cpu-quota-test", 64, 16, cpus=0.5)
    try:
        assert group.cpu is not None
        assert (group.cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert str(group.cpu / "cgroup.procs") in group.procs_files()
    finally:
        group.remove()
