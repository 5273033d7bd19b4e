"""The Kubernetes backend's exec plans (the shell scripts its helper and exec run), run
by a real sh, and its exec stream cut by cancel and by the worker's deadline. No cluster
can run here; the manifests are tested in test_sandbox_kubernetes.py."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import tarfile
import threading
import time
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import pytest

from services.sandbox.backends.base import ExecRequest, Phase
from services.sandbox.backends.kubernetes import KubernetesBackend
from services.sandbox.backends.kubernetes_manifests import helper_path, volume_table
from services.sandbox.backends.kubernetes_plans import (
    download_script,
    exec_argv,
    parse_sweep,
    sweep_script,
    unpack_download,
    upload_script,
    verify_prep_script,
)
from services.sandbox.backends.limits import BoundedOutput
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.common.settings import IntegrityPolicy


def tar_of(src: Path, arcname: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(src, arcname=arcname)
    return buffer.getvalue()


# -- exec plans, run by a real sh ------------------------------------------------------
def run_sh(argv: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=30, check=False)


def test_exec_plan_gives_exactly_the_workers_env_cwd_and_stdin(tmp_path: Path) -> None:
    (tmp_path / "in").write_bytes(b"from stdin\n")
    request = ExecRequest(argv=["sh", "-c", 'pwd; cat; echo "$FOO"; env | sort'], phase=Phase.AGENT, timeout_s=10)
    env = {"FOO": "a b'c", "PATH": "/usr/bin:/bin"}
    argv = exec_argv(request, cwd=str(tmp_path), env=env, stdin_path=str(tmp_path / "in"))
    assert argv[argv.index("timeout") : argv.index("timeout") + 4] == ["timeout", "-s", "KILL", "10"]
    out = run_sh(argv).stdout.decode().splitlines()
    assert out[:3] == [str(tmp_path), "from stdin", "a b'c"]
    assert {line.split("=", 1)[0] for line in out[3:]} <= {"FOO", "PATH", "PWD", "SHLVL", "_"}
    no_stdin = exec_argv(ExecRequest(argv=["cat"], phase=Phase.AGENT, timeout_s=5), cwd="/", env={}, stdin_path=None)
    assert run_sh(no_stdin, b"ignored").stdout == b""


def test_exec_plan_kills_at_the_timeout() -> None:
    argv = exec_argv(
        ExecRequest(argv=["sleep", "30"], phase=Phase.AGENT, timeout_s=0.5),
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        stdin_path=None,
    )
    started = time.monotonic()
    assert run_sh(argv).returncode != 0 and time.monotonic() - started < 5


def test_upload_then_download_round_trips_through_the_plans(tmp_path: Path) -> None:
    volume, src = tmp_path / "vol", tmp_path / "src"
    (volume / "stale").mkdir(parents=True)
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("x = 1\n")
    os.symlink("/etc/hostname", src / "abs-link")
    data = tar_of(src, ".")
    script = upload_script(PurePosixPath(str(volume)), True, len(data), os.getuid())
    # Exactly ``size`` bytes are read: no EOF is needed, trailing bytes are never read.
    assert run_sh(["sh", "-c", script], data + b"trailing").returncode == 0
    assert sorted(p.name for p in volume.iterdir()) == ["abs-link", "pkg"]
    one = tar_of(src / "pkg" / "m.py", "n.py")
    target = PurePosixPath(str(volume / "deep" / "n.py"))
    assert run_sh(["sh", "-c", upload_script(target, False, len(one), os.getuid())], one).returncode == 0
    out = run_sh(["sh", "-c", download_script(PurePosixPath(str(volume)))]).stdout
    unpack_download(out, tmp_path / "back")
    assert (tmp_path / "back" / "pkg" / "m.py").read_text() == "x = 1\n"
    assert os.readlink(tmp_path / "back" / "abs-link") == "/etc/hostname"
    file_out = run_sh(["sh", "-c", download_script(target)]).stdout
    unpack_download(file_out, tmp_path / "single.py")
    assert (tmp_path / "single.py").read_text() == "x = 1\n"
    missing = run_sh(["sh", "-c", download_script(PurePosixPath(str(tmp_path / "nope")))])
    assert missing.returncode == 44 and missing.stdout == b""


def test_uploads_go_only_to_the_trial_volumes() -> None:
    table = volume_table(SandboxPaths(), IntegrityPolicy())
    vol, target = helper_path(table, PurePosixPath("/home/agent/.codex/config.toml"))
    assert vol.name == "agent-home" and vol.owner == "agent" and str(target) == "/hrl/agent-home/.codex/config.toml"
    vol, target = helper_path(table, PurePosixPath("/logs/verifier"))
    assert vol.owner == "verifier" and str(target) == "/hrl/verifier-logs"
    assert helper_path(table, PurePosixPath("/tests/test.sh"))[0].owner == "root"
    with pytest.raises(EnvSetupError, match="/etc/passwd"):
        helper_path(table, PurePosixPath("/etc/passwd"))


def test_verify_prep_hands_the_workspace_and_a_fresh_reward_dir_to_the_verifier() -> None:
    table = volume_table(SandboxPaths(), IntegrityPolicy())
    script = verify_prep_script(table, 1001, fresh_reward_dir=True)
    assert script.index("find /hrl/verifier-logs -mindepth 1 -delete") < script.index(
        "chown 1001:1001 /hrl/verifier-logs"
    )
    assert "chown -R 1001:1001 /hrl/workspace /hrl/tests /hrl/verifier-home" in script
    assert "chmod 0755 /hrl/verifier-logs" in script
    assert "-delete" not in verify_prep_script(table, 1001, fresh_reward_dir=False)


def test_sweep_counts_without_killing() -> None:
    out = run_sh(["sh", "-c", sweep_script(kill=False)]).stdout.decode()
    found = parse_sweep(out)
    assert set(found) == {"leftovers", "left", "oom"} and found["leftovers"] == found["left"] >= 1


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap for a private pid namespace")
def test_sweep_kills_every_process_but_pid_1_setsid_daemons_included() -> None:
    # In a private pid namespace (as in a container): kill -9 -1 must not reach this machine.
    daemons = 'sleep 60 & sleep 60 & (setsid sh -c "sleep 60 & sleep 60" &); sleep 0.3; exec sh -c "$0"'
    argv = ["bwrap", "--ro-bind", "/", "/", "--unshare-pid", "--unshare-user", "--proc", "/proc", "--dev", "/dev"]
    result = run_sh([*argv, "sh", "-c", daemons, sweep_script(kill=True)])
    if result.returncode != 0 and b"bwrap" in result.stderr:
        pytest.skip(f"bubblewrap cannot unshare here: {result.stderr[-200:]!r}")
    found = parse_sweep(result.stdout.decode())
    assert found["leftovers"] == 5 and found["left"] == 0


# -- the exec stream: cancellation and deadline mid-exec ---------------------------------
class FakeExecStream:
    """Plays the kubernetes client's WSClient over a local process (the one seam patched)."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.closed = False

    def is_open(self) -> bool:
        return not self.closed and self.proc.poll() is None

    def update(self, timeout: float = 0) -> None:
        time.sleep(min(timeout, 0.05))

    def read_stdout(self, timeout: float = 0) -> bytes:
        return b""

    def read_stderr(self, timeout: float = 0) -> bytes:
        return b""

    def write_stdin(self, data: bytes) -> None:
        raise AssertionError("no stdin in this test")

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def close(self) -> None:
        self.closed = True
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def streaming_backend(monkeypatch: pytest.MonkeyPatch) -> tuple[KubernetesBackend, list[FakeExecStream]]:
    import kubernetes.stream

    opened: list[FakeExecStream] = []

    def fake_stream(_method: object, _pod: str, _ns: str, *, command: list[str], **_kw: object) -> FakeExecStream:
        opened.append(FakeExecStream(command))
        return opened[-1]

    monkeypatch.setattr(kubernetes.stream, "stream", fake_stream)
    backend = KubernetesBackend.__new__(KubernetesBackend)  # no cluster: only the stream loop runs
    backend._exec_api = SimpleNamespace(connect_get_namespaced_pod_exec=None)  # type: ignore[assignment]
    backend._connect_lock = threading.Lock()
    backend.namespace = "ns"
    return backend, opened


async def test_cancel_stops_an_exec_in_the_middle(
    streaming_backend: tuple[KubernetesBackend, list[FakeExecStream]],
) -> None:
    backend, opened = streaming_backend
    cancel = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, cancel.set)
    started = time.monotonic()
    code, stopped = await backend._stream("pod", "agent", ["sleep", "30"], BoundedOutput(100), 60, cancel)
    assert (code, stopped) == (None, "cancelled") and time.monotonic() - started < 5
    assert opened[0].closed and opened[0].proc.returncode is not None


async def test_a_worker_side_deadline_cuts_a_hung_exec(
    streaming_backend: tuple[KubernetesBackend, list[FakeExecStream]],
) -> None:
    backend, _ = streaming_backend
    code, stopped = await backend._stream("pod", "agent", ["sleep", "30"], BoundedOutput(100), 0.3, None)
    assert (code, stopped) == (None, "deadline")
    code, stopped = await backend._stream("pod", "agent", ["true"], BoundedOutput(100), 10, None)
    assert (code, stopped) == (0, None)
