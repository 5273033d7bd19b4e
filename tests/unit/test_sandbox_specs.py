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
    check_requirements,
)
from services.sandbox.backends.docker_images import base_images, prepare_script
from services.sandbox.backends.docker_specs import (
    LABEL_MANAGED,
    LABEL_VERIFY,
    LABEL_WORKER,
    container_spec,
    setup_script,
    verify_container_spec,
    verify_script,
)
from services.sandbox.common.errors import BackendUnavailable, CapabilityError, UnknownName
from services.sandbox.common.settings import IntegrityPolicy
from services.sandbox.task.model import load_task
from tests.sandbox_support import make_task, sandbox_spec, settings_for


def test_docker_container_spec(tmp_path: Path) -> None:
    spec = sandbox_spec(tmp_path, proxy_socket=tmp_path / "proxy.sock", ro_mounts=(Path("/opt/tools"),))
    kw = container_spec(spec, "sha256:abc", "/app", isolate_network=True, disk_quota=True)
    assert kw["image"] == "sha256:abc" and kw["network_mode"] == "none"
    assert kw["labels"][LABEL_MANAGED] == "true" and kw["labels"]["io.harnessrl.trial"] == "Trial_42.x"
    assert kw["labels"][LABEL_WORKER].count(":") == 2
    assert kw["mem_limit"] == "1024m" and kw["memswap_limit"] == "1024m" and kw["pids_limit"] == 128
    assert kw["nano_cpus"] == 1_500_000_000 and kw["storage_opt"] == {"size": "512m"}
    assert kw["cap_drop"] == ["ALL"] and "no-new-privileges" in kw["security_opt"]
    assert str(tmp_path / "proxy.sock") not in kw["volumes"], "the proxy comes in through the netns relay"
    assert kw["volumes"]["/opt/tools"] == {"bind": "/opt/tools", "mode": "ro"}
    assert kw["volumes"][str(spec.dirs.home("agent"))] == {"bind": "/home/agent", "mode": "rw"}
    assert kw["volumes"][str(spec.dirs.runtime / "agent")] == {"bind": "/run/harnessrl", "mode": "ro"}
    assert kw["volumes"][str(spec.dirs.agent_logs)] == {"bind": "/logs/agent", "mode": "rw"}
    assert kw["volumes"][str(spec.dirs.published)] == {"bind": "/logs/artifacts", "mode": "rw"}
    no_quota = container_spec(spec, "sha256:abc", "/app", isolate_network=False, disk_quota=False)
    assert "storage_opt" not in no_quota and no_quota["network_mode"] == "host"


def test_docker_verify_container_spec(tmp_path: Path) -> None:
    """The verifier's container: the agent's limits and identity labels, its own network,
    none of the agent's mounts (harness, HOME, runtime) but its logs, read-only, and
    /logs/artifacts, read-write as Harbor's verifier has it (planted links swept first)."""
    spec = sandbox_spec(tmp_path, ro_mounts=(Path("/opt/tools"),))
    kw = verify_container_spec(spec, "sha256:commit", "/app", network_mode="host", disk_quota=False)
    assert (
        kw["image"] == "sha256:commit" and kw["network_mode"] == "host" and kw["name"].startswith("harnessrl-verify-")
    )
    assert kw["labels"][LABEL_VERIFY] == "true" and kw["labels"]["io.harnessrl.trial"] == "Trial_42.x"
    assert kw["volumes"] == {
        str(spec.dirs.agent_logs): {"bind": "/logs/agent", "mode": "ro"},
        str(spec.dirs.published): {"bind": "/logs/artifacts", "mode": "rw"},  # Harbor's publish folder
    }
    assert kw["mem_limit"] == "1024m" and kw["cap_drop"] == ["ALL"] and "no-new-privileges" in kw["security_opt"]
    assert "storage_opt" not in kw
    owned = verify_script(owner="app")
    assert "chown app /run/harnessrl-verify/home" in owned and "chown app /logs/verifier" in owned


def test_docker_root_scripts_keep_the_reward_dir_roots() -> None:
    mounts = (Path("/root/.pyenv/versions/3.11/bin"), Path("/work/tools"))
    assert setup_script(mounts, ["/var/cache/ldconfig"]) == "", "nothing to open, no exec"
    assert setup_script(mounts, ["/root", "/etc/ssl/private"]) == "chmod o+x /root"
    assert "chown 1000:1000 /logs/verifier" in setup_script((), [], protect_reward_files=False)
    prepare = prepare_script("/app")
    assert "chown -R 1000:1000 /logs/agent /app" in prepare and "chmod 755 /logs" in prepare
    verify = verify_script()
    assert "rm -rf /logs/verifier" in verify and "find /tmp -mindepth 1 -delete" in verify
    kept = verify_script(protect_reward_files=False, clear_agent_leftovers=False)
    assert "rm -rf /logs/verifier" not in kept and "/tmp" not in kept


def test_docker_base_images_of_a_dockerfile(tmp_path: Path) -> None:
    dockerfile = "ARG X=1\nFROM python:3.11-slim AS build\nRUN true\nFROM build\nFROM debian:bookworm-slim\n"
    task = load_task(make_task(tmp_path / "tasks", dockerfile=dockerfile))
    assert base_images(task) == ["python:3.11-slim", "debian:bookworm-slim"]


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
