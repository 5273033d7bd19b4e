"""Harnesses declared in TOML files: every shipped file loads into the registry; a malformed
file is refused naming its field (and the CLI exits 2); a declaration renders the trial's
command, env and config files from its templates."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from harnessrl.errors import ConfigError
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import SandboxPaths
from services.sandbox.harnesses import BUILTIN, HARNESSES, AgentContext, get_harness
from services.sandbox.harnesses.declared import SHIPPED_DIR, DeclaredHarness, declared_class
from services.sandbox.harnesses.declared_spec import load, parse
from services.sandbox.task.model import load_task
from tests.cli_support import run_cli

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(SHIPPED_DIR.glob("*.toml"))
GOOD: dict[str, Any] = {
    "harness": {"name": "demo", "protocol": "openai-chat"},
    "install": {"npm": "demo-agent", "version": "1.2.3", "bin": "demo"},
    "run": {"argv": ["-p", "{instruction}", "--model", "{model}"], "max_turns_argv": ["--turns", "{max_turns}"]},
    "env": {"DEMO_BASE_URL": "{base_url}", "DEMO_KEY": "{token}"},
    "files": [{"path": ".demo/config.json", "json": {"url": "{proxy_root}", "models": ["{model}"], "n": 1}}],
    "collect": {"home": [".demo/sessions"]},
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    """GOOD with the dotted ``path`` set to ``value`` (a list index as a number)."""
    data = json.loads(json.dumps(GOOD))
    *parents, last = path.split(".")
    node: Any = data
    for key in parents:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    node[int(last) if last.isdigit() else last] = value
    return data


def test_shipped_files_are_registered_beside_the_built_in_adapters() -> None:
    names = {load(p).harness.name for p in SHIPPED}
    assert {"pi", "qwen-code", "copilot-cli", "cline"} <= names
    for name in names:
        assert issubclass(HARNESSES[name], DeclaredHarness)
        assert name not in BUILTIN
        assert get_harness(name).name == name


def test_a_good_declaration_parses() -> None:
    decl = parse(GOOD, "good.toml")
    assert decl.install.registry == "npm" and decl.install.package == "demo-agent"
    assert decl.files[0].json_ == {"url": "{proxy_root}", "models": ["{model}"], "n": 1}


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("surprise", 1, "surprise: unknown field"),
        ("harness.nmae", "x", "harness.nmae: unknown field"),
        ("harness.name", "Bad Name", "harness.name"),
        ("harness.protocol", "grpc", "harness.protocol"),
        ("install.version", "^1.2.3", "install.version"),
        ("install.version", "latest", "install.version"),
        ("install.pypi", "demo-agent", "set exactly one of npm and pypi"),
        ("install.bin", "../demo", "install.bin"),
        ("install.python", "python2", "install.python"),
        ("install.node", ">=24", "install.node"),
        ("run.argv", ["{instructions}"], "run.argv"),
        ("run.argv", ["{model!r}"], "run.argv"),
        ("run.argv", ["{"], "run.argv"),
        ("run.kill_after_s", 0, "run.kill_after_s"),
        ("env.HOME", "/x", "env"),
        ("env.DEMO_KEY", "{secret}", "env"),
        ("files.0.path", "../escape", "files[0].path"),
        ("files.0.path", "/etc/passwd", "files[0].path"),
        ("files.0.text", "both", "set exactly one of text and json"),
        ("files.0.mode", "999", "files[0].mode"),
        ("files.0.json", {"deep": ["{nope}"]}, "files[0].json"),
        ("collect.home", ["../../etc"], "collect.home"),
        ("extras.skills_dir", ".demo/skills", ""),  # fine alone: checked below with skills_refused
        ("conformance.not_applicable", {"tools": "no"}, "conformance"),
    ],
)
def test_a_malformed_declaration_names_its_field(path: str, value: Any, field: str) -> None:
    data = with_change(path, value)
    if path == "extras.skills_dir":
        data["extras"]["skills_refused"] = "no skills"
        field = "set skills_dir or skills_refused, not both"
    if path.startswith("conformance"):
        data["conformance"]["shell_tool"] = "bash"
    with pytest.raises(ConfigError) as err:
        parse(data, "bad.toml")
    assert field in str(err.value) and "bad.toml" in str(err.value)


def test_a_missing_section_and_invalid_toml_are_named(tmp_path: Path) -> None:
    data = dict(GOOD)
    del data["install"]
    with pytest.raises(ConfigError, match="install: Field required"):
        parse(data, "x.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[harness\nname = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(bad)


def test_the_cli_refuses_a_malformed_file_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    text = (SHIPPED_DIR / "pi.toml").read_text().replace('version = "0.73.1"', 'version = ">=0.73"')
    bad.write_text(text.replace('name = "pi"', 'name = "pi-copy"'))
    result = run_cli("harness", "add", str(bad), "--no-run", env={"HARNESSRL_HARNESS_DIR": str(tmp_path / "reg")})
    assert result.returncode == 2, result
    assert "install.version" in result.stderr
    assert not (tmp_path / "reg").exists()
    shipped = run_cli("harness", "add", str(SHIPPED_DIR / "pi.toml"), "--no-run")
    assert shipped.returncode == 2 and "taken by a harness this checkout ships" in shipped.stderr


def test_a_user_file_may_not_reuse_a_name(tmp_path: Path) -> None:
    from services.sandbox.harnesses.declared import declared_harnesses

    reg = tmp_path / "reg"
    reg.mkdir()
    (reg / "mine.toml").write_text((SHIPPED_DIR / "pi.toml").read_text())
    env = {"HARNESSRL_HARNESS_DIR": str(reg)}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        with pytest.raises(ConfigError, match=r"'pi' is already taken by .*pi\.toml"):
            declared_harnesses.__wrapped__(frozenset(BUILTIN))


def test_a_declaration_renders_the_trials_command_env_and_files(tmp_path: Path) -> None:
    data = tomllib.loads((SHIPPED_DIR / "pi.toml").read_text())
    data["run"]["max_turns_argv"] = ["--turns", "{max_turns}"]
    data["run"]["kill_after_s"] = 600
    adapter = declared_class(parse(data, "pi.toml"))()
    home, runtime = tmp_path / "home", tmp_path / "runtime"
    ctx = AgentContext(
        trial_id="t1",
        task=load_task(ROOT / "tasks" / "builtin" / "train" / "echo-00"),
        instruction='Say "hi" {literally}',
        model="policy",
        max_turns=7,
        base_url="http://proxy/trials/t1/v1",
        token="tok",
        options={},
        paths=SandboxPaths(),
        home=home,
        runtime=runtime,
    )
    cmd = adapter.prepare(ctx)
    assert cmd.argv[:3] == ["timeout", "--signal=KILL", "600"]
    assert cmd.argv[-5:] == ["--model", "harnessrl/policy", 'Say "hi" {literally}', "--turns", "7"]
    assert cmd.env["PI_OFFLINE"] == "1" and cmd.env["XDG_CONFIG_HOME"] == "/home/agent/.config"
    models = json.loads((home / ".pi/agent/models.json").read_text())
    provider = models["providers"]["harnessrl"]
    assert provider["baseUrl"] == "http://proxy/trials/t1/v1" and provider["apiKey"] == "tok"
    assert provider["models"] == [{"id": "policy"}]
    assert (home / ".pi/agent/models.json").stat().st_mode & 0o777 == 0o600
    assert adapter.log_paths() == [".pi/agent/sessions"]
    assert str(PurePosixPath(ctx.paths.home) / ".pi/agent/skills") not in " ".join(cmd.setup or [])  # no skills


def test_check_installed_names_the_missing_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_TOOLS_DIR", str(tmp_path / "tools"))
    with pytest.raises(EnvSetupError, match="harness install qwen-code"):
        get_harness("qwen-code").check_installed()


def test_a_scripted_sub_agent_cell_cannot_also_be_not_applicable() -> None:
    data = with_change("conformance", {"shell_tool": "bash", "sub_agent": {"name": "agent", "arguments": {}}})
    data["conformance"]["not_applicable"] = {"sub-agent": "none"}
    with pytest.raises(ConfigError, match="conformance: sub_agent scripts the sub-agent cell"):
        parse(data, "x.toml")


@pytest.mark.parametrize(
    ("compaction", "not_applicable", "message"),
    [
        ({}, {"compaction": "none"}, "compaction scripts the compaction cell"),
        ({"side_call": True}, {"side calls": "none"}, "compaction.side_call scripts the side calls cell"),
        ({"env": {"X": "{nope}"}}, {}, "conformance.compaction.env"),
        ({"files": [{"path": "../x", "text": "y"}]}, {}, "conformance.compaction.files[0].path"),
        ({"sidecall": True}, {}, "conformance.compaction.sidecall: unknown field"),
        ({"main_goes_on": False, "side_call": True}, {}, "give not_applicable.compaction its reason"),
        ({"main_goes_on": False}, {"compaction": "why"}, "scripts only the side calls cell: set side_call"),
    ],
)
def test_a_scripted_compaction_cell_is_checked(compaction: Any, not_applicable: Any, message: str) -> None:
    data = with_change("conformance", {"shell_tool": "bash", "compaction": compaction})
    data["conformance"]["not_applicable"] = not_applicable
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse(data, "x.toml")


def test_declared_cells_follow_the_file() -> None:
    """A compaction table scripts the compaction cell (and the side calls cell when its summary is
    a call of its own) with the file's settings; sub_agent_finish ends the sub-agent's thread."""
    from stack.conformance.declared import declared_scenarios
    from stack.conformance.matrix import (
        Scenario,
        check_compaction,
        check_compaction_and_side_calls,
        check_tools_and_side_calls,
    )

    data = with_change("conformance", {"shell_tool": "bash", "sub_agent": {"name": "agent", "arguments": {}}})
    data["conformance"]["sub_agent_finish"] = {"name": "complete_task", "arguments": {"result": "ok"}}
    data["conformance"]["compaction"] = {
        "side_call": True,
        "env": {"DEMO_LIMIT": "1000"},
        "files": [{"path": ".demo/config.json", "json": {"threshold": 0.1}}],
    }
    cells = declared_scenarios(parse(data, "x.toml"))
    compaction, side = cells["compaction"], cells["side calls"]
    assert isinstance(compaction, Scenario) and isinstance(side, Scenario)
    assert compaction.check is check_compaction and side.check is check_compaction_and_side_calls
    assert [f.path for f in compaction.options["files"]] == [".demo/config.json"]
    assert compaction.options["env"] == {"DEMO_LIMIT": "1000"}
    assert compaction.threads["main"][0]["tool_calls"][0]["arguments"]["command"] == "seq 1 2000"
    sub = cells["sub-agent"]
    assert isinstance(sub, Scenario)
    assert sub.threads["subagent-1"][-1]["tool_calls"] == [{"name": "complete_task", "arguments": {"result": "ok"}}]
    data["conformance"]["compaction"]["main_goes_on"] = False  # only its summary call is checked
    data["conformance"]["not_applicable"] = {"compaction": "it never goes on from the summary"}
    cells = declared_scenarios(parse(data, "x.toml"))
    assert cells["compaction"] == "it never goes on from the summary"
    side = cells["side calls"]
    assert isinstance(side, Scenario) and side.check is check_tools_and_side_calls
    del data["conformance"]["compaction"], data["conformance"]["not_applicable"]
    cells = declared_scenarios(parse(data, "x.toml"))
    assert isinstance(cells["compaction"], str) and isinstance(cells["side calls"], str)


def test_an_own_node_is_for_npm_packages_only() -> None:
    data = with_change("install", {"pypi": "demo-agent", "version": "1.0", "bin": "demo", "node": "24.22.3"})
    with pytest.raises(ConfigError, match="install: node applies to an npm package only"):
        parse(data, "x.toml")


def test_the_example_harness_file_parses_and_differs_from_pi_in_its_model_entry_and_compaction() -> None:
    small = load(ROOT / "examples" / "harnesses" / "pi-small.toml")
    pi = load(SHIPPED_DIR / "pi.toml")
    assert small.harness.name == "pi-small" and small.install == pi.install and small.run == pi.run
    model = small.files[0].json_["providers"]["harnessrl"]["models"][0]  # type: ignore[index]
    assert model == {"id": "{model}", "contextWindow": 8192, "maxTokens": 128}
    # Pi's default reserve (16,384) is wider than the window: it would compact after every answer.
    compaction = small.files[1].json_["compaction"]  # type: ignore[index]
    assert compaction["reserveTokens"] < model["contextWindow"] // 2


def test_hermes_reads_the_trials_endpoint_from_its_config_file(tmp_path: Path) -> None:
    """Hermes Agent 0.19 reads no OPENAI_BASE_URL: its config.yaml names the custom provider."""
    adapter = get_harness("hermes-agent")
    home = tmp_path / "home"
    ctx = AgentContext(
        trial_id="t1",
        task=load_task(ROOT / "tasks" / "builtin" / "train" / "echo-00"),
        instruction="Do it",
        model="policy",
        max_turns=0,
        base_url="http://proxy/trials/t1/v1",
        token="tok",
        options={},
        paths=SandboxPaths(),
        home=home,
        runtime=tmp_path / "runtime",
    )
    cmd = adapter.prepare(ctx)
    assert cmd.argv[-7:] == ["-z", "Do it", "-m", "policy", "--provider", "custom", "--yolo"]
    config = (home / ".hermes/config.yaml").read_text()
    assert "provider: custom" in config and "base_url: http://proxy/trials/t1/v1" in config
    assert "api_key: tok" in config and "default: policy" in config
    assert (home / ".hermes/config.yaml").stat().st_mode & 0o777 == 0o600
