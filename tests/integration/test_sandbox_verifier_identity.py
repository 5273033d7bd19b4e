"""The verifier runs as Harbor runs it (issue 38): as the task's user (the image's USER,
root for most images) with the network the task's verifier settings ask for, while
the agent keeps uid 1000 and no network but the proxy. Real trials on the local
backend (bubblewrap) and on a real Docker engine; the "internet" is an HTTP server
on the host's loopback that only a verify phase with network may reach."""

from __future__ import annotations

import http.server
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from harnessrl.localservers import DockerEngine
from services.sandbox.backends.docker import LABEL_TRIAL, LABEL_VERIFY, LABEL_WORKER, DockerBackend
from services.sandbox.common.errors import BackendUnavailable
from services.sandbox.common.settings import DockerBackendSettings, IntegrityPolicy, LocalBackendSettings
from services.sandbox.factory import create_backend
from services.sandbox.trial.lifecycle import TerminationReason, TrialOutcome, TrialSpec
from services.sandbox.trial.runner import TrialRunner
from tests.sandbox_support import make_task, settings_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

DOCKERFILE = "FROM python:3.11-slim\nWORKDIR /app\nCOPY README.md /app/README.md\n"
REACH = "python3 -c \"import os, urllib.request as u; u.urlopen(os.environ['PROBE_URL'], timeout=3)\" 2>/dev/null"
# The agent records who it was and whether it reached the host server, then does the task.
AGENT = f"""id -u > /app/agent_uid
PROBE_URL=$PROBE_URL {REACH} && echo up > /app/agent_net || echo down > /app/agent_net
echo hello > /app/hello.txt
"""
# The verifier reports every fact as a reward key (reward.json keeps them all).
REPORT_SH = f"""#!/bin/bash
flag() {{ if "$@"; then echo 1; else echo 0; fi; }}
reach() {{ {REACH}; }}
hello=$(flag test "$(cat /app/hello.txt 2>/dev/null)" = hello)
root=$(flag test "$(id -u)" = 0)
net=$(flag reach)
agent_1000=$(flag test "$(cat /app/agent_uid)" = 1000)
agent_net=$(flag test "$(cat /app/agent_net)" = up)
home=$(flag test "$HOME" = /root -o "$(id -u)" != 0)  # root's HOME is root's own, as in Harbor's docker
printf '{{"reward": %s, "root": %s, "net": %s, "agent_1000": %s, "agent_net": %s, "home": %s}}' \\
  "$hello" "$root" "$net" "$agent_1000" "$agent_net" "$home" > /logs/verifier/reward.json
"""
# Terminal-Bench's shape: test.sh needs root (a root-only path, as apt-get's lock) and network.
TB_TEST_SH = f"""#!/bin/bash
set -u
fail() {{ echo "FAIL: $1"; echo 0 > /logs/verifier/reward.txt; exit 0; }}
[ "$(id -u)" = 0 ] || fail "not root"
echo graded > /root/graded && echo graded > /etc/harnessrl-graded || fail "root-only paths"
{REACH} || fail "no network"
[ "$(cat /app/hello.txt 2>/dev/null)" = hello ] || fail "no hello"
echo 1 > /logs/verifier/reward.txt
"""


@pytest.fixture(scope="module")
def host_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    thread.join()


# The "internet" here is a server on the host's loopback, which a public verifier reaches
# only on the host's network: the tests of a verifier with network opt in to it, as a
# worker host with nothing on its loopback to keep from the agent's code would.
def host_network(backend: str, engine: DockerEngine | None = None) -> dict[str, object]:
    if backend == "docker":
        assert engine is not None
        return {"backend": "docker", "docker": DockerBackendSettings(host=engine.host, verify_network="host")}
    return {"backend": "local", "local": LocalBackendSettings(verify_network="host")}


@pytest.fixture(params=["local", "docker"])
def kind(request: pytest.FixtureRequest) -> dict[str, object]:
    engine = request.getfixturevalue("docker_engine") if request.param == "docker" else None
    return host_network(request.param, engine)


def task(
    root: Path, port: int, verifier: str = "", environment: str = "", test_sh: str = REPORT_SH, storage_mb: int = 64
) -> Path:
    toml = (
        f'schema_version = "1.4"\n[task]\nname = "test/{{name}}"\n[verifier]\ntimeout_sec = 60\n{verifier}'
        f'[verifier.env]\nPROBE_URL = "http://127.0.0.1:{port}/"\n'
        f"[environment]\nmemory_mb = 512\nstorage_mb = {storage_mb}\n{environment}"
        f'[environment.env]\nPROBE_URL = "http://127.0.0.1:{port}/"\n'
    )
    return make_task(root, "who", toml=toml, dockerfile=DOCKERFILE, context={"README.md": "r\n"}, test_sh=test_sh)


async def run(tmp: Path, task_dir: Path, kind: dict[str, object], harness: str = "shell") -> TrialOutcome:
    settings = settings_for(tmp, cache_dir=tmp / "cache", **kind)  # type: ignore[arg-type]
    spec = TrialSpec(
        trial_id=f"vi-{uuid.uuid4().hex[:10]}",
        task_path=str(task_dir),
        harness=harness,
        harness_options={"script": AGENT} if harness == "shell" else {},
    )
    return await TrialRunner(settings, create_backend(settings)).run(spec)


@pytest.mark.parametrize(
    ("verifier", "environment", "root", "net"),
    [
        ("", "", 1, 1),  # Harbor's defaults: the image's USER (root), [environment] network_mode = "public"
        ("", 'network_mode = "no-network"\n', 1, 0),  # inherited by the verifier, as in Harbor
        ('user = "1000"\nnetwork_mode = "no-network"\n', 'network_mode = "public"\n', 0, 0),  # [verifier] wins
    ],
    ids=["defaults", "environment-no-network", "verifier-user-and-network"],
)
async def test_the_verifier_runs_as_harbor_runs_it_and_the_agent_as_before(
    tmp_path: Path, host_server: int, kind: dict[str, object], verifier: str, environment: str, root: int, net: int
) -> None:
    outcome = await run(tmp_path, task(tmp_path, host_server, verifier, environment), kind)
    assert outcome.termination_reason == TerminationReason.COMPLETED, outcome
    # The agent: uid 1000 and no host network, whatever the verifier gets.
    expected = {"reward": 1.0, "root": root, "net": net, "agent_1000": 1.0, "agent_net": 0.0, "home": 1.0}
    if kind["backend"] == "local":
        expected["home"] = float(not root)  # local has no /root: a fresh HOME per exec
    assert outcome.rewards == expected, outcome.verifier_summary


@pytest.mark.parametrize("backend", ["local", "docker"])
async def test_a_public_verifier_without_a_network_is_refused_never_scored(
    tmp_path: Path, host_server: int, backend: str, request: pytest.FixtureRequest
) -> None:
    """A task's public verifier gets the engine's bridge network where there is one (this engine
    has none), never the host's, whose loopback holds the worker's Redis, proxy and capture store.
    Where verify_network 'auto' finds no network to give (the default of both: docker's on this
    engine, local's always), the trial is refused at start naming the setting: its verifier could
    fail to fetch its test tools and score 0 (invariant 5). An explicit 'none' verifies without one."""
    if backend == "docker":
        engine = request.getfixturevalue("docker_engine")
        auto: dict[str, object] = {"backend": "docker", "docker": DockerBackendSettings(host=engine.host)}
        none: dict[str, object] = {
            "backend": "docker",
            "docker": DockerBackendSettings(host=engine.host, verify_network="none"),
        }
        setting = "[sandbox.docker] verify_network = 'auto'"
    else:
        assert LocalBackendSettings().verify_network == "auto"  # the default, as docker's
        auto = {"backend": "local", "local": LocalBackendSettings()}
        none = {"backend": "local", "local": LocalBackendSettings(verify_network="none")}
        setting = "[sandbox.local] verify_network = 'auto' (the default)"
    refused = await run(tmp_path / "auto", task(tmp_path / "auto", host_server), auto)
    assert refused.termination_reason == TerminationReason.ENV_SETUP_FAILED, refused
    assert refused.reward is None and setting in refused.error and "network_mode = 'no-network'" in refused.error
    # A task that says its verifier needs no network runs all the same.
    quiet = task(tmp_path / "quiet", host_server, verifier='network_mode = "no-network"\n')
    assert (await run(tmp_path / "quiet", quiet, auto)).termination_reason == TerminationReason.COMPLETED
    outcome = await run(tmp_path / "none", task(tmp_path / "none", host_server), none)
    assert outcome.termination_reason == TerminationReason.COMPLETED, outcome
    assert outcome.rewards["root"] == 1.0 and outcome.rewards["net"] == 0.0, outcome.verifier_summary


async def test_a_terminal_bench_style_task_scores_oracle_1_and_nop_0_on_docker(
    tmp_path: Path, host_server: int, docker_engine: DockerEngine
) -> None:
    kind = host_network("docker", docker_engine)
    task_dir = task(tmp_path, host_server, test_sh=TB_TEST_SH)
    oracle = await run(tmp_path, task_dir, kind, "oracle")
    nop = await run(tmp_path, task_dir, kind, "nop")
    assert (oracle.termination_reason, oracle.reward) == (TerminationReason.COMPLETED, 1.0), oracle.verifier_summary
    assert (nop.termination_reason, nop.reward) == (TerminationReason.COMPLETED, 0.0), nop.verifier_summary
    assert "no hello" in nop.verifier_summary


@pytest.mark.parametrize(
    ("verifier", "environment", "fragment"),
    [
        ('network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', "", "[verifier] network_mode = 'allowlist'"),
        ("", 'network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', "[environment] network_mode = 'allowlist'"),
    ],
)
async def test_an_allowlist_verifier_fails_setup_by_name(
    tmp_path: Path, verifier: str, environment: str, fragment: str
) -> None:
    outcome = await run(tmp_path, task(tmp_path, 9, verifier, environment), {"backend": "local"})
    assert outcome.termination_reason == TerminationReason.ENV_SETUP_FAILED
    assert fragment in outcome.error and "egress proxy" in outcome.error
    assert outcome.timings.agent_s == 0 and not list((tmp_path / "trials").glob("*/workspace"))


async def test_a_verifier_user_local_cannot_be_fails_setup_by_name(tmp_path: Path) -> None:
    outcome = await run(tmp_path, task(tmp_path, 9, 'user = "app"\n'), {"backend": "local"})
    assert outcome.termination_reason == TerminationReason.ENV_SETUP_FAILED
    assert "[verifier] user = 'app'" in outcome.error and "docker backend" in outcome.error


APT_SH = """#!/bin/bash
if apt-get update > /logs/verifier/apt.log 2>&1; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


@pytest.mark.slow
async def test_apt_get_update_runs_in_a_root_verifier_with_network_on_docker(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """The issue's own failure: Terminal-Bench's test.sh begins with apt-get as root (over
    http: this machine's build network reaches the Debian mirror, so does a host-network verifier)."""
    kind = host_network("docker", docker_engine)
    outcome = await run(tmp_path, task(tmp_path, 9, test_sh=APT_SH, storage_mb=1024), kind, "nop")
    assert (outcome.termination_reason, outcome.reward) == (TerminationReason.COMPLETED, 1.0), (
        outcome.error,
        outcome.events,
    )


async def test_a_root_verifiers_timeout_is_a_verifier_timeout_and_nothing_is_left_on_docker(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """Its kill (as root: every process of the fresh container) ends it as verifier_timeout;
    at stop the verifier's container and the commit it ran are gone."""
    import docker

    kind = {"backend": "docker", "docker": DockerBackendSettings(host=docker_engine.host, verify_network="none")}
    slow = "#!/bin/bash\nsleep 600 &\nsleep 600\n"
    task_dir = task(tmp_path, 9, verifier="", test_sh=slow)
    toml = (task_dir / "task.toml").read_text().replace("timeout_sec = 60", "timeout_sec = 2")
    (task_dir / "task.toml").write_text(toml)
    outcome = await run(tmp_path, task_dir, kind, "nop")
    assert outcome.termination_reason == TerminationReason.VERIFIER_TIMEOUT, outcome.error
    client = docker.DockerClient(base_url=docker_engine.host)
    try:
        label = {"label": f"{LABEL_TRIAL}={outcome.artifacts_dir.rsplit('/', 1)[-1]}"}
        assert client.containers.list(all=True, filters=label) == []
        assert client.images.list(filters={"label": f"{LABEL_VERIFY}=true"}) == []
    finally:
        client.close()


def test_a_verify_network_the_engine_lacks_is_refused_at_start(tmp_path: Path, docker_engine: DockerEngine) -> None:
    settings = settings_for(
        tmp_path, backend="docker", docker=DockerBackendSettings(host=docker_engine.host, verify_network="nope")
    )
    with pytest.raises(BackendUnavailable, match=r"\[sandbox.docker\] verify_network = 'nope'"):
        DockerBackend(settings)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: DockerBackendSettings(verify_network=""), "verify_network"),
        (lambda: IntegrityPolicy(guard_verifier_path="sometimes"), "guard_verifier_path"),  # type: ignore[arg-type]
    ],
)
def test_malformed_settings_name_the_field(build: Callable[[], object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        build()


async def test_a_dead_workers_verifier_commit_is_reaped(tmp_path: Path, docker_engine: DockerEngine) -> None:
    import socket

    import docker

    settings = settings_for(
        tmp_path, backend="docker", docker=DockerBackendSettings(host=docker_engine.host, verify_network="none")
    )
    backend = DockerBackend(settings)
    client = docker.DockerClient(base_url=docker_engine.host)
    dead = f"{socket.gethostname()}:{2**22 + 7}:0"  # this host, a pid no process has
    live = DockerBackend.__module__  # any other value: not this host's dead worker
    images: list[str] = []
    try:
        for worker in (dead, live):
            box = client.containers.create("debian:bookworm-slim", ["true"], network_mode="none")
            labels = {LABEL_VERIFY: "true", LABEL_WORKER: worker}
            images.append(box.commit(conf={"Labels": labels}).id)
            box.remove(force=True)
        await backend.cleanup_orphans()
        left = {image.id for image in client.images.list(filters={"label": f"{LABEL_VERIFY}=true"})}
        assert images[0] not in left and images[1] in left
    finally:
        for image_id in images[1:]:
            client.images.remove(image_id, force=True)  # the live worker's: its own to remove
        client.close()


# The cookbook's dns-blacklisting shape: the image's ENTRYPOINT starts a service on a port
# below 1024 in the background and execs its command; solve.sh and test.sh both query it.
PORT80_DOCKERFILE = """\
FROM python:3.11-slim
WORKDIR /app
COPY README.md /app/README.md
COPY srv/ /srv/
COPY entrypoint.sh /entrypoint.sh
RUN chmod 755 /entrypoint.sh
ENTRYPOINT ["/entrypoint.sh"]
"""
PORT80_ENTRYPOINT = """\
#!/bin/sh
(cd /srv && exec python3 -m http.server 80 --bind 127.0.0.1) > /dev/null 2>&1 &
exec "$@"
"""
GET80 = (
    "import time, urllib.request as u; time.sleep(1); "
    "print(u.urlopen('http://127.0.0.1/a.txt', timeout=5).read().decode())"
)
PORT80_TEST = f"""#!/bin/bash
served=$(python3 -c "{GET80}" 2>&1)
if [ "$served" = forty-two ] && [ "$(cat /app/answer.txt 2>/dev/null)" = "$served" ]; then echo 1; else echo 0; fi \\
  > /logs/verifier/reward.txt
echo "served: $served"
"""


async def test_the_verifier_has_the_images_entrypoint_services_on_docker(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """Harbor verifies in the agent's container, where the ENTRYPOINT's services still run; the
    verifier's fresh container here runs the image's ENTRYPOINT again, in its own network
    namespace, so a service on port 80 answers the verifier too: oracle 1, nop 0."""
    kind = {"backend": "docker", "docker": DockerBackendSettings(host=docker_engine.host, verify_network="none")}
    task_dir = make_task(
        tmp_path / "tasks",
        "port80",
        dockerfile=PORT80_DOCKERFILE,
        context={"entrypoint.sh": PORT80_ENTRYPOINT, "srv/a.txt": "forty-two"},
        test_sh=PORT80_TEST,
        solve_sh=f'#!/bin/bash\npython3 -c "{GET80}" > /app/answer.txt\n',
    )
    oracle = await run(tmp_path / "o", task_dir, kind, "oracle")
    assert (oracle.termination_reason, oracle.reward) == (TerminationReason.COMPLETED, 1.0), oracle.verifier_summary
    nop = await run(tmp_path / "n", task_dir, kind, "nop")
    assert (nop.termination_reason, nop.reward) == (TerminationReason.COMPLETED, 0.0), nop.verifier_summary
    assert "served: forty-two" in nop.verifier_summary  # the service answered the verifier all the same
