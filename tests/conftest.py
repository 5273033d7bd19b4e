"""Shared fixtures: real servers on 127.0.0.1 and free ports, and the RPC
contract check (every RPC in the protos is served to some test)."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harnessrl import paths
from harnessrl.localservers import DockerEngine, RedisServer, S3Server, cached_data_root
from harnessrl.rpc import RECORD_ENV
from tests import leftovers
from tests.contract import check_rpc_coverage
from tests.vllm_support import vllm_server  # noqa: F401  (the vllm suite's one shared server)

leftovers.mark_session()


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM (``kill``, a CI timeout) is taken as Ctrl-C: pytest then tears down every
    fixture, so the servers they started stop by their PID. Without it the process dies
    with no teardown; the servers' die_with_parent is the last resort (it also covers
    SIGKILL), but skips the engines' orderly cleanup. An xdist controller passes it on
    to its workers at once (execnet would first wait 5 s, then kill them at 10)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    if _CONFIG and _CONFIG[0].pluginmanager.has_plugin("dsession"):
        import psutil

        for worker in psutil.Process().children():  # a distributing controller runs no test itself
            with contextlib.suppress(psutil.Error):
                worker.send_signal(signal.SIGTERM)
    raise KeyboardInterrupt(f"signal {signum}")


_CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG.append(config)


if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _interrupt)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # scripts/test runs the default suite on 2 workers
if _WORKER:
    # One core per worker: torch's (OpenMP's) two threads per process, with the other worker
    # busy on the other core, spin at every barrier (a CPU trainer step took 10x as long).
    # Set before any test module imports torch; the processes a test starts inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# The controller makes the record and its workers, started after this import, inherit it:
# the contract is checked once, over what every worker served.
if _WORKER and os.environ.get(RECORD_ENV):
    _RECORD = Path(os.environ[RECORD_ENV])
else:
    _RECORD = Path(tempfile.mkdtemp(prefix="hrl-rpc-")) / "rpcs.txt"
    os.environ[RECORD_ENV] = str(_RECORD)


@pytest.fixture(scope="session")
def _session_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_server(_session_redis: RedisServer) -> RedisServer:
    """One redis-server per session, empty for each test (FLUSHALL before it).
    A test that kills or restarts its Redis starts its own ``RedisServer``."""
    import redis

    with redis.Redis(host="127.0.0.1", port=_session_redis.port) as client:
        client.flushall()
    return _session_redis


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One SeaweedFS S3 server per session; tests take their own bucket via ``s3_bucket``."""
    with S3Server() as server:
        yield server


@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[DockerEngine]:
    """One private dockerd per session (no bridge, no iptables), nothing imported. Its
    data root (images, build cache) is kept under ``$HARNESSRL_HOME/docker-engine/``
    for the next session on this machine; a fresh machine, or a second session at the
    same time, starts cold."""
    with cached_data_root(paths.home()) as data_root, DockerEngine(data_root=data_root) as engine:
        yield engine


@pytest.fixture(scope="session")
def docker_engine(docker_daemon: DockerEngine) -> DockerEngine:
    """The session's dockerd with the offline base images imported (the rootfs that
    setup built, or built now)."""
    import docker

    from services.sandbox import baseimages

    client = docker.DockerClient(base_url=docker_daemon.host)
    fs = baseimages.rootfs()
    if docker_daemon.data_root is not None:
        _untag_foreign_base_images(client, fs.key)
        client.volumes.prune()  # no container is left to use one (DockerEngine removed them)
    baseimages.ensure_imported(client, fs)
    client.close()
    return docker_daemon


def _untag_foreign_base_images(client: Any, key: str) -> None:
    """In a kept data root every image came from a test: a base-image name that a test
    re-tagged (a base image replaced under its name) is untagged, so that this session
    imports ours again rather than inherit the other test's image."""
    import docker

    from services.sandbox import baseimages

    for name in baseimages.NAMES:
        try:
            labels = client.api.inspect_image(name)["Config"].get("Labels") or {}
        except docker.errors.ImageNotFound:
            continue
        if labels.get(baseimages.LABEL) != key:
            client.api.remove_image(name, force=True, noprune=True)


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    return name


# xdist runs each group on one worker, in order. The docker group: every module that
# takes the session's private engine (as a fixture or through ``request.getfixturevalue``)
# or starts one of its own (one engine, one cached data root, one build cache). Every other
# test keeps its module's group, so a module's fixtures are made once (xdist's loadscope,
# with the docker group added).
DOCKER_GROUP = "docker"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("loadgroup", False):
        return
    docker_modules = {item.nodeid.split("::")[0] for item in items if _uses_docker(item.path)}
    for item in items:
        module = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(DOCKER_GROUP if module in docker_modules else module))


@functools.cache
def _uses_docker(path: Path) -> bool:
    text = path.read_text(errors="replace")
    return any(name in text for name in ("docker_engine", "docker_daemon", "DockerEngine"))


@pytest.hookimpl(trylast=True)  # after pytest's own, which tears down what an interrupted run left set up
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fails a full default run in which some RPC was never served, and any run that
    left a process of its own alive; removes the record. Under xdist each worker
    settles its own processes and sends what it killed to the controller, which
    reports them with the contract once."""
    if _WORKER:
        session.config.workeroutput["leftovers"] = leftovers.settle()  # type: ignore[attr-defined]
        return
    try:
        _check_rpc_contract(session, exitstatus)
        # A distributing controller starts nothing of its own (its workers, alive until
        # xdist's own teardown, carry its mark).
        distributing = session.config.pluginmanager.has_plugin("dsession")
        _report_leftovers(session, _WORKER_LEFTOVERS + ([] if distributing else leftovers.settle()))
    finally:
        shutil.rmtree(_RECORD.parent, ignore_errors=True)


_WORKER_LEFTOVERS: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller: a worker ended; keep what it left running (it killed them)."""
    _WORKER_LEFTOVERS.extend(getattr(node, "workeroutput", {}).get("leftovers", []))


def _report_leftovers(session: pytest.Session, left: list[str]) -> None:
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"processes this run started and left running (now killed): {len(left)}", red=True)
        for line in left:
            reporter.write_line(f"  {line}", red=True)
    session.exitstatus = 1


def _check_rpc_contract(session: pytest.Session, exitstatus: int) -> None:
    if not _is_full_default_run(session.config) or exitstatus not in (0, 1):
        return
    missing = check_rpc_coverage(_RECORD)
    if missing:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"RPC contract: no test exercised {missing}", red=True)
        session.exitstatus = 1


# The marker expression of the default run (pyproject addopts); the contract is
# checked on that run only, not on subsets or the marked suites.
DEFAULT_MARKEXPR = "not slow and not vllm and not harness"


def _is_full_default_run(config: pytest.Config) -> bool:
    root = Path(str(config.rootpath))
    selected = [Path(a.split("::")[0]).resolve() for a in config.args]
    whole_suite = all(p in (root, root / "tests") for p in selected)
    default_markers = config.getoption("markexpr") == DEFAULT_MARKEXPR
    return whole_suite and default_markers and not config.getoption("keyword")
