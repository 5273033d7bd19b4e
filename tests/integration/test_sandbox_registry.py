"""``[environment] docker_image`` pulled from a real registry (Debian's
``docker-registry``, distribution 2.8, on 127.0.0.1 and a free port, with its own
storage): by digest and by tag, each image absent from the engine until the trial
pulls it, and a digest the registry lacks is an env_setup_failed naming the image.
The engine needs no flag for it: dockerd treats 127.0.0.0/8 registries as insecure
(plain http) by default."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from harnessrl.localservers import DockerEngine, free_port
from services.sandbox import baseimages
from services.sandbox.common.settings import DockerBackendSettings
from services.sandbox.factory import create_backend
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec
from services.sandbox.trial.runner import TrialRunner
from tests.sandbox_support import make_task, settings_for

CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
http:
  addr: 127.0.0.1:{port}
"""
MARKER_TEST = """\
#!/bin/bash
if [ "$(cat /marker)" = "{marker}" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
# The smallest offline base with bash (~75 MB): pushing gzips its layer, ~4x faster than Debian's.
BASE = "ubuntu:24.04"
TOML = '[task]\nname = "t/pull"\n[verifier]\ntimeout_sec = 30\n[environment]\ndocker_image = "{image}"\n'


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A registry on 127.0.0.1:<free port>; yields its address, stops it by its PID."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("docker-registry not found; run scripts/setup (Debian package docker-registry)")
    root = tmp_path_factory.mktemp("registry")
    port = free_port()
    (root / "config.yml").write_text(CONFIG.format(root=root / "data", port=port))
    with open(root / "registry.log", "wb") as out:
        proc = subprocess.Popen([binary, "serve", str(root / "config.yml")], stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(f"http://127.0.0.1:{port}/v2/", proc, root / "registry.log")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"docker-registry exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    pytest.fail(f"docker-registry did not answer {url} in 30s: {log.read_text()[-2000:]}")


def push(client: docker.DockerClient, ctx: Path, ref: str, marker: str) -> str:
    """Builds an image holding /marker, pushes it as ``ref`` and removes it from the engine,
    so that only a pull brings it back. Returns the digest the registry holds it under."""
    ctx.mkdir(parents=True)
    (ctx / "Dockerfile").write_text(f"FROM {BASE}\nCOPY marker /marker\n")
    (ctx / "marker").write_text(marker)
    image, _ = client.images.build(path=str(ctx), tag=ref, network_mode="none", rm=True)
    repo, tag = ref.rsplit(":", 1)
    for line in client.images.push(repo, tag=tag, stream=True, decode=True):
        assert "error" not in line, line
    digests = client.images.get(ref).attrs["RepoDigests"]
    client.images.remove(image.id, force=True)
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(ref)
    return str(digests[0].split("@", 1)[1])


async def trial(tmp: Path, host: str, image: str, marker: str = ""):
    task = make_task(tmp, toml=TOML.format(image=image), dockerfile=None, test_sh=MARKER_TEST.format(marker=marker))
    s = settings_for(tmp, backend="docker", docker=DockerBackendSettings(host=host, verify_network="none"))
    spec = TrialSpec(trial_id=f"pull-{uuid.uuid4().hex[:10]}", task_path=str(task), harness="nop")
    return await TrialRunner(s, create_backend(s)).run(spec)


async def test_docker_image_is_pulled_by_digest_and_by_tag(
    tmp_path: Path, docker_engine: DockerEngine, registry: str
) -> None:
    client = docker.DockerClient(base_url=docker_engine.host)
    baseimages.ensure_imported(client, baseimages.rootfs(base=baseimages.base_of(BASE)), (BASE,))
    repo = f"{registry}/hrl/probe-{uuid.uuid4().hex[:8]}"
    by_digest, by_tag = f"digest-{uuid.uuid4().hex}", f"tag-{uuid.uuid4().hex}"
    try:
        digest = push(client, tmp_path / "a", f"{repo}:a", by_digest)
        push(client, tmp_path / "b", f"{repo}:b", by_tag)
    finally:
        client.close()
    pinned = await trial(tmp_path / "digest", docker_engine.host, f"{repo}@{digest}", by_digest)
    assert (pinned.termination_reason, pinned.reward) == (TerminationReason.COMPLETED, 1.0), pinned.error
    tagged = await trial(tmp_path / "tag", docker_engine.host, f"{repo}:b", by_tag)
    assert (tagged.termination_reason, tagged.reward) == (TerminationReason.COMPLETED, 1.0), tagged.error


async def test_a_digest_the_registry_lacks_is_an_env_setup_failure_naming_it(
    tmp_path: Path, docker_engine: DockerEngine, registry: str
) -> None:
    image = f"{registry}/hrl/absent@sha256:{'0' * 64}"
    done = await trial(tmp_path, docker_engine.host, image)
    assert done.termination_reason == TerminationReason.ENV_SETUP_FAILED, done
    assert image in (done.error or "") and "could not be pulled" in (done.error or ""), done.error
