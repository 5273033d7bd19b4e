"""A Harbor task's ``skills_dir`` and ``mcp_servers`` reach each real, unmodified harness in
a sandbox: the image holds the skills (``COPY skills /skills``) and a tiny MCP server
(tests/e2e/fixtures/mcp_server.py: stdio in the sandbox, or streamable HTTP as a compose
sidecar reached by its service name); the scripted policy calls the server's tool and opens
the skill. What the harness sent the proxy (the engine's log of the rendered prompts) proves
it read our config: it offers the MCP tool, lists the skill, and the tool's answer (only the
server knows it) and the skill's body come back. Codex offers its MCP tools as a Responses
'namespace' tool (the proxy offers them to the model as mcp__NAME__TOOL and answers a call as
(namespace, name)), and its sub-agent tools likewise (multi_agent_v1); mini-swe-agent gets the
servers in its instruction and refuses skills, as in Harbor."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from harnessrl.paths import default_model_dir
from services.gateway.engines.scripted import read_generation_log
from services.sandbox.common.settings import DockerBackendSettings
from services.sandbox.harnesses import get_harness
from services.sandbox.trial.lifecycle import TerminationReason
from tests.sandbox_support import ModelStack, make_task, model_stack, run_harness_trial

pytestmark = [
    pytest.mark.harness,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]
MODEL = default_model_dir().name
SERVER = (Path(__file__).parent / "fixtures" / "mcp_server.py").read_text()
WORD = "PAPAYA-42"  # only the MCP server in the sandbox answers it
SKILL = "greeting-protocol"
SKILL_BODY = "House style marker SKILL-BODY-7731: greeting files hold one lowercase word."
SKILL_MD = f"---\nname: {SKILL}\ndescription: How to write greeting files such as hello.txt.\n---\n\n{SKILL_BODY}\n"
TOML = (
    "[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 60\n"
    "[environment]\nmemory_mb = 4096\nskills_dir = '/skills'\n"
    "[[environment.mcp_servers]]\nname = 'notes'\ntransport = 'stdio'\ncommand = 'python3'\n"
    "args = ['/opt/mcp/server.py']\n"
)
DOCKERFILE = (
    "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY README.md /app/README.md\n"
    "COPY skills /skills\nCOPY server.py /opt/mcp/server.py\n"
)


def _call(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"content": "Working on it.", "tool_calls": [{"name": tool, "arguments": arguments}]}


# Per harness: its MCP tool's name as it offers it (None: it takes no MCP server, the task
# sets none), the scripted main thread, script options.
CASES: dict[str, tuple[str | None, list[dict[str, Any]], dict[str, Any]]] = {
    "claude-code": (
        "mcp__notes__secret_word",
        [
            _call("mcp__notes__secret_word"),
            _call("Skill", skill=SKILL),  # its Skill tool loads the body into the context
            _call("Bash", command="echo hello > hello.txt", description="Write"),
            {"content": "Created hello.txt."},
        ],
        {"chunk_tokens": 4},
    ),
    "opencode": (
        "notes_secret_word",
        [
            _call("notes_secret_word"),
            # Its skill tool lists the skill's files with ripgrep, which it downloads (no network
            # here): the policy reads the SKILL.md at the location OpenCode announced.
            _call("read", filePath=f"/home/agent/.config/opencode/skills/{SKILL}/SKILL.md"),
            _call("bash", command="echo hello > hello.txt", description="Write"),
            {"content": "Created hello.txt."},
        ],
        {"chunk_tokens": 3},
    ),
    "openhands-sdk": (
        "secret_word",
        [
            _call("secret_word"),
            _call("terminal", command=f"cat /home/agent/.agents/skills/{SKILL}/SKILL.md"),
            _call("terminal", command="echo hello > hello.txt"),
            _call("finish", message="Created hello.txt"),
        ],
        {},
    ),
    "codex": (
        "mcp__notes__secret_word",  # Responses namespace mcp__notes, tool secret_word (proxy/responses/tools.py)
        [
            _call("mcp__notes__secret_word"),
            _call("exec_command", cmd=f"cat /home/agent/.agents/skills/{SKILL}/SKILL.md"),
            _call("exec_command", cmd="echo hello > hello.txt"),
            {"content": "Created hello.txt."},
        ],
        {"chunk_tokens": 3},
    ),
}


def _prompts(stack: ModelStack, trial_id: str) -> list[str]:
    from services.proxy.chat.tokenizer import Tokenizer  # loading it costs a second

    tokenizer = Tokenizer(default_model_dir())
    records = [r for r in read_generation_log(stack.engine_log) if r["trial_id"] == trial_id]
    return [tokenizer.decode(r["prompt_ids"], skip_special_tokens=False) for r in records if r["thread"] == "main"]


async def _run(
    tmp_path: Path,
    harness: str,
    toml: str | None = None,
    backend: dict[str, Any] | None = None,
    main: list[dict[str, Any]] | None = None,
    files: dict[str, str] | None = None,
) -> tuple[Any, list[str], str]:
    adapter = get_harness(harness)
    missing = [p for p in adapter.install_paths() if not p.exists()]
    if missing:
        pytest.skip(f"{harness} is not installed ({missing[0]}); scripts/setup installs it")
    tool_name, script, extra = CASES.get(harness, (None, [], {}))
    main = main or script
    if toml is None:
        toml = TOML if tool_name is not None else TOML[: TOML.index("[[environment.mcp_servers]]")]
    context = {"skills/" + SKILL + "/SKILL.md": SKILL_MD, "server.py": SERVER, **(files or {})}
    task = make_task(
        tmp_path / "tasks", toml=toml, instruction="Create hello.txt", dockerfile=DOCKERFILE, context=context
    )
    async with model_stack(tmp_path / "stack", {"main": main, "*": [{"content": "Hello"}]}, **extra) as stack:
        backend = backend or {"backend": "local"}
        done = await run_harness_trial(stack, tmp_path, task, harness, "run-x", MODEL, **backend)
        trial_id, outcome, log = done.spec.trial_id, done.outcome, done.log
        return outcome, _prompts(stack, trial_id), log


@pytest.mark.parametrize(
    ("harness", "on"), [*((h, "local") for h in CASES), ("claude-code", "docker")], ids=lambda v: str(v)
)
async def test_the_harness_offers_and_uses_the_tasks_skill_and_mcp_tool(
    tmp_path: Path, harness: str, on: str, request: pytest.FixtureRequest
) -> None:
    backend: dict[str, Any] = {"backend": "local"}
    if on == "docker":
        engine = request.getfixturevalue("docker_engine")
        backend = {"backend": "docker", "docker": DockerBackendSettings(host=engine.host, verify_network="none")}
    outcome, prompts, log = await _run(tmp_path, harness, backend=backend)
    assert outcome.termination_reason == TerminationReason.COMPLETED, (outcome.error, log)
    assert prompts, log
    first, last = prompts[0], prompts[-1]
    tool_name = CASES[harness][0]
    assert SKILL in first and "How to write greeting files" in first, "the skill was not listed"
    if tool_name is not None:
        assert tool_name in first, f"the MCP tool was not offered: {log}"
        assert WORD in last, "the MCP tool's answer (from the server in the sandbox) never came back"
    if harness == "codex":  # its sub-agent tools, on by default in 0.171 (feature multi_agent): offered too
        assert '"name": "multi_agent_v1__spawn_agent"' in first, "Codex's spawn_agent was not offered"
    assert "SKILL-BODY-7731" in last, "the skill's body was never loaded"
    assert outcome.reward == 1.0, log


async def test_a_skills_dir_the_image_lacks_fails_setup_naming_the_field(tmp_path: Path) -> None:
    outcome, prompts, _ = await _run(tmp_path, "claude-code", TOML.replace("'/skills'", "'/nowhere'"))
    assert outcome.termination_reason == TerminationReason.ENV_SETUP_FAILED
    assert "environment.skills_dir: /nowhere is not a directory in the sandbox" in (outcome.error or "")
    assert prompts == []  # the harness never started


MINI = [
    _call("bash", command="echo hello > hello.txt"),
    _call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
]


async def test_mini_swe_agent_gets_the_servers_in_its_instruction_as_in_harbor(tmp_path: Path) -> None:
    toml = TOML.replace("skills_dir = '/skills'\n", "")
    outcome, prompts, log = await _run(tmp_path, "mini-swe-agent", toml, main=MINI)
    assert outcome.termination_reason == TerminationReason.COMPLETED, (outcome.error, log)
    listed = "MCP Servers:\nThe following MCP servers are available for this task.\n"
    assert listed + "- notes: stdio transport, command: python3 /opt/mcp/server.py" in prompts[0]
    assert outcome.reward == 1.0, log


async def test_mini_swe_agent_refuses_skills_by_name(tmp_path: Path) -> None:
    outcome, prompts, _ = await _run(tmp_path, "mini-swe-agent", main=MINI)
    assert outcome.termination_reason == TerminationReason.ENV_SETUP_FAILED
    assert "'mini-swe-agent' cannot take task.toml environment.skills_dir" in (outcome.error or "")
    assert prompts == []


# A streamable-HTTP MCP server as a compose sidecar, reached by its service name.
SIDECAR_TOML = (
    "[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 60\n[environment]\nmemory_mb = 4096\n"
    "[[environment.mcp_servers]]\nname = 'web'\ntransport = 'streamable-http'\nurl = 'http://mcp-server:8000/mcp'\n"
)
SIDECAR_COMPOSE = """\
services:
  main:
    build:
      context: .
    depends_on:
      mcp-server:
        condition: service_healthy
  mcp-server:
    build:
      context: ./mcp
    command: ["python3", "/srv/server.py", "--http", "8000"]
    healthcheck:
      test: ["CMD", "python3", "-c", "import socket; socket.create_connection(('localhost', 8000), 2)"]
      interval: 300ms
      timeout: 5s
      retries: 60
"""
SIDECAR_FILES = {
    "docker-compose.yaml": SIDECAR_COMPOSE,
    "mcp/Dockerfile": "FROM python:3.11-slim\nCOPY server.py /srv/server.py\n",
    "mcp/server.py": SERVER,
}


# Per harness: the scripted main thread that calls the sidecar's tool, then writes the file.
SIDECAR_MAIN = {
    "claude-code": [
        _call("mcp__web__secret_word"),
        _call("Bash", command="echo hello > hello.txt", description="Write"),
        {"content": "Created hello.txt."},
    ],
    # Codex 0.171's MCP client speaks streamable HTTP itself ([mcp_servers.web] url).
    "codex": [
        _call("mcp__web__secret_word"),
        _call("exec_command", cmd="echo hello > hello.txt"),
        {"content": "Created hello.txt."},
    ],
}


@pytest.mark.parametrize("harness", sorted(SIDECAR_MAIN))
async def test_the_harness_reaches_an_http_mcp_server_in_a_compose_sidecar(
    tmp_path: Path, harness: str, request: pytest.FixtureRequest
) -> None:
    engine = request.getfixturevalue("docker_engine")
    backend = {"backend": "docker", "docker": DockerBackendSettings(host=engine.host, verify_network="none")}
    main = SIDECAR_MAIN[harness]
    outcome, prompts, log = await _run(tmp_path, harness, SIDECAR_TOML, backend, main, SIDECAR_FILES)
    assert outcome.termination_reason == TerminationReason.COMPLETED, (outcome.error, log)
    assert "mcp__web__secret_word" in prompts[0], f"the sidecar's tool was not offered: {log}"
    assert WORD in prompts[-1], "the sidecar's answer never came back"
    assert outcome.reward == 1.0, log
