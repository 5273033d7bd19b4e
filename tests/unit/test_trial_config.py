"""What ``harnessrl trial run`` runs with: the quickstart's settings for the default model
when nothing is said, flags and ``--config [run]`` over them, and bad input refused by name
before anything starts."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from harnessrl.errors import ConfigError, InvalidArgument
from harnessrl.paths import PROJECT_ROOT
from stack.trialconfig import QUICKSTART_DEFAULTS, TrialFlags, parse_options, resolve
from tests.cli_support import run_cli

QUICKSTART = PROJECT_ROOT / "examples" / "quickstart.toml"
HELLO = PROJECT_ROOT / "services" / "sandbox" / "examples" / "hello"


def test_the_defaults_are_the_quickstarts() -> None:
    data = tomllib.loads(QUICKSTART.read_text())
    run, proxy = data["run"], data["proxy"]
    assert run["harness"] == "mini-swe-agent" and run["engine"] == "local" and "model_path" not in run
    assert QUICKSTART_DEFAULTS.harness_options == run["harness_options"]
    assert QUICKSTART_DEFAULTS.temperature == run["temperature"]
    assert QUICKSTART_DEFAULTS.max_turns == run["max_turns"]
    assert QUICKSTART_DEFAULTS.proxy == {k: proxy[k] for k in QUICKSTART_DEFAULTS.proxy}


def test_no_flags_run_mini_swe_agent_as_the_quickstart_does() -> None:
    cfg = resolve(TrialFlags(harness="mini-swe-agent"), None)
    assert cfg.harness_options == {"config": "compact"} and cfg.temperature == 0.7
    assert cfg.max_turns == 3 and cfg.agent_timeout_s == 0  # the task's own agent timeout
    assert cfg.proxy_fields == {"main_requires_tools": False, "default_max_tokens": 128, "temperature": 0.7}
    assert cfg.model_dir.name == "SmolLM2-135M-Instruct"
    assert resolve(TrialFlags(), None).harness_options == {"config": "compact"}  # mini-swe-agent is the default


def test_flags_win_and_another_config_drops_the_small_model_defaults() -> None:
    cfg = resolve(TrialFlags(harness="mini-swe-agent", temperature=1.0, max_turns=5), None)
    assert cfg.temperature == 1.0 and cfg.max_turns == 5 and cfg.harness_options == {"config": "compact"}
    own = resolve(TrialFlags(harness="mini-swe-agent", harness_options={"config": "default"}), None)
    assert own.harness_options == {"config": "default"} and own.temperature is None and own.max_turns == 0
    assert own.proxy_fields == {} and own.defaults_used == []
    shell = resolve(TrialFlags(harness="shell"), None)
    assert shell.harness_options == {} and shell.temperature is None


def test_config_run_table_applies_what_fits_one_trial(tmp_path: Path) -> None:
    cfg_file = tmp_path / "trial.toml"
    cfg_file.write_text(
        '[run]\nharness = "mini-swe-agent"\nharness_options = { config = "tools" }\ntemperature = 0.5\n'
        'max_turns = 4\nagent_timeout_s = 60\nruns_dir = "runs"\n[proxy]\ndefault_max_tokens = 64\n'
    )
    cfg = resolve(TrialFlags(), cfg_file)
    assert cfg.harness_options == {"config": "tools"} and cfg.temperature == 0.5 and cfg.max_turns == 4
    assert cfg.agent_timeout_s == 60 and cfg.runs_dir == tmp_path / "runs"
    assert cfg.proxy_fields == {"default_max_tokens": 64, "temperature": 0.5}
    assert resolve(TrialFlags(temperature=0.9, harness_options={"config": "compact"}), cfg_file).temperature == 0.9
    cfg_file.write_text("[run]\nreward_weights = { correctness = 1.0, speed = 0.5 }\n")
    assert resolve(TrialFlags(), cfg_file).reward_weights == {"correctness": 1.0, "speed": 0.5}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[run]\nsteps = 3\n", "[run] steps does not apply to a single trial"),
        ("[run]\ntrain_tasks = ['x']\n", "[run] train_tasks does not apply"),
        ("[run]\nno_such = 1\n", "unknown setting 'no_such'"),
        ("[run]\ntemperature = 9\n", "[run]: temperature"),
        ("[run]\nharness = 'nope'\n", "unknown harness 'nope'"),
        ("[trainer]\nport = 1\n", "[trainer] does not apply to a single trial"),
        ("[proxy]\nno_such = 1\n", "[proxy]: unknown setting 'no_such'"),
        ("[run]\ntemperature = 0.5\n[proxy]\ntemperature = 0.9\n", "[proxy] temperature conflicts"),
        ("[run]\nreward_key = 'a'\nreward_weights = { b = 1.0 }\n", "[run]: "),
    ],
)
def test_config_refuses_what_a_trial_cannot_honour(tmp_path: Path, text: str, fragment: str) -> None:
    cfg_file = tmp_path / "trial.toml"
    cfg_file.write_text(text)
    with pytest.raises(ConfigError) as info:
        resolve(TrialFlags(), cfg_file)
    assert fragment in str(info.value) and str(cfg_file) in str(info.value)


def test_a_run_config_is_refused_by_its_first_run_only_field() -> None:
    with pytest.raises(ConfigError, match=r"quickstart.toml: \[run\] steps does not apply"):
        resolve(TrialFlags(), QUICKSTART)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-o", "config"], "--harness-option 'config': expected KEY=VALUE"),
        (["-o", "=x"], "expected KEY=VALUE"),
        (["--temperature", "9"], "--temperature"),
        (["--max-turns", "-1"], "--max-turns"),
        (["--harness", "nope"], "--harness 'nope': unknown harness"),
        (["--config", "/no/such.toml"], "/no/such.toml"),
    ],
)
def test_trial_run_bad_flags_exit_2_before_anything_starts(tmp_path: Path, args: list[str], fragment: str) -> None:
    runs = tmp_path / "runs"
    out = run_cli("trial", "run", "--task", str(HELLO), *args, env={"HARNESSRL_RUNS_DIR": str(runs)})
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert fragment in out.stderr and "Traceback" not in out.stderr
    assert not runs.exists()


def test_trial_run_missing_task_names_the_flag(tmp_path: Path) -> None:
    out = run_cli("trial", "run", "--task", str(tmp_path / "nope"), "--harness", "mini-swe-agent")
    assert out.returncode == 2 and f"--task {tmp_path / 'nope'}: not a directory" in out.stderr


def test_parse_options_rejects_an_empty_key() -> None:
    assert parse_options(["config=compact", "a=b=c"]) == {"config": "compact", "a": "b=c"}
    with pytest.raises(InvalidArgument, match="expected KEY=VALUE"):
        parse_options([" =1"])
