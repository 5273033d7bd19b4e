"""The Docker backend against a real engine (a private dockerd started by the
session's ``docker_engine`` fixture, no bridge, offline base images): the
task's own image, isolation, limits, cancellation, faults and orphans."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from harnessrl.localservers import DockerEngine
from services.sandbox.backends.base import ExecRequest, Limits, Network, Phase, Sandbox, SandboxSpec
from services.sandbox.backends.docker import LABEL_MANAGED, LABEL_TRIAL, LABEL_WORKER, DockerBackend
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import TrialDirs
from services.sandbox.common.settings import DockerBackendSettings
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec
from services.sandbox.trial.runner import TrialRunner
from tests.sandbox_support import make_task, settings_for

# The everyday task: a venv RUN, PATH from the base image, pytest verifier.
EVERYDAY = """\
FROM python:3.11-slim
RUN python3 -m venv --system-site-packages /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY repo/ /app/
RUN git init -q -b main && git add -A && git -c user.name=t -c user.email=t@t commit -qm fixed \\
    && sed -i 's/a + b/a - b/' calc.py && git -c user.name=t -c user.email=t@t commit -qam broken
"""
EVERYDAY_TEST = """\
#!/bin/bash
cd /app
if PYTHONPATH=/app python3 -m pytest -q -p no:cacheprovider /tests/test_calc.py > /logs/verifier/pytest.log 2>&1
then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
EVERYDAY_SOLVE = "#!/bin/bash\nmkdir -p notes && cp calc.py notes/ && sed -i 's/a - b/a + b/' calc.py\n"


def everyday_task(root: Path) -> Path:
    return make_task(
        root,
        "everyday",
        dockerfile=EVERYDAY,
        context={"repo/calc.py": "def add(a, b):\n    return a + b\n"},
        test_sh=EVERYDAY_TEST,
        tests={"test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
        solve_sh=EVERYDAY_SOLVE,
    )


@pytest.fixture
def backend(tmp_path: Path, docker_engine: DockerEngine) -> DockerBackend:
    return DockerBackend(
        settings_for(
            tmp_path, backend="docker", docker=DockerBackendSettings(host=docker_engine.host, verify_network="none")
        )
    )


async def start(backend: DockerBackend, task_dir: Path, name: str = "t", **limits: int) -> Sandbox:
    spec = SandboxSpec(
        trial_id=f"{name}-{time.monotonic_ns() % 10**9}",
        task=load_task(task_dir),
        dirs=TrialDirs(backend.settings.work_dir / name),
        limits=Limits(**{"memory_mb": 256, "storage_mb": 64, "pids": 64, **limits}),
    )
    return await backend.start(spec)


async def sh(backend: DockerBackend, box: Sandbox, script: str, phase: Phase = Phase.AGENT, limit_s: float = 20, **kw):
    request = ExecRequest(argv=["/bin/bash", "-c", script], phase=phase, env=dict(box.env), timeout_s=limit_s, **kw)
    return await backend.exec(box, request)


@pytest.fixture
async def box(backend: DockerBackend, tmp_path: Path) -> AsyncIterator[Sandbox]:
    sandbox = await start(backend, everyday_task(tmp_path / "tasks"))
    yield sandbox
    await backend.stop(sandbox)


async def test_everyday_task_scores_its_oracle_and_not_nop(backend: DockerBackend, tmp_path: Path) -> None:
    task = everyday_task(tmp_path / "tasks")
    runner = TrialRunner(backend.settings, backend)
    volumes = {v.id for v in backend.client.volumes.list()}
    oracle = await runner.run(TrialSpec(trial_id="dk-oracle", task_path=str(task), harness="oracle"))
    nop = await runner.run(TrialSpec(trial_id="dk-nop", task_path=str(task), harness="nop"))
    assert (oracle.termination_reason, oracle.reward) == (TerminationReason.COMPLETED, 1.0), oracle.error
    assert (nop.termination_reason, nop.reward) == (TerminationReason.COMPLETED, 0.0), nop.error
    # Each trial's containers (the agent's, the verifier's from its commit) leave no volume behind.
    assert {v.id for v in backend.client.volumes.list()} <= volumes


async def test_image_env_workdir_and_squashed_history(backend: DockerBackend, box: Sandbox) -> None:
    result = await sh(backend, box, "echo $PATH; pwd; which python3; git log --oneline | wc -l; git status --short")
    lines = result.output.decode().splitlines()
    assert lines[0] == "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert lines[1:3] == ["/app", "/opt/venv/bin/python3"]
    assert lines[3] == "1", "one commit: the fix is not in the history"
    assert lines[4:] == [], "the squashed repo is clean"
    git = await sh(backend, box, "git -c user.name=a -c user.email=a@a commit -qm x --allow-empty && echo ok")
    assert git.output.strip() == b"ok", git.output


async def test_isolation(backend: DockerBackend, box: Sandbox) -> None:
    host_server = socket.create_server(("127.0.0.1", 0))
    port = host_server.getsockname()[1]
    script = f"""
    id -u; grep CapEff /proc/self/status | tr -s '\\t ' ' '
    ls /sys/class/net | tr '\\n' ' '; echo
    python3 -c "import socket; s=socket.socket(); s.settimeout(2); print(s.connect_ex(('127.0.0.1', {port})))"
    ls /tests /solution 2>&1 | grep -c 'No such file'
    touch /logs/verifier-x 2>&1 | grep -c 'Permission denied'
    """
    try:
        out = (await sh(backend, box, script)).output.decode().split("\n")
    finally:
        host_server.close()
    assert out[0] == "1000" and out[1] == "CapEff: 0000000000000000"
    assert out[2].split() == ["lo"], "no interface but loopback"
    assert out[3] != "0", "the host's loopback is not the sandbox's"
    assert out[4:6] == ["2", "1"]


async def test_proxy_relay_is_the_only_way_out_and_closes_with_the_phase(
    backend: DockerBackend, box: Sandbox, tmp_path: Path
) -> None:
    sock = tmp_path / "proxy.sock"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nfrom the proxy")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(answer, path=str(sock))
    box.spec = box.spec.model_copy(update={"proxy_socket": sock})
    fetch = "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:4100/v1').read())\""
    try:
        inside = await sh(backend, box, fetch, network=Network.PROXY_ONLY, proxy_port=4100)
        after = await sh(backend, box, fetch + " 2>&1 | tail -1")
    finally:
        server.close()
    assert inside.output.strip() == b"b'from the proxy'", inside.output
    assert b"Connection refused" in after.output


async def test_every_agent_process_dies_before_verify(backend: DockerBackend, box: Sandbox) -> None:
    agent = await sh(backend, box, "setsid sleep 300 & nohup sleep 301 >/dev/null 2>&1 & disown; echo started")
    assert agent.killed_leftovers >= 2 and agent.output.strip() == b"started"
    await backend.prepare_verify(box, "1000", Network.NONE)
    verify = await sh(backend, box, "ps -eo user:12,cmd | grep -c '[s]leep 30'", phase=Phase.VERIFY)
    assert verify.output.strip() == b"0"


async def test_verify_gets_a_fresh_reward_dir_tmp_and_home(backend: DockerBackend, box: Sandbox) -> None:
    await sh(backend, box, "echo planted > /tmp/x; echo planted > ~/.profile; mkdir -p ~/.local && echo 1 > ~/.local/y")
    verify = await sh(backend, box, "ls -A /tmp | wc -l; echo $HOME; ls -A $HOME | wc -l; ls -ld /logs/verifier 2>&1")
    lines = verify.output.decode().split("\n")
    assert lines[0] == "1", "the agent phase's own exec sees its file"
    await backend.prepare_verify(box, "1000", Network.NONE)
    check = await sh(backend, box, "ls -A /tmp | wc -l; echo $HOME; ls -A $HOME | wc -l", phase=Phase.VERIFY)
    assert check.output.decode().split("\n")[:3] == ["0", "/run/harnessrl-verify/home", "0"]


async def test_timeout_and_cancel_kill_mid_exec(backend: DockerBackend, box: Sandbox) -> None:
    timed = await sh(backend, box, "sleep 60 & sleep 60", limit_s=1)
    assert timed.timed_out and timed.duration_s < 10
    cancel = asyncio.Event()
    asyncio.get_running_loop().call_later(0.5, cancel.set)
    started = time.monotonic()
    request = ExecRequest(argv=["sleep", "60"], phase=Phase.AGENT, timeout_s=60)
    cancelled = await backend.exec(box, request, cancel)
    assert time.monotonic() - started < 10 and not cancelled.timed_out and cancelled.exit_code != 0


async def test_output_flood_is_bounded(backend: DockerBackend, box: Sandbox) -> None:
    box.spec = box.spec.model_copy(update={"limits": box.spec.limits.model_copy(update={"output_limit_bytes": 4096})})
    result = await sh(backend, box, "head -c 20000000 /dev/zero | tr '\\0' 'x'; echo END")
    assert result.output_truncated and result.output_bytes > 20_000_000
    assert len(result.output) < 4096 + 100 and result.output.endswith(b"END\n")


async def test_memory_pids_and_disk_limits(backend: DockerBackend, box: Sandbox) -> None:
    hog = await sh(backend, box, "python3 -c 'x = bytearray(1024 * 1024 * 1024); print(len(x))'")
    assert hog.exit_code != 0 and hog.oom_killed, hog
    bomb = await sh(backend, box, "bomb() { bomb | bomb & }; bomb; sleep 2", limit_s=6)
    assert bomb.pids_limit_hit, bomb
    fill = "for i in $(seq 1 100); do head -c 10000000 /dev/zero > /app/f$i || break; done; sleep 10"
    disk = await sh(backend, box, fill, limit_s=30)
    assert disk.disk_exceeded and disk.duration_s < 20, disk


async def test_build_failure_and_missing_image_name_the_cause(backend: DockerBackend, tmp_path: Path) -> None:
    broken = make_task(tmp_path / "a", dockerfile="FROM debian:bookworm-slim\nRUN exit 3\n")
    with pytest.raises(EnvSetupError, match="docker build failed"):
        await start(backend, broken)
    toml = '[task]\nname = "t/img"\n[environment]\ndocker_image = "registry.invalid/nothing:1"\n'
    missing = make_task(tmp_path / "b", toml=toml, dockerfile=None)
    with pytest.raises(EnvSetupError, match=r"registry.invalid/nothing:1.*could not be pulled"):
        await start(backend, missing)
    unknown_base = make_task(tmp_path / "c", dockerfile="FROM harnessrl-test/absent:1\n")
    with pytest.raises(EnvSetupError, match="base-images"):
        await start(backend, unknown_base)


async def test_prebuilt_image_is_used_as_is(backend: DockerBackend, tmp_path: Path) -> None:
    toml = '[task]\nname = "t/img"\n[environment]\ndocker_image = "debian:bookworm-slim"\nworkdir = "/srv"\n'
    box = await start(backend, make_task(tmp_path / "t", toml=toml, dockerfile=None))
    try:
        result = await sh(backend, box, "pwd; cat /etc/debian_version | cut -d. -f1")
        assert result.output.decode().split() == ["/srv", "12"]
    finally:
        await backend.stop(box)


async def test_dead_workers_containers_are_reaped_live_ones_kept(
    backend: DockerBackend, box: Sandbox, docker_engine: DockerEngine
) -> None:
    client = docker.DockerClient(base_url=docker_engine.host)
    dead = f"{socket.gethostname()}:999999:1"
    labels = {LABEL_MANAGED: "true", LABEL_TRIAL: "dead-trial", LABEL_WORKER: dead}
    orphan = client.containers.run(
        "debian:bookworm-slim", ["sleep", "300"], detach=True, labels=labels, network_mode="none"
    )
    assert await backend.cleanup_orphans() == 1
    names = {c.name for c in client.containers.list(all=True)}
    assert orphan.name not in names and box.handle.container.name in names  # type: ignore[attr-defined]


async def test_engine_restart_mid_exec_is_a_lost_sandbox(tmp_path: Path) -> None:
    from services.sandbox.common.errors import SandboxLost

    with DockerEngine() as engine:
        from services.sandbox import baseimages

        client = docker.DockerClient(base_url=engine.host)
        baseimages.ensure_imported(client, baseimages.rootfs(), names=("debian:bookworm-slim",))
        backend = DockerBackend(
            settings_for(
                tmp_path, backend="docker", docker=DockerBackendSettings(host=engine.host, verify_network="none")
            )
        )
        box = await start(backend, make_task(tmp_path / "t"))
        running = asyncio.ensure_future(sh(backend, box, "sleep 60", limit_s=60))
        await asyncio.sleep(1)
        engine.kill()
        with pytest.raises(SandboxLost):
            await asyncio.wait_for(running, 30)
        await backend.stop(box)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "stack.cli", "sandbox", "base-images", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def test_base_images_cli_imports_into_the_engine_and_refuses_a_dead_one(
    docker_engine: DockerEngine, tmp_path: Path
) -> None:
    done = _cli("--docker-host", docker_engine.host)
    assert done.returncode == 0, done.stderr
    assert "python:3.11-slim: present" in done.stdout and "rootfs " in done.stdout
    dead = _cli("--docker-host", f"unix://{tmp_path}/none.sock")
    assert dead.returncode == 2 and "no Docker engine reachable" in dead.stderr
    assert "Traceback" not in dead.stderr
