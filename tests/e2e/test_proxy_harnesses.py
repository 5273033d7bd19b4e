"""Real, unmodified harnesses against the proxy (the scripted engine plays the
policy): each completes a multi-turn tool-using task, and every mask-1 token
of the capture is checked against the engine's own generation log
(invariants 1-4). FACTS.md says how each harness is pointed at a local endpoint."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harnessrl.paths import tools_dir
from tests.integration.proxy.stack import MODEL, Stack, check_faithful, script

pytestmark = pytest.mark.harness


def tool(rel: str) -> Path:
    path = tools_dir() / rel
    if not path.exists():
        pytest.skip(f"{path} is not installed (scripts/setup installs the harnesses)")
    return path


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
    return subprocess.run(
        cmd, cwd=cwd, env={**base, **env}, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    return home, work


def finish(stack: Stack, trial: str, min_turns: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = stack.close_trial(trial)
    segments = stack.export(trial)
    main = [s for s in segments if s["thread"] == "main"]
    assert summary["render_mismatches"] == 0 and summary["malformed_tool_calls"] == 0
    assert sum(s["num_turns"] for s in main) >= min_turns, summary
    assert all(s["closed"] for s in segments)
    check_faithful(segments, stack.engine_log(), trial)
    return summary, segments


CLAUDE_MAIN = [
    {
        "content": "I'll look first.",
        "tool_calls": [{"name": "Bash", "arguments": {"command": "ls -la", "description": "List files"}}],
    },
    {
        "reasoning": "Now write it.",
        "content": "Creating the file.",
        "tool_calls": [
            {"name": "Bash", "arguments": {"command": "echo hello > hello.txt", "description": "Create hello.txt"}}
        ],
    },
    {"content": "Created hello.txt containing hello."},
]


@pytest.fixture
def stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    threads, extra = request.param
    s = Stack(tmp_path, script(tmp_path, threads, **{"context_window": 200_000, **extra}))
    yield s
    s.stop()


@pytest.mark.parametrize(
    "stack", [({"main": CLAUDE_MAIN, "*": [{"content": "Title"}]}, {"chunk_tokens": 4})], indirect=True
)
def test_claude_code(stack: Stack, dirs: tuple[Path, Path]) -> None:
    home, work = dirs
    base, token = stack.new_trial("claude-1", model=MODEL)
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base.removesuffix("/v1"),
        "ANTHROPIC_API_KEY": token,
        "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    cmd = [
        str(tool("npm/node_modules/.bin/claude")),
        "-p",
        "Create hello.txt containing hello",
        "--output-format",
        "json",
    ]
    p = run([*cmd, "--model", MODEL, "--allowedTools", "Bash"], work, env)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout)
    assert result["is_error"] is False and result["num_turns"] >= 3, result
    assert result["result"] == "Created hello.txt containing hello."
    assert (work / "hello.txt").read_text() == "hello\n"
    finish(stack, "claude-1", 3)


CLAUDE_DELEGATING = [
    {
        "content": "Delegating.",
        "tool_calls": [
            {
                "name": "Agent",
                "arguments": {
                    "description": "Create file",
                    "prompt": "Create hello.txt containing hello",
                    "subagent_type": "general-purpose",
                },
            }
        ],
    },
    {"content": "The sub-agent created hello.txt."},
]
CLAUDE_SUBAGENT = [
    {
        "content": "Writing.",
        "tool_calls": [{"name": "Bash", "arguments": {"command": "echo hello > hello.txt", "description": "Write"}}],
    },
    {"content": "Created hello.txt."},
]


@pytest.mark.parametrize(
    "stack",
    [({"main": CLAUDE_DELEGATING, "subagent-1": CLAUDE_SUBAGENT, "*": [{"content": "Title"}]}, {})],
    indirect=True,
)
def test_claude_code_sub_agent_is_its_own_thread(stack: Stack, dirs: tuple[Path, Path]) -> None:
    """Invariant 4 with the real harness: Claude Code's Agent tool runs a sub-agent
    under its own system prompt; its turns form their own labelled thread."""
    home, work = dirs
    base, token = stack.new_trial("claude-agent", model=MODEL)
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base.removesuffix("/v1"),
        "ANTHROPIC_API_KEY": token,
        "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    cmd = [
        str(tool("npm/node_modules/.bin/claude")),
        "-p",
        "Create hello.txt containing hello",
        "--output-format",
        "json",
    ]
    p = run([*cmd, "--model", MODEL, "--allowedTools", "Bash", "--allowedTools", "Agent"], work, env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (work / "hello.txt").read_text() == "hello\n"
    summary, segments = finish(stack, "claude-agent", 2)
    threads = {t["name"]: (t["kind"], t["num_turns"]) for t in summary["threads"]}
    assert threads["subagent-1"] == ("subagent", 2), threads
    sub = [s for s in segments if s["thread"] == "subagent-1"]
    assert len(sub) == 1 and sub[0]["trainable"] and sub[0]["num_turns"] == 2


@pytest.mark.parametrize("stack", [({"main": CLAUDE_MAIN}, {"context_window": 8000})], indirect=True)
def test_claude_code_understands_context_overflow(stack: Stack, dirs: tuple[Path, Path]) -> None:
    """Claude Code's first request (~12k tokens) does not fit an 8k window: it must
    read the proxy's answer as "prompt too long", and the trial records the overflow."""
    home, work = dirs
    base, token = stack.new_trial("claude-overflow", model=MODEL)
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base.removesuffix("/v1"),
        "ANTHROPIC_API_KEY": token,
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    cmd = [str(tool("npm/node_modules/.bin/claude")), "-p", "Create hello.txt", "--output-format", "json"]
    p = run([*cmd, "--model", MODEL], work, env)
    result = json.loads(p.stdout)
    assert result["is_error"] and result["terminal_reason"] == "prompt_too_long", result
    summary = stack.close_trial("claude-overflow")
    assert summary["context_overflow"] is True and summary["num_turns"] == 0 and summary["engine_errors"] == 0


MINI_MAIN = [
    {"content": "Let me look.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]},
    {"content": "Creating it.", "tool_calls": [{"name": "bash", "arguments": {"command": "echo hello > hello.txt"}}]},
    {
        "content": "Submitting.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}],
    },
]


@pytest.mark.parametrize("stack", [({"main": MINI_MAIN}, {})], indirect=True)
def test_mini_swe_agent(stack: Stack, dirs: tuple[Path, Path]) -> None:
    home, work = dirs
    base, token = stack.new_trial("mini-1", model=MODEL)
    env = {
        "HOME": str(home),
        "MSWEA_CONFIGURED": "true",
        "MSWEA_GLOBAL_CONFIG_DIR": str(home / "mswea"),
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    traj = home / "traj.json"
    cmd = [str(tool("mini-swe-agent/bin/mini")), "-m", f"openai/{MODEL}", "-t", "Create hello.txt containing hello"]
    cmd += ["--yolo", "--exit-immediately", "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={base}"]
    cmd += ["-c", f"model.model_kwargs.api_key={token}", "-c", f"environment.cwd={work}", "-o", str(traj)]
    p = run(cmd, work, env)
    assert (work / "hello.txt").read_text() == "hello\n", p.stdout[-3000:] + p.stderr[-3000:]
    info = json.loads(traj.read_text())["info"]
    assert info["exit_status"] == "Submitted", info
    finish(stack, "mini-1", 3)


CODEX_MAIN = [
    {"content": "Looking.", "tool_calls": [{"name": "exec_command", "arguments": {"cmd": "ls -la"}}]},
    {
        "reasoning": "Write it now.",
        "content": "Creating.",
        "tool_calls": [{"name": "exec_command", "arguments": {"cmd": "echo hello > hello.txt"}}],
    },
    {"content": "Created hello.txt."},
]


@pytest.mark.parametrize(
    "stack", [({"main": CODEX_MAIN, "*": [{"content": "Title"}]}, {"chunk_tokens": 3})], indirect=True
)
def test_codex(stack: Stack, dirs: tuple[Path, Path]) -> None:
    home, work = dirs
    base, token = stack.new_trial("codex-1", model=MODEL)
    (home / ".codex").mkdir()
    (home / ".codex/config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "hrl"\n\n[model_providers.hrl]\nname = "hrl"\n'
        f'base_url = "{base}"\nwire_api = "responses"\nenv_key = "HRL_API_KEY"\n'
    )
    cmd = [str(tool("npm/node_modules/.bin/codex")), "exec", "--skip-git-repo-check"]
    p = run(
        [*cmd, "--dangerously-bypass-approvals-and-sandbox", "Create hello.txt containing hello"],
        work,
        {"HOME": str(home), "HRL_API_KEY": token},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Created hello.txt." in p.stdout
    assert (work / "hello.txt").read_text() == "hello\n"
    finish(stack, "codex-1", 3)


OPENCODE_MAIN = [
    {
        "content": "Looking.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la", "description": "List files"}}],
    },
    {
        "content": "Creating.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "echo hello > hello.txt", "description": "Write"}}],
    },
    {"content": "Created hello.txt."},
]


@pytest.mark.parametrize(
    "stack", [({"main": OPENCODE_MAIN, "*": [{"content": "Create hello"}]}, {"chunk_tokens": 3})], indirect=True
)
def test_opencode(stack: Stack, dirs: tuple[Path, Path]) -> None:
    home, work = dirs
    base, token = stack.new_trial("opencode-1", model=MODEL)
    provider = {"npm": "@ai-sdk/openai-compatible", "name": "hrl", "options": {"baseURL": base, "apiKey": token}}
    config = {
        "autoupdate": False,
        "share": "disabled",
        "model": f"hrl/{MODEL}",
        "provider": {"hrl": {**provider, "models": {MODEL: {"name": MODEL}}}},
    }
    env = {
        "HOME": str(home),
        "OPENCODE_CONFIG_CONTENT": json.dumps(config),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        **{f"XDG_{k}_HOME": str(home / k.lower()) for k in ("CONFIG", "DATA", "CACHE", "STATE")},
    }
    p = run([str(tool("npm/node_modules/.bin/opencode")), "run", "Create hello.txt containing hello"], work, env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (work / "hello.txt").read_text() == "hello\n"
    summary, _ = finish(stack, "opencode-1", 3)
    kinds = {t["name"]: t["kind"] for t in summary["threads"]}
    assert kinds == {"main": "main", "side-1": "side"}, "the title call is its own labelled thread"


OPENHANDS_MAIN = [
    {"content": "Looking.", "tool_calls": [{"name": "terminal", "arguments": {"command": "ls -la"}}]},
    {"content": "Creating.", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo hello > hello.txt"}}]},
    {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"message": "Created hello.txt"}}]},
]


@pytest.mark.parametrize("stack", [({"main": OPENHANDS_MAIN}, {})], indirect=True)
def test_openhands_sdk(stack: Stack, dirs: tuple[Path, Path]) -> None:
    home, work = dirs
    base, token = stack.new_trial("openhands-1", model=MODEL)
    driver = Path(__file__).parent / "drivers" / "openhands_driver.py"
    cmd = [
        str(tool("openhands/bin/python")),
        str(driver),
        base,
        token,
        MODEL,
        str(work),
        "Create hello.txt containing hello",
    ]
    env = {"HOME": str(home), "OPENHANDS_SUPPRESS_BANNER": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    p = run(cmd, work, env)
    assert p.returncode == 0 and "FINISHED" in p.stdout, p.stderr[-3000:]
    assert (work / "hello.txt").read_text() == "hello\n"
    finish(stack, "openhands-1", 3)
