"""A newcomer's first ``harnessrl trial run``: the trial records its model and tokenizer,
so the dashboard decodes its transcript; and mini-swe-agent with no flags runs the
quickstart's compact config (text actions a small model can follow), with the options
plumbed through to the real harness."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx
import pytest

from harnessrl.paths import PROJECT_ROOT, default_model_dir
from services.sandbox.harnesses import get_harness
from tests.cli_support import run_cli
from tests.integration.test_dashboard.conftest import TOKEN, dashboard
from tests.sandbox_support import make_task

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(not (default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"),
]
HELLO = PROJECT_ROOT / "services" / "sandbox" / "examples" / "hello"
AGENT = """set -e
curl -sSf "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" \\
  -H 'content-type: application/json' \\
  -d '{"model": "harnessrl-policy", "messages": [{"role": "user", "content": "say hi"}]}' > /logs/agent/reply.json
grep -q 'Hello from the policy' /logs/agent/reply.json && echo hello > hello.txt
"""


def env_for(tmp: Path) -> dict[str, str]:
    return {
        "HARNESSRL_RUNS_DIR": str(tmp / "runs"),
        "HARNESSRL_SANDBOX_WORK_DIR": str(tmp / "trials"),
        "HARNESSRL_SANDBOX_CACHE_DIR": str(tmp / "cache"),
    }


def trial(tmp: Path, *args: str) -> dict[str, object]:
    out = run_cli("trial", "run", *args, "--json", env=env_for(tmp))
    assert out.returncode == 0, out.stdout + out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_a_single_trial_records_its_tokenizer_and_the_dashboard_decodes_it(tmp_path: Path) -> None:
    engine = tmp_path / "script.json"
    turns = [{"content": "Hello from the policy."}]
    engine.write_text(json.dumps({"context_window": 8192, "threads": {"main": turns, "*": turns}}))
    (tmp_path / "agent.sh").write_text(AGENT)
    args = ["--task", str(HELLO), "--harness", "shell", "--agent-script", str(tmp_path / "agent.sh")]
    result = trial(tmp_path, *args, "--engine", f"scripted:{engine}")
    assert result["reward"] == 1.0 and result["num_segments"] == 1, result
    trial_id = str(result["trial_id"])
    info = json.loads((tmp_path / "runs" / trial_id / "run.json").read_text())
    assert info["model"] == default_model_dir().name and info["tokenizer"] == str(default_model_dir())

    async def view() -> dict[str, object]:
        async with (
            dashboard(tmp_path / "runs") as d,
            httpx.AsyncClient(base_url=d.url, headers={"Authorization": f"Bearer {TOKEN}"}) as c,
        ):
            response = await c.get(f"/api/runs/{trial_id}/trajectories/{trial_id}")
            assert response.status_code == 200, response.text
            data: dict[str, object] = response.json()
            return data

    shown = asyncio.run(view())
    assert shown["decoded"] is True and shown["problems"] == [], shown["problems"]
    segments = shown["segments_detail"]
    assert isinstance(segments, list)
    messages = segments[0]["transcript"]
    assert [m["text"] for m in messages if m["role"] == "assistant"] == ["Hello from the policy."]
    assert any(m["role"] == "user" and m["text"] == "say hi" for m in messages)

    # export-parquet finds the run's store by its id, as export --trial does
    table = tmp_path / "trial.parquet"
    out = run_cli("capture", "export-parquet", "--run", trial_id, "--out", str(table), env=env_for(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(table).column("trial_id").to_pylist() == [trial_id]
    out = run_cli("capture", "export-parquet", "--run", "nope", "--out", str(table), env=env_for(tmp_path))
    assert out.returncode == 2 and "no run 'nope' under" in out.stderr and "--store DIR" in out.stderr


@pytest.mark.harness
def test_mini_swe_agent_with_no_flags_runs_the_compact_config(tmp_path: Path) -> None:
    missing = [p for p in get_harness("mini-swe-agent").install_paths() if not p.exists()]
    if missing:
        pytest.skip(f"mini-swe-agent is not installed ({missing[0]}); scripts/setup installs it")
    toml = '[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 60\nnetwork_mode = "no-network"\n'  # needs none
    task = make_task(tmp_path / "tasks", toml=toml)
    # Text actions in ```bash fences: what the compact config parses; mini-swe-agent's own
    # tool-calling config finds "No tool calls" in these and never writes hello.txt.
    replies = [
        {"content": "```bash\necho hello > hello.txt\n```"},
        {"content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"},
    ]
    engine = tmp_path / "script.json"
    engine.write_text(json.dumps({"context_window": 8192, "threads": {"main": replies}}))
    result = trial(tmp_path, "--task", str(task), "--harness", "mini-swe-agent", "--engine", f"scripted:{engine}")
    assert result["termination_reason"] == "completed" and result["reward"] == 1.0, result
    assert result["harness_options"] == {"config": "compact"} and result["temperature"] == 0.7
    assert result["max_turns"] == 3 and result["num_segments"] == 1
    info = json.loads((tmp_path / "runs" / str(result["trial_id"]) / "run.json").read_text())
    assert info["harness_options"] == {"config": "compact"} and info["temperature"] == 0.7

    # -o and --temperature reach the harness and the proxy: the tools config with the same
    # text replies fails its format (reward 0), at the temperature asked for.
    again = trial(tmp_path, "--task", str(task), "--harness", "mini-swe-agent", "--engine", f"scripted:{engine}",
                  "-o", "config=tools", "--temperature", "0.9", "--max-turns", "2")  # fmt: skip
    assert again["harness_options"] == {"config": "tools"} and again["temperature"] == 0.9
    assert again["max_turns"] == 2 and again["reward"] == 0.0, again
