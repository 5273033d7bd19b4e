"""The offline base images as real tasks use them, on the session's private engine:
a ``FROM python:3.11-slim`` Dockerfile finds ``python`` and ``pip`` where the official
image has them and installs a wheel from a local wheelhouse; ``FROM ubuntu:24.04`` is
Ubuntu noble (imported here, not by every session: only these tests name Ubuntu);
the CLI imports one chosen name and refuses an unknown one before building anything."""

from __future__ import annotations

import base64
import hashlib
import io
import uuid
import zipfile
from pathlib import Path

import docker
import pytest

from harnessrl.localservers import DockerEngine
from services.sandbox import baseimages
from services.sandbox.common.settings import DockerBackendSettings
from services.sandbox.factory import create_backend
from services.sandbox.trial.lifecycle import TerminationReason, TrialSpec
from services.sandbox.trial.runner import TrialRunner
from tests.cli_support import run_cli
from tests.sandbox_support import make_task, settings_for

# What the official python image's users rely on: python, python3, pip, pip3 in /usr/local/bin,
# `python -m pip`, and `pip install` with no PEP 668 refusal; the wheel comes from a local folder.
PYTHON_DOCKERFILE = """\
FROM python:3.11-slim
COPY wheels /wheels
RUN python -m pip --version && pip --version && pip3 --version && python3 --version \\
    && test "$(command -v python)" = /usr/local/bin/python && test "$(command -v pip)" = /usr/local/bin/pip
RUN pip install --no-index --find-links /wheels hrl-probe
WORKDIR /app
"""
PYTHON_TEST = """\
#!/bin/bash
got=$(cd / && python -c 'import hrl_probe; print(hrl_probe.VALUE)')
if [ "$got" = "{nonce}" ] && [ "$(cat /app/hello.txt)" = hello ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
NOBLE_DOCKERFILE = """\
FROM ubuntu:24.04
RUN grep -qx 'VERSION_CODENAME=noble' /etc/os-release && grep -q universe /etc/apt/sources.list && id -u ubuntu
# What a Harbor verifier does first: apt from Ubuntu's archive, verified by the image's own keyring.
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends hello && hello
WORKDIR /app
"""


def wheel(dest: Path, value: str) -> Path:
    """A pure-Python wheel of ``hrl_probe`` (version 1.0) whose VALUE is ``value``."""
    files = {
        "hrl_probe/__init__.py": f"VALUE = {value!r}\n",
        "hrl_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hrl-probe\nVersion: 1.0\n",
        "hrl_probe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = io.StringIO()
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.write(f"{name},sha256={digest},{len(text.encode())}\n")
    record.write("hrl_probe-1.0.dist-info/RECORD,,\n")
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "hrl_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in {**files, "hrl_probe-1.0.dist-info/RECORD": record.getvalue()}.items():
            archive.writestr(name, text)
    return path


async def oracle(tmp: Path, host: str, task: Path):
    s = settings_for(tmp, backend="docker", docker=DockerBackendSettings(host=host, verify_network="none"))
    spec = TrialSpec(trial_id=f"base-{uuid.uuid4().hex[:10]}", task_path=str(task), harness="oracle")
    return await TrialRunner(s, create_backend(s)).run(spec)


async def test_a_python_slim_dockerfile_has_pip_and_installs_a_local_wheel(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    nonce = uuid.uuid4().hex
    task = make_task(tmp_path, dockerfile=PYTHON_DOCKERFILE, test_sh=PYTHON_TEST.format(nonce=nonce))
    wheel(task / "environment" / "wheels", nonce)
    done = await oracle(tmp_path / "run", docker_engine.host, task)
    assert (done.termination_reason, done.reward) == (TerminationReason.COMPLETED, 1.0), done.error


@pytest.fixture(scope="module")
def noble(docker_engine: DockerEngine) -> str:
    """ubuntu:24.04 in the session's engine (the rootfs setup built, or built now)."""
    client = docker.DockerClient(base_url=docker_engine.host)
    try:
        baseimages.ensure_imported(client, baseimages.rootfs(base=baseimages.NOBLE))
    finally:
        client.close()
    return docker_engine.host


async def test_an_ubuntu_noble_task_scores_its_oracle(tmp_path: Path, noble: str) -> None:
    task = make_task(tmp_path, dockerfile=NOBLE_DOCKERFILE)
    done = await oracle(tmp_path / "run", noble, task)
    assert (done.termination_reason, done.reward) == (TerminationReason.COMPLETED, 1.0), done.error


def test_base_images_cli_imports_a_chosen_name_and_refuses_an_unknown_one(
    docker_engine: DockerEngine, tmp_path: Path
) -> None:
    done = run_cli("sandbox", "base-images", "--docker-host", docker_engine.host, "--image", "ubuntu:22.04")
    assert done.returncode == 0, done.stderr
    assert "jammy-" in done.stdout and "bookworm-" not in done.stdout, "only the chosen name's rootfs"
    assert any(line in done.stdout for line in ("ubuntu:22.04: imported", "ubuntu:22.04: present"))
    client = docker.DockerClient(base_url=docker_engine.host)
    try:
        probe = "cat /etc/os-release && apt-get --version && test -s /usr/share/keyrings/ubuntu-archive-keyring.gpg"
        release = client.containers.run("ubuntu:22.04", ["sh", "-c", probe], network_mode="none", remove=True)
    finally:
        client.close()
    assert b"VERSION_CODENAME=jammy" in release and b"apt " in release, "Ubuntu's images have apt and its keyring"
    bad = run_cli("sandbox", "base-images", "--build-only", "--image", "ubuntu:99.04")
    assert bad.returncode == 2 and "--image" in bad.stderr and "ubuntu:99.04" in bad.stderr
    assert "ubuntu:24.04" in bad.stderr, "the error lists the known names"
    assert "rootfs" not in bad.stdout and "Traceback" not in bad.stderr
