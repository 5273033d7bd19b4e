"""The mini-swe-agent harness option ``config``: default mini.yaml, the compact
text-action config for small models, or the short tool-calling one; an unknown name
is a setup error listing them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.harnesses import AgentContext, get_harness
from services.sandbox.harnesses.python_harnesses import MINI_CONFIGS
from services.sandbox.task.model import load_task
from tests.sandbox_support import make_task


def _ctx(tmp_path: Path, options: dict[str, str]) -> AgentContext:
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "run").mkdir(exist_ok=True)
    task_dir = tmp_path / "tasks" / "t"
    if not task_dir.exists():
        make_task(tmp_path / "tasks")
    return AgentContext(
        trial_id="t-1",
        task=load_task(task_dir),
        instruction="Write hello to hello.txt.",
        model="policy-model",
        max_turns=7,
        base_url="http://127.0.0.1:4100/trials/t-1/v1",
        token="tok",
        options=options,
        paths=SandboxPaths(),
        home=tmp_path / "home",
        runtime=tmp_path / "run",
    )


def _config_arg(argv: list[str]) -> str:
    return argv[argv.index("--exit-immediately") + 2]


def test_default_is_mini_swe_agents_own_config(tmp_path: Path) -> None:
    assert _config_arg(get_harness("mini-swe-agent").prepare(_ctx(tmp_path, {})).argv) == "mini.yaml"
    assert _config_arg(get_harness("mini-swe-agent").prepare(_ctx(tmp_path, {"config": "default"})).argv) == "mini.yaml"


def test_compact_config_is_written_to_the_runtime_dir(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, {"config": "compact"})
    argv = get_harness("mini-swe-agent").prepare(ctx).argv
    assert _config_arg(argv) == str(ctx.paths.runtime / "mini_compact.yaml")
    assert "agent.step_limit=7" in argv  # the trial's turn limit still wins over the file's
    config = yaml.safe_load((ctx.runtime / "mini_compact.yaml").read_text())
    assert config["model"]["model_class"] == "litellm_textbased"
    assert "{{task}}" in config["agent"]["instance_template"]
    assert len(config["agent"]["system_template"] + config["agent"]["instance_template"]) < 800


def test_compact_action_regex_takes_the_first_bash_block() -> None:
    source = MINI_CONFIGS["compact"]
    assert source is not None
    rx = yaml.safe_load(source.read_text())["model"]["action_regex"]

    def actions(text: str) -> list[str]:  # what mini-swe-agent's parse_regex_actions does
        return [a.strip() for a in re.findall(rx, text, re.DOTALL)]

    assert actions("Sure.\n```bash\necho hi > a.txt\n```\nthen\n```bash\nls\n```") == ["echo hi > a.txt"]
    assert actions("```sh\nls -la\n```") == ["ls -la"]
    assert actions("```\ncat a.txt\n```") == ["cat a.txt"]
    assert actions("Reply cut by max_tokens:\n```bash\necho partial") == ["echo partial"]
    assert actions("no code at all") == []


def test_tools_config_keeps_mini_swe_agents_tool_calling_model_class(tmp_path: Path) -> None:
    """Its own ``litellm`` class: the ``bash`` tool in every request, tool calls parsed by the proxy."""
    ctx = _ctx(tmp_path, {"config": "tools"})
    argv = get_harness("mini-swe-agent").prepare(ctx).argv
    assert _config_arg(argv) == str(ctx.paths.runtime / "mini_tools.yaml") and "agent.step_limit=7" in argv
    config = yaml.safe_load((ctx.runtime / "mini_tools.yaml").read_text())
    assert config["model"]["model_class"] == "litellm" and "action_regex" not in config["model"]
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in config["agent"]["system_template"]
    assert config["agent"]["cost_limit"] == 0 and config["agent"]["max_consecutive_format_errors"] == 0
    assert len(config["agent"]["system_template"] + config["agent"]["instance_template"]) < 800


def test_unknown_config_is_a_setup_error_listing_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(EnvSetupError, match=r"unknown config 'tiny'; valid: \['compact', 'default', 'tools'\]"):
        get_harness("mini-swe-agent").prepare(_ctx(tmp_path, {"config": "tiny"}))
