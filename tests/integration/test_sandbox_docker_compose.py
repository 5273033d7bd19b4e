"""A multi-container task (environment/docker-compose.yaml) on a real Docker engine: the
services start with the sandbox in one network namespace and are reachable by name;
oracle 1, no-op 0; nothing left after a trial or after a killed worker's reap; the
agent reaches the services (as Harbor intends) and the model proxy, never the host."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from harnessrl.localservers import DockerEngine
from services.sandbox.backends.base import ExecRequest, Limits, Network, Phase, Sandbox, SandboxSpec
from services.sandbox.backends.docker import LABEL_MANAGED, LABEL_TRIAL, DockerBackend
from services.sandbox.backends.local import LocalBackend
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import TrialDirs
from services.sandbox.common.settings import DockerBackendSettings
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec
from services.sandbox.trial.runner import TrialRunner
from tests.sandbox_support import make_task, settings_for

# A key-value sidecar built from the task (HTTP, stdlib only): GET / returns what was PUT.
SERVER = """\
import http.server, sys
value = b"empty"
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(value)
    def do_PUT(self):
        global value
        value = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(204); self.end_headers()
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
COMPOSE = """\
services:
  main:
    build:
      context: ./app
      args: {GREETING: "${GREETING:-hello}"}
    depends_on:
      kv:
        condition: service_healthy
    environment:
      KV_URL: http://kv:${KV_PORT:-5000}/
  kv:
    build:
      context: ./kv
    command: ["python3", "/srv/server.py", "${KV_PORT:-5000}"]
    expose: ["${KV_PORT:-5000}"]
    healthcheck:
      test: ["CMD", "python3", "-c", "import socket; socket.create_connection(('localhost', ${KV_PORT:-5000}), 2)"]
      interval: 300ms
      timeout: 5s
      retries: 60
  static:
    image: python:3.11-slim
    depends_on: [kv]
    working_dir: /srv
    entrypoint: ["python3", "-m", "http.server", "--bind", "127.0.0.1"]
    command: ["${STATIC_PORT:-6000}"]
"""
MAIN_DOCKERFILE = "FROM python:3.11-slim\nARG GREETING\nWORKDIR /app\nCOPY seed.txt .\nRUN echo $GREETING > greeting\n"
PUT = "import os, urllib.request as u; u.urlopen(u.Request(os.environ['KV_URL'], b'solved', method='PUT'))"
GET = "import urllib.request as u; print(u.urlopen('http://kv:5000/').read().decode())"
TEST_SH = f"""\
#!/bin/bash
if [ "$(python3 -c "{GET}")" = solved ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def compose_task(root: Path, compose: str = COMPOSE, *, toml: str | None = None, test_sh: str = TEST_SH) -> Path:
    task = make_task(
        root,
        "kv",
        toml=toml,
        context={
            "app/Dockerfile": MAIN_DOCKERFILE,
            "app/seed.txt": "seed\n",
            "kv/Dockerfile": "FROM python:3.11-slim\nCOPY server.py /srv/server.py\n",
            "kv/server.py": SERVER,
        },
        test_sh=test_sh,
        solve_sh=f'#!/bin/bash\npython3 -c "{PUT}"\n',
    )
    (task / "environment" / "Dockerfile").unlink()  # main's image is the compose file's build
    (task / "environment" / "docker-compose.yaml").write_text(compose)
    return task


@pytest.fixture
def backend(tmp_path: Path, docker_engine: DockerEngine) -> DockerBackend:
    return DockerBackend(
        settings_for(
            tmp_path, backend="docker", docker=DockerBackendSettings(host=docker_engine.host, verify_network="none")
        )
    )


def trial_containers(backend: DockerBackend, trial_id: str) -> list[str]:
    found = backend.client.containers.list(all=True, filters={"label": f"{LABEL_TRIAL}={trial_id}"})
    return [c.name for c in found]


async def start(backend: DockerBackend | LocalBackend, task_dir: Path, name: str = "c") -> Sandbox:
    spec = SandboxSpec(
        trial_id=f"{name}-{time.monotonic_ns() % 10**9}",
        task=load_task(task_dir),
        dirs=TrialDirs(backend.settings.work_dir / name),
        limits=Limits(memory_mb=256, storage_mb=64, pids=64),
    )
    return await backend.start(spec)


async def sh(backend: DockerBackend, box: Sandbox, script: str, phase: Phase = Phase.AGENT, **kw: Any) -> str:
    request = ExecRequest(argv=["/bin/bash", "-c", script], phase=phase, env=dict(box.env), timeout_s=30, **kw)
    result = await backend.exec(box, request)
    return result.output.decode()


async def test_oracle_reaches_the_sidecar_by_name_and_scores_1_nop_0(backend: DockerBackend, tmp_path: Path) -> None:
    task = compose_task(tmp_path / "tasks")
    runner = TrialRunner(backend.settings, backend)
    oracle = await runner.run(TrialSpec(trial_id="cp-oracle", task_path=str(task), harness="oracle"))
    nop = await runner.run(TrialSpec(trial_id="cp-nop", task_path=str(task), harness="nop"))
    assert (oracle.termination_reason, oracle.reward) == (TerminationReason.COMPLETED, 1.0), oracle.error
    assert (nop.termination_reason, nop.reward) == (TerminationReason.COMPLETED, 0.0), nop.error
    # Every container of both trials (holder, sidecars, agent's, verifier's) is gone.
    assert trial_containers(backend, "cp-oracle") == [] and trial_containers(backend, "cp-nop") == []


async def test_agent_reaches_services_and_the_proxy_only(backend: DockerBackend, tmp_path: Path) -> None:
    """Harbor's services share a network with main, so the agent reaches them by name (the
    cookbook's simulated-user and api-server tasks need it); the host and the internet stay out."""
    host_server = socket.create_server(("127.0.0.1", 0))
    port = host_server.getsockname()[1]
    sock = tmp_path / "proxy.sock"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nproxy")
        await writer.drain()
        writer.close()

    proxy = await asyncio.start_unix_server(answer, path=str(sock))
    box = await start(backend, compose_task(tmp_path / "tasks"))
    box.spec = box.spec.model_copy(update={"proxy_socket": sock})
    connect = (
        "import socket, sys; s = socket.socket(); s.settimeout(2); print(s.connect_ex((sys.argv[1], int(sys.argv[2]))))"
    )
    script = f"""
    id -u; ls /sys/class/net | tr '\\n' ' '; echo
    getent hosts kv static main | awk '{{print $1}}' | sort -u | tr '\\n' ' '; echo
    python3 -c "{GET}"
    python3 -c "import urllib.request as u; print(u.urlopen('http://static:6000/').status)"
    python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:4100/v1').read().decode())"
    python3 -c "{connect}" 127.0.0.1 {port}
    python3 -c "{connect}" 1.1.1.1 80 2>&1 | tail -1
    echo "$KV_URL"
    cat /app/greeting /app/seed.txt
    """
    try:
        out = (await sh(backend, box, script, network=Network.PROXY_ONLY, proxy_port=4100)).split("\n")
    finally:
        host_server.close()
        proxy.close()
        await backend.stop(box)
    assert out[0] == "1000" and out[1].split() == ["lo"], out
    assert out[2].split() == ["127.0.0.1"], "every service name is the shared loopback"
    assert out[3:6] == ["empty", "200", "proxy"], out
    assert out[6] != "0", "the host's loopback is not the sandbox's"
    assert out[7] != "0" and out[8] == "http://kv:5000/", out
    assert out[9:11] == ["hello", "seed"], "main's image is the compose file's build (context, args)"
    assert trial_containers(backend, box.spec.trial_id) == []


async def test_a_killed_workers_services_are_reaped(backend: DockerBackend, tmp_path: Path) -> None:
    task = compose_task(tmp_path / "tasks")
    script = textwrap.dedent(f"""
        import asyncio
        from pathlib import Path
        from services.sandbox.backends.base import Limits, SandboxSpec
        from services.sandbox.backends.docker import DockerBackend
        from services.sandbox.common.paths import TrialDirs
        from services.sandbox.common.settings import DockerBackendSettings
        from services.sandbox.task.model import load_task
        from tests.sandbox_support import settings_for

        async def main():
            tmp = Path({str(tmp_path / "worker")!r})
            docker = DockerBackendSettings(host={backend.cfg.host!r}, verify_network="none")
            backend = DockerBackend(settings_for(tmp, backend="docker", docker=docker))
            task = load_task({str(task)!r})
            spec = SandboxSpec(trial_id="cp-orphan", task=task, dirs=TrialDirs(tmp / "t"), limits=Limits())
            await backend.start(spec)
            print("started", flush=True)
            await asyncio.sleep(600)

        asyncio.run(main())
    """)
    worker = await asyncio.create_subprocess_exec(sys.executable, "-c", script, stdout=subprocess.PIPE, cwd=os.getcwd())
    try:
        assert worker.stdout is not None
        line = await asyncio.wait_for(worker.stdout.readline(), 180)
        assert line.strip() == b"started"
        assert len(trial_containers(backend, "cp-orphan")) == 4, "holder, two sidecars, the agent's"
    finally:
        worker.send_signal(signal.SIGKILL)
        await worker.wait()
    assert await backend.cleanup_orphans() >= 4
    assert trial_containers(backend, "cp-orphan") == []


async def test_a_service_that_never_gets_healthy_fails_setup_naming_it(backend: DockerBackend, tmp_path: Path) -> None:
    broken = COMPOSE.replace("socket.create_connection(('localhost', ${KV_PORT:-5000}), 2)", "raise SystemExit(1)")
    broken = broken.replace("retries: 60", "retries: 2")
    with pytest.raises(EnvSetupError, match=r"docker-compose.yaml: services.kv.healthcheck: the service is unhealthy"):
        await start(backend, compose_task(tmp_path / "tasks", broken), "bad")
    managed = backend.client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"})
    assert [c for c in managed if c.labels.get(LABEL_TRIAL, "").startswith("bad-")] == []


async def test_a_sidecar_on_a_missing_base_image_fails_setup_naming_it(backend: DockerBackend, tmp_path: Path) -> None:
    """As a main build says it: a sidecar whose FROM the engine lacks (and cannot pull) names
    that image, not only the engine's registry error (the cookbook's python:3.12-slim sidecars)."""
    task = compose_task(tmp_path / "tasks")
    (task / "environment" / "kv" / "Dockerfile").write_text("FROM harnessrl-absent:3.12-slim\nCOPY server.py /srv/\n")
    with pytest.raises(
        EnvSetupError,
        match=r"services.kv.build: docker build failed: .*base image harnessrl-absent:3.12-slim: not present",
    ):
        await start(backend, task, "nobase")


async def test_the_local_backend_refuses_a_compose_task_naming_the_file(tmp_path: Path) -> None:
    local = LocalBackend(settings_for(tmp_path))
    with pytest.raises(EnvSetupError, match=r"environment/docker-compose.yaml: the local backend runs one sandbox"):
        await start(local, compose_task(tmp_path / "tasks"), "local")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_public_verifier_gets_its_network_and_the_services_by_name(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """Harbor's verifier has the task's network and the compose network at once: here its
    container is on verify_network (the host's, the tests' stand-in internet) and the worker
    relays each service port into it, the names mapped to its loopback."""
    internet = socket.create_server(("127.0.0.1", 0))
    internet.listen()
    kv_port, static_port = free_port(), free_port()
    toml = (
        'schema_version = "1.4"\n[task]\nname = "test/{name}"\n[verifier]\ntimeout_sec = 60\n'
        f'[environment]\nenv = {{{{ KV_PORT = "{kv_port}", STATIC_PORT = "{static_port}" }}}}\n'
    )
    get = f"import urllib.request as u; print(u.urlopen('http://kv:{kv_port}/').read().decode())"
    probe = f"import socket; print(socket.create_connection(('127.0.0.1', {internet.getsockname()[1]}), 2) and 'net')"
    test_sh = f"""#!/bin/bash
{{ python3 -c "{get}"; python3 -c "{probe}"; }} > /logs/verifier/seen.txt 2>&1
seen=$(tr '\\n' ' ' < /logs/verifier/seen.txt)
if [ "$seen" = "solved net " ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
    task = compose_task(tmp_path / "tasks", toml=toml, test_sh=test_sh)
    solve = f"import urllib.request as u; u.urlopen(u.Request('http://kv:{kv_port}/', b'solved', method='PUT'))"
    (task / "solution" / "solve.sh").write_text(f'#!/bin/bash\npython3 -c "{solve}"\n')
    docker = DockerBackendSettings(host=docker_engine.host, verify_network="host")
    backend = DockerBackend(settings_for(tmp_path, backend="docker", docker=docker))
    try:
        oracle = await TrialRunner(backend.settings, backend).run(
            TrialSpec(trial_id="cp-public", task_path=str(task), harness="oracle")
        )
    finally:
        internet.close()
    assert (oracle.termination_reason, oracle.reward) == (TerminationReason.COMPLETED, 1.0), oracle.error
    assert trial_containers(backend, "cp-public") == []
    for port in (kv_port, static_port):  # the relays closed with the trial
        with socket.socket() as again:
            assert again.connect_ex(("127.0.0.1", port)) != 0


# Harbor's Terminal-Bench mapper's main service (harbor 0.26) and a sidecar on ${MAIN_IMAGE_NAME}.
HARBOR_VARS = """\
services:
  main:
    build: {context: "${CONTEXT_DIR}"}
    image: ${MAIN_IMAGE_NAME}
    command: ["sh", "-c", "sleep infinity"]
    environment: ["TEST_DIR=${TEST_DIR}", "LOGS=${ENV_VERIFIER_LOGS_PATH}"]
    deploy: {resources: {limits: {cpus: "${CPUS}", memory: "${MEMORY}"}}}
  twin:
    image: ${MAIN_IMAGE_NAME}
    working_dir: /app
    entrypoint: ["python3", "-m", "http.server", "--bind", "127.0.0.1", "7000"]
"""


async def test_harbors_compose_variables_on_a_real_engine(backend: DockerBackend, tmp_path: Path) -> None:
    """main as Harbor's mapper writes it builds and runs; the sidecar on ${MAIN_IMAGE_NAME} runs
    the trial's own image (it serves main's /app/seed.txt); main sees Harbor's paths."""
    from tests.sandbox_support import DEFAULT_TOML

    task = make_task(
        tmp_path / "tasks",
        "vars",
        toml=DEFAULT_TOML + "cpus = 1\n",
        dockerfile="FROM python:3.11-slim\nWORKDIR /app\nCOPY seed.txt .\n",
        context={"seed.txt": "from main's image\n"},
    )
    (task / "environment" / "docker-compose.yaml").write_text(HARBOR_VARS)
    box = await start(backend, task, "vars")
    try:
        fetch = "import urllib.request as u; print(u.urlopen('http://twin:7000/seed.txt').read().decode(), end='')"
        for _ in range(50):  # the sidecar has no healthcheck: started is all compose promises
            out = await sh(backend, box, f'python3 -c "{fetch}" 2>/dev/null; echo "$TEST_DIR $LOGS"')
            if out.startswith("from main"):
                break
            await asyncio.sleep(0.2)
        assert out == "from main's image\n/tests /logs/verifier\n", out
    finally:
        await backend.stop(box)
