"""Multi-step tasks ([[steps]]) on the Kubernetes backend, without a cluster: the script the
helper runs between steps (run for real, in a private mount namespace with a scratch tree at
/hrl), the order of ``next_step``'s calls (the agent's NetworkPolicy back before anything of
the next step), and the pod's deadline over every step."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.sandbox.backends.base import Limits, Phase, Sandbox, SandboxSpec
from services.sandbox.backends.kubernetes import KubernetesBackend
from services.sandbox.backends.kubernetes_manifests import HELPER_ROOT, volume_table
from services.sandbox.backends.kubernetes_plans import next_step_script, verify_prep_script
from services.sandbox.common.paths import SandboxPaths, TrialDirs
from services.sandbox.common.settings import IntegrityPolicy, Settings
from services.sandbox.task.model import load_task

EXAMPLE = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "examples" / "steps"
VERIFIER_UID, AGENT_UID = 0, 1000


def run_in_helper(root: Path, script: str) -> subprocess.CompletedProcess[bytes]:
    """``script`` as the pod's helper runs it (root, the volumes under /hrl), with ``root`` at /hrl."""
    argv = ["bwrap", "--bind", "/", "/", "--bind", str(root), str(HELPER_ROOT), "--dev", "/dev", "--proc", "/proc"]
    return subprocess.run([*argv, "sh", "-c", script], capture_output=True, timeout=30, check=False)


@pytest.mark.skipif(shutil.which("bwrap") is None or os.getuid() != 0, reason="needs bubblewrap, as root (chown)")
def test_between_steps_the_verify_phase_is_emptied_and_the_workspace_is_the_agents_again(tmp_path: Path) -> None:
    table = volume_table(SandboxPaths(), IntegrityPolicy())
    vols = {v.name: tmp_path / v.name for v in table}
    for name, path in vols.items():
        (path / "sub").mkdir(parents=True)
        (path / "sub" / "f").write_text(name)
    # What the first step's verify left: the workspace handed to the verifier, a reward written.
    prep = verify_prep_script(table, VERIFIER_UID, fresh_reward_dir=True)
    assert run_in_helper(tmp_path, prep).returncode == 0
    (vols["verifier-logs"] / "reward.txt").write_text("1")
    (vols["workspace"] / "made-by-the-verifier").write_text("kept, as in Harbor's shared container")

    result = run_in_helper(tmp_path, next_step_script(AGENT_UID))
    assert result.returncode == 0, result.stderr
    for name in ("tests", "verifier-logs", "agent-logs", "artifacts"):
        assert vols[name].is_dir() and not any(vols[name].iterdir()), name
    for name in ("solution", "agent-home", "verifier-home", "runtime"):
        assert (vols[name] / "sub" / "f").read_text() == name, name
    owners = {p.stat().st_uid for p in [vols["workspace"], *vols["workspace"].rglob("*")]}
    assert owners == {AGENT_UID}
    assert (vols["workspace"] / "made-by-the-verifier").exists()


def steps_sandbox(tmp_path: Path) -> Sandbox:
    spec = SandboxSpec(
        trial_id="steps-1",
        task=load_task(EXAMPLE),
        dirs=TrialDirs(tmp_path / "trial"),
        limits=Limits(memory_mb=512, storage_mb=256, pids=128, cpus=1.0),
    )
    return Sandbox(spec=spec, paths=SandboxPaths(), env={}, handle="hrl-steps-1")


def offline_backend(calls: list[tuple[str, Any]]) -> KubernetesBackend:
    """The backend with its cluster APIs replaced by recorders (no cluster runs here)."""
    backend = KubernetesBackend.__new__(KubernetesBackend)
    backend.settings = Settings()
    backend.cfg = backend.settings.kubernetes
    backend.namespace = "ns"
    backend.proxy = None
    backend.integrity = IntegrityPolicy()

    def replace(name: str, namespace: str, body: dict[str, Any]) -> None:
        calls.append(("policy", body))

    async def helper(pod: str, script: str, stdin: bytes | None = None) -> bytes:
        calls.append(("helper", script))
        return b""

    backend.net = SimpleNamespace(replace_namespaced_network_policy=replace)
    backend._helper = helper  # type: ignore[method-assign]
    return backend


async def test_next_step_puts_the_agents_network_policy_back_first(tmp_path: Path) -> None:
    calls: list[tuple[str, Any]] = []
    backend = offline_backend(calls)
    sandbox = steps_sandbox(tmp_path)
    await backend.next_step(sandbox)
    assert [kind for kind, _ in calls] == ["policy", "helper"]
    # The verify phase's policy (public egress maybe) is replaced by the agent's, as at start.
    assert calls[0][1] == backend._policy(sandbox.spec, Phase.AGENT)
    assert calls[0][1] != backend._policy(sandbox.spec, Phase.VERIFY, public=True)
    assert calls[1][1] == next_step_script(backend.cfg.agent_uid)


def test_the_pods_deadline_covers_every_steps_agent_setup_and_verifier(tmp_path: Path) -> None:
    backend = offline_backend([])
    sandbox = steps_sandbox(tmp_path)
    # greet: agent 60 s (twice: setup.sh and its healthcheck share that bound) + verifier 30 s;
    # personalise: the task's agent 120 s (twice) + verifier 30 s; then the start and a margin.
    assert backend._deadline(sandbox.spec) == int(backend.cfg.start_timeout_s + (2 * 60 + 30) + (2 * 120 + 30) + 300)
    assert backend.runs_steps
