"""Harbor's network_mode / allow_internet govern the running phases, never the image build:
a task that says allow_internet = false still builds with the build network, on a real
engine (the session's private dockerd; its builds use --network host, so a RUN reaches a
listener on the host's 127.0.0.1 exactly when the build has a network)."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from harnessrl.localservers import DockerEngine
from services.sandbox.backends.docker_images import ImageStore
from services.sandbox.task.model import NetworkMode, load_task
from tests.sandbox_support import make_task


@pytest.fixture
def listener() -> Iterator[int]:
    """A port on the host's loopback that accepts connections (and drops them)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    server.close()
    thread.join(timeout=5)


async def test_a_no_internet_task_builds_with_the_build_network(
    tmp_path: Path, docker_engine: DockerEngine, listener: int
) -> None:
    # The RUN fails, and so the build, unless the build has the host's network.
    dockerfile = (
        f"FROM debian:bookworm-slim\nRUN echo {uuid.uuid4().hex} > /nonce && "
        f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{listener}' && echo reached > /reached\n"
    )
    toml = '[task]\nname = "t/{name}"\n[environment]\nallow_internet = false\n'
    task = load_task(make_task(tmp_path, "offline", toml=toml, dockerfile=dockerfile))
    assert task.config.environment.network_mode == NetworkMode.NO_NETWORK
    client = docker.DockerClient(base_url=docker_engine.host)
    try:
        store = ImageStore(
            client, build_network="host", pull=False, cache_dir=tmp_path / "cache", engine=docker_engine.host
        )
        prepared = await store.image_for(task, squash=False)
        out = client.containers.run(prepared.image, ["cat", "/reached"], network_mode="none", remove=True)
        assert out == b"reached\n"
    finally:
        client.close()
