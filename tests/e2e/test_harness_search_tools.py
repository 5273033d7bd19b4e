"""The real harnesses' own search tools work offline in the sandbox: OpenCode's
grep and glob (ripgrep, which OpenCode downloads at run time when it finds no
``rg``: a sandbox has no network), Claude Code's Grep and Glob (its own ripgrep)
and the ``rg`` Codex's model is told to use. The scripted policy calls each tool
on a task workspace holding a known file, and the prompt the engine saw next
must hold the match, not an error."""

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
from tests.sandbox_support import make_task, model_stack, run_harness_trial

pytestmark = [
    pytest.mark.harness,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]
MODEL = default_model_dir().name
TOML = "[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 60\n[environment]\nmemory_mb = 4096\n"
DOCKERFILE = "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY README.md /app/README.md\nCOPY docs /app/docs\n"
# The file the tools must find. Neither its line nor its name is in the instruction or in a
# tool call's arguments: a prompt that holds them got them from the tool's result.
NEEDLE_FILE = "docs/zebra_notes.md"
NEEDLE_LINE = "the ZEBRA42 marker lives on this line"
GREP_PATTERN = "ZEBRA4[0-9]"
GLOB_PATTERN = "**/*notes.md"
RIPGREP_ERRORS = ("ripgrep execution failed", "downloading ripgrep", "rg: not found", "rg: command not found")


def _call(tool: str, /, **arguments: Any) -> dict[str, Any]:
    return {"content": "Searching.", "tool_calls": [{"name": tool, "arguments": arguments}]}


def _write(name: str, key: str, **extra: Any) -> dict[str, Any]:
    return {
        "content": "Writing.",
        "tool_calls": [{"name": name, "arguments": {key: "echo hello > hello.txt", **extra}}],
    }


DONE = {"content": "Created hello.txt."}
TITLE: list[dict[str, Any]] = [{"content": "Search the docs"}]

# harness -> (main thread script, what the next prompts must hold, script extras)
CASES: dict[str, tuple[list[dict[str, Any]], list[str], dict[str, Any]]] = {
    "opencode": (
        [
            _call("grep", pattern=GREP_PATTERN),
            _call("glob", pattern=GLOB_PATTERN),
            _write("bash", "command", description="Write"),
            DONE,
        ],
        [NEEDLE_LINE, "zebra_notes.md"],
        {"chunk_tokens": 3},
    ),
    # Claude Code 2.1.332 (its native build) offers no Grep or Glob tool: its prompt tells the
    # model to search with `grep` and `find` in its Bash tool (a call of Grep is answered
    # "No such tool available").
    "claude-code": (
        [
            _call("Bash", command=f"grep -rn '{GREP_PATTERN}' .", description="Search"),
            _call("Bash", command="find . -name '*notes.md'", description="Find"),
            _write("Bash", "command", description="Write"),
            DONE,
        ],
        [NEEDLE_LINE, "zebra_notes.md"],
        {"chunk_tokens": 4},
    ),
    # Codex has no search tool of its own: its prompt tells the model to run rg in the shell.
    "codex": (
        [_call("exec_command", cmd=f"rg -n '{GREP_PATTERN}' ."), _write("exec_command", "cmd"), DONE],
        [NEEDLE_LINE],
        {"chunk_tokens": 3},
    ),
}


@pytest.fixture(params=["local", "docker"])
def backend_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "docker":
        engine = request.getfixturevalue("docker_engine")
        return {"backend": "docker", "docker": DockerBackendSettings(host=engine.host, verify_network="none")}
    return {"backend": "local"}


def _main_prompts(log: Path, trial_id: str) -> list[str]:
    from services.proxy.chat.tokenizer import Tokenizer  # loading it costs a second

    tok = Tokenizer(default_model_dir())
    records = [r for r in read_generation_log(log) if r["trial_id"] == trial_id and r["thread"] == "main"]
    return [tok.decode(r["prompt_ids"], skip_special_tokens=False) for r in records]


async def _run(
    tmp_path: Path,
    harness: str,
    main: list[dict[str, Any]],
    extra: dict[str, Any],
    backend: dict[str, Any],
    toml: str = TOML,
    dockerfile: str = DOCKERFILE,
    context: dict[str, str] | None = None,
) -> tuple[list[str], str]:
    """Runs the trial; returns the main thread's prompts as the engine saw them and the agent's log."""
    adapter = get_harness(harness)
    missing = [p for p in adapter.install_paths() if not p.exists()]
    if missing:
        pytest.skip(f"{harness} is not installed ({missing[0]}); scripts/setup installs it")
    task = make_task(
        tmp_path / "tasks",
        toml=toml,
        instruction="Search the docs, then create hello.txt containing hello",
        dockerfile=dockerfile,
        context={NEEDLE_FILE: f"# Notes\n\n{NEEDLE_LINE}\n", **(context or {})},
    )
    async with model_stack(tmp_path / "stack", {"main": main, "*": TITLE}, **extra) as stack:
        done = await run_harness_trial(stack, tmp_path, task, harness, "run-search", MODEL, **backend)
        trial_id, outcome, log = done.spec.trial_id, done.outcome, done.log
        assert outcome.termination_reason == TerminationReason.COMPLETED, (outcome.error, log)
        assert outcome.reward == 1.0, log
        prompts = _main_prompts(stack.engine_log, trial_id)
    assert len(prompts) == len(main), (len(prompts), log)
    return prompts, log


def _assert_found(prompt: str, expected: list[str]) -> None:
    errors = [e for e in RIPGREP_ERRORS if e in prompt]
    assert not errors, f"a search tool failed ({errors}): ...{prompt[-2500:]}"
    for text in expected:
        assert text in prompt, f"no {text!r} in the tool results the policy saw: ...{prompt[-2500:]}"


@pytest.mark.parametrize("harness", list(CASES))
async def test_search_tools_find_a_workspace_file_offline(
    tmp_path: Path, harness: str, backend_settings: dict[str, Any]
) -> None:
    main, expected, extra = CASES[harness]
    prompts, _ = await _run(tmp_path, harness, main, extra, backend_settings)
    _assert_found(prompts[-1], expected)


SKILL = "greeting-protocol"
SKILL_BODY = "House style marker SKILL-BODY-7731: greeting files hold one lowercase word."
SKILL_MD = f"---\nname: {SKILL}\ndescription: How to write greeting files such as hello.txt.\n---\n\n{SKILL_BODY}\n"


async def test_opencode_skill_tool_loads_a_task_skill_offline(tmp_path: Path, backend_settings: dict[str, Any]) -> None:
    """OpenCode's skill tool lists the skill's files with ripgrep before it answers."""
    main = [_call("skill", name=SKILL), _write("bash", "command", description="Write"), DONE]
    prompts, _ = await _run(
        tmp_path,
        "opencode",
        main,
        {"chunk_tokens": 3},
        backend_settings,
        toml=TOML.replace("memory_mb = 4096\n", "memory_mb = 4096\nskills_dir = '/skills'\n"),
        dockerfile=DOCKERFILE + "COPY skills /skills\n",
        context={f"skills/{SKILL}/SKILL.md": SKILL_MD},
    )
    _assert_found(prompts[-1], [SKILL_BODY])
