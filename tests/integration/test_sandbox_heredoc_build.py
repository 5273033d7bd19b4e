"""Dockerfile heredocs built for real on both backends, with one and the same result: the
local backend's replay (bubblewrap) and the docker backend's engine (the session's private
dockerd, Debian's 20.10 with its classic builder, fed the rewrite of task/heredoc.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import docker
import pytest

from harnessrl.localservers import DockerEngine
from services.sandbox.backends.base import ExecRequest, Limits, Phase, SandboxSpec
from services.sandbox.backends.docker_images import ImageStore, engine_build
from services.sandbox.backends.local import LocalBackend
from services.sandbox.common.paths import TrialDirs
from services.sandbox.task.model import load_task
from tests.sandbox_support import make_task, settings_for

DOCKERFILE = (
    "FROM debian:bookworm-slim\n"
    "ARG WHO=world\n"
    "WORKDIR /app\n"
    "RUN <<EOF\n"
    'echo "hi $WHO" > /app/run.txt\n'
    "echo second >> /app/run.txt\n"
    "EOF\n"
    "RUN <<-'EOT'\n"
    "\t#!/bin/sh\n"
    '\techo "script $0 $WHO" > /app/shebang.txt\n'
    "\tEOT\n"
    'COPY <<A <<-"B" /app/etc/\n'
    "hello ${WHO}\n"
    "A\n"
    "\tkeep $WHO\n"
    "\tB\n"
    "COPY <<C /app/single.txt\n"
    "one file\n"
    "C\n"
    "RUN cat <<X > /app/x.txt && cat <<-'Y' > /app/y.txt\n"
    "x $WHO\n"
    "X\n"
    "\ty $WHO\n"
    "\tY\n"
)
FILES = "run.txt shebang.txt etc/A etc/B single.txt x.txt y.txt"
SHOW = f'cd /app && for f in {FILES}; do echo "== $f $(stat -c %a $f)"; cat $f; done'
EXPECTED = """\
== run.txt 644
hi world
second
== shebang.txt 644
script /dev/pipes/EOT world
== etc/A 644
hello world
== etc/B 644
keep $WHO
== single.txt 644
one file
== x.txt 644
x world
== y.txt 644
y $WHO
"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_heredocs_on_the_local_backend(tmp_path: Path) -> None:
    backend = LocalBackend(settings_for(tmp_path))
    task = load_task(make_task(tmp_path / "tasks", dockerfile=DOCKERFILE))
    spec = SandboxSpec(
        trial_id="h", task=task, dirs=TrialDirs(backend.settings.work_dir / "h"), limits=Limits(memory_mb=256)
    )
    box = await backend.start(spec)
    try:
        request = ExecRequest(
            argv=["/bin/sh", "-c", SHOW], phase=Phase.AGENT, env={"PATH": "/usr/bin:/bin"}, timeout_s=20
        )
        result = await backend.exec(box, request)
        assert result.output.decode() == EXPECTED, result.output.decode()
    finally:
        await backend.stop(box)


async def test_heredocs_on_the_docker_backend(tmp_path: Path, docker_engine: DockerEngine) -> None:
    task = load_task(make_task(tmp_path / "tasks", dockerfile=DOCKERFILE))
    client = docker.DockerClient(base_url=docker_engine.host)
    try:
        store = ImageStore(
            client, build_network="host", pull=False, cache_dir=tmp_path / "cache", engine=docker_engine.host
        )
        prepared = await store.image_for(task, squash=False)
        out = client.containers.run(prepared.image, ["/bin/sh", "-c", SHOW], network_mode="none", remove=True)
        assert out.decode() == EXPECTED
        # Nothing of the rewrite is left in the image: /dev/pipes was the build container's tmpfs.
        gone = client.containers.run(prepared.image, ["ls", "-a", "/app"], network_mode="none", remove=True)
        assert ".harnessrl-heredocs" not in gone.decode()
    finally:
        client.close()


def test_a_sidecar_build_with_heredocs_and_build_args(tmp_path: Path, docker_engine: DockerEngine) -> None:
    """What a compose sidecar's build runs (docker_compose builds through engine_build): a named
    Dockerfile in a sub-folder, a build arg expanded into a COPY heredoc as BuildKit expands it."""
    context = tmp_path / "side"
    context.mkdir()
    (context / "side.Dockerfile").write_text(
        "FROM debian:bookworm-slim\nARG PORT=1\nCOPY <<CONF /etc/side.conf\nport=${PORT}\nCONF\n"
        "RUN <<EOF\nset -e\ngrep -q port= /etc/side.conf\nEOF\n"
    )
    client = docker.DockerClient(base_url=docker_engine.host)
    try:
        image, _ = engine_build(
            client, path=str(context), dockerfile="side.Dockerfile", buildargs={"PORT": "8080"}, network_mode="host"
        )
        out = client.containers.run(image.id, ["cat", "/etc/side.conf"], network_mode="none", remove=True)
        assert out == b"port=8080\n"
    finally:
        client.close()
