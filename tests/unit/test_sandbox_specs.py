"""Docker backend (and what all backends share): the code that builds container
specs is tested directly, the backends refuse to start without an engine.
The Kubernetes manifests are tested in test_sandbox_kubernetes.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnessrl.errors import HarnessError
from services.sandbox.backends import BACKENDS, create_backend
from services.sandbox.backends.base import (
    Capabilities,
    ExecRequest,
    Limits,
    Network,
    Phase,
    SandboxSpec,
    check_requirements,
)
from services.sandbox.backends.docker import LABEL_MANAGED, container_spec, exec_argv, image_tag
from services.sandbox.errors import BackendUnavailable, CapabilityError, UnknownName
from services.sandbox.paths import TrialDirs
from services.sandbox.settings import IntegrityPolicy
from services.sandbox.tasks import load_task
from tests.sandbox_support import DEFAULT_TOML, make_task, settings_for


def sandbox_spec(tmp_path: Path, toml: str | None = None, **kw: object) -> SandboxSpec:
    task = load_task(make_task(tmp_path / "tasks", toml=toml))
    return SandboxSpec(
        trial_id="Trial_42.x",
        task=task,
        dirs=TrialDirs(tmp_path / "trial"),
        limits=Limits(memory_mb=1024, storage_mb=512, pids=128, cpus=1.5),
        **kw,  # type: ignore[arg-type]
    )


def test_docker_container_spec(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path, proxy_socket=tmp_path / "proxy.sock", ro_mounts=(Path("/opt/tools"),))
    kw = container_spec(spec, image_tag(spec), "/app")
    assert kw["image"].startswith("harnessrl-env:") and kw["network"] == "harnessrl-Trial_42.x"
    assert kw["labels"] == {LABEL_MANAGED: "true", "io.harnessrl.trial": "Trial_42.x"}
    assert kw["mem_limit"] == "1024m" and kw["memswap_limit"] == "1024m" and kw["pids_limit"] == 128
    assert kw["nano_cpus"] == 1_500_000_000 and kw["storage_opt"] == {"size": "512m"}
    assert kw["cap_drop"] == ["ALL"] and "no-new-privileges" in kw["security_opt"]
    assert kw["volumes"][str(tmp_path / "proxy.sock")]["bind"].endswith("/proxy.sock")
    assert kw["volumes"]["/opt/tools"] == {"bind": "/opt/tools", "mode": "ro"}
    argv, user = exec_argv(
        ExecRequest(argv=["claude"], phase=Phase.AGENT, timeout_s=60, network=Network.PROXY_ONLY, proxy_port=4100)
    )
    assert user == "1000:1000" and argv[:4] == ["timeout", "-s", "KILL", "61"]
    assert "127.0.0.1:4100" in argv and argv[-1] == "claude"


def test_docker_uses_a_prebuilt_image_when_named(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path, toml=DEFAULT_TOML + 'docker_image = "python:3.12-slim"\n')
    assert image_tag(spec) == "python:3.12-slim"


@pytest.mark.parametrize("backend", ["docker", "kubernetes"])
def test_backends_without_an_engine_refuse_to_start(tmp_path: Path, backend: str) -> None:
    try:
        created = create_backend(settings_for(tmp_path, backend=backend))
    except BackendUnavailable as e:
        assert "reachable" in str(e)
        return
    pytest.skip(f"a {backend} engine is reachable here ({created.name}); this test is for machines without one")


def test_unknown_backend_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownName, match="local"):
        create_backend(settings_for(tmp_path, backend="firecracker"))
    assert set(BACKENDS) == {"local", "docker", "kubernetes"}


def test_capabilities_are_checked_against_the_policy() -> None:
    weak = Capabilities(
        builds_dockerfile=True,
        prebuilt_images=False,
        network_isolation=False,
        kills_process_tree=True,
        hides_verifier_files=True,
        squashes_git_history=True,
        memory_limit=True,
        pids_limit=True,
        disk_limit=True,
        wall_time_limit=True,
        non_root=True,
    )
    with pytest.raises(CapabilityError, match="network_isolation"):
        check_requirements("weak", weak, IntegrityPolicy())
    check_requirements("weak", weak, IntegrityPolicy(isolate_network=False))
    assert issubclass(CapabilityError, HarnessError)
