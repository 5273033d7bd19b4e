"""``harnessrl trial run`` as a newcomer runs it, with the real CLI: the trial keeps
what it captured in a run directory of its own under ``$HARNESSRL_RUNS_DIR``, and
``capture export --trial ID`` and the dashboard find it by its id alone. A harness
left to its own model name (no ``--model``) is served the policy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from harnessrl.paths import default_model_dir
from services.sandbox.harnesses import get_harness
from stack.conformance.matrix import tools_script
from tests.sandbox_support import make_task

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(not (default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"),
]
ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "services" / "sandbox" / "examples" / "hello"
# The shell agent asks for the adapters' default model name, as a harness does without --model.
AGENT = """set -e
curl -sSf "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" \\
  -H 'content-type: application/json' \\
  -d '{"model": "harnessrl-policy", "messages": [{"role": "user", "content": "say hi"}]}' > /logs/agent/reply.json
grep -q 'Hello from the policy' /logs/agent/reply.json && echo hello > hello.txt
"""


def env_for(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HARNESSRL_RUNS_DIR": str(tmp / "runs"),
        "HARNESSRL_SANDBOX_WORK_DIR": str(tmp / "trials"),
        "HARNESSRL_SANDBOX_CACHE_DIR": str(tmp / "cache"),
        "HARNESSRL_SANDBOX_LOCAL__VERIFY_NETWORK": "none",  # the tasks' verifiers need no network
    }


def cli(tmp: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "stack.cli", *args]
    return subprocess.run(cmd, cwd=tmp, env=env_for(tmp), capture_output=True, text=True, timeout=timeout)


def get(url: str, token: str) -> tuple[int, dict[str, str], bytes]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def wait_until_serving(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_trial_keeps_its_capture_and_is_found_by_its_id(tmp_path: Path) -> None:
    engine = tmp_path / "script.json"
    turns = [{"content": "Hello from the policy."}]
    engine.write_text(json.dumps({"context_window": 8192, "threads": {"main": turns, "*": turns}}))
    (tmp_path / "agent.sh").write_text(AGENT)
    args = ["--task", str(HELLO), "--harness", "shell", "--agent-script", str(tmp_path / "agent.sh")]
    out = cli(tmp_path, "trial", "run", *args, "--engine", f"scripted:{engine}", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    trial_id = result["trial_id"]
    assert result["termination_reason"] == "completed" and result["reward"] == 1.0, result
    run_dir = tmp_path / "runs" / trial_id
    assert result["run_dir"] == str(run_dir)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["kind"] == "trial" and info["status"] == "done" and info["run_id"] == trial_id
    assert (run_dir / "capture" / "index.sqlite3").exists()
    # The trial's artifacts are the run's artifacts/ folder, not artifacts/<trial>/<trial>/.
    assert result["artifacts_dir"] == str(run_dir / "artifacts") and (run_dir / "artifacts" / "result.json").exists()
    assert not (run_dir / "artifacts" / trial_id).exists()

    exported = tmp_path / "trial.jsonl"
    out = cli(tmp_path, "capture", "export", "--trial", trial_id, "--out", str(exported))
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["trial_id"] == trial_id and lines[0]["reward"] == 1.0, lines[0].keys()
    out = cli(tmp_path, "capture", "export", "--trial", "trial-nope", "--out", str(tmp_path / "x.jsonl"))
    assert out.returncode == 2 and "no run under" in out.stderr and "Traceback" not in out.stderr

    dashboard = subprocess.Popen(
        [sys.executable, "-m", "stack.cli", "dashboard", "serve", "--port", "0"],
        cwd=tmp_path,
        env=env_for(tmp_path),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert dashboard.stderr is not None
        url = next(line.split(" on ", 1)[1].strip() for line in dashboard.stderr if "dashboard listening on" in line)
        parsed = urlparse(url)
        base, token = f"{parsed.scheme}://{parsed.netloc}", parse_qs(parsed.query)["token"][0]
        wait_until_serving(f"{base}/healthz")
        status, _, body = get(f"{base}/api/trials/{trial_id}", token)
        assert status == 200 and json.loads(body)["run_id"] == trial_id, body
        status, headers, _ = get(f"{base}/trials/{trial_id}", token)
        assert status == 307 and headers["location"] == f"/runs/{trial_id}/trajectories/{trial_id}"
        status, _, body = get(f"{base}/api/runs/{trial_id}/trajectories/{trial_id}", token)
        assert status == 200, body
        status, _, body = get(f"{base}/api/runs/{trial_id}", token)
        assert status == 200 and json.loads(body)["problems"] == [], body
        assert get(f"{base}/api/trials/trial-nope", token)[0] == 404
    finally:
        dashboard.terminate()
        dashboard.wait(30)


@pytest.mark.harness
def test_mini_swe_agent_without_a_model_name_completes(tmp_path: Path) -> None:
    missing = [p for p in get_harness("mini-swe-agent").install_paths() if not p.exists()]
    if missing:
        pytest.skip(f"mini-swe-agent is not installed ({missing[0]}); scripts/setup installs it")
    task = make_task(tmp_path / "tasks", toml="[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 60\n")
    engine = tmp_path / "script.json"
    engine.write_text(json.dumps({"context_window": 32768, "threads": {"main": tools_script("mini-swe-agent")}}))
    # -o config=default: mini-swe-agent's own tool-calling config (the default model's is compact).
    out = cli(tmp_path, "trial", "run", "--task", str(task), "--harness", "mini-swe-agent", "-o", "config=default",
              "--engine", f"scripted:{engine}", "--json", timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["termination_reason"] == "completed" and result["reward"] == 1.0, result
    run_dir = Path(result["run_dir"])
    trial = json.loads((run_dir / "artifacts" / "result.json").read_text())
    assert trial["requested_models"] == ["harnessrl-policy"]
