"""docker-compose.yml and deploy/Dockerfile, validated statically (no Docker
engine runs on these machines): the compose schema, that every command exists
in the CLI, that every HARNESSRL_* variable is a field of its service's
settings class with a valid value, and that ports and targets line up."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from harnessrl.config import ServiceSettings, load_section
from stack.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
ENV_EXAMPLE = ROOT / "deploy" / "env.example"
# Read by harnessrl.paths (where things live), not by one service's settings.
PATH_VARIABLES = {"HARNESSRL_HOME", "HARNESSRL_TOOLS_DIR"}


def settings_classes() -> dict[str, tuple[str, type[ServiceSettings]]]:
    """Env prefix -> (config section, settings class) of every service."""
    from services.capture_store.settings import Settings as Capture
    from services.dashboard.settings import Settings as Dashboard
    from services.gateway.settings import Settings as Gateway
    from services.proxy.settings import Settings as Proxy
    from services.sandbox.common.settings import Settings as Sandbox
    from services.trainer.settings import Settings as Trainer

    classes = {
        "capture_store": Capture,
        "dashboard": Dashboard,
        "gateway": Gateway,
        "proxy": Proxy,
        "sandbox": Sandbox,
        "trainer": Trainer,
    }
    return {str(cls.model_config.get("env_prefix")): (section, cls) for section, cls in classes.items()}


def example_env() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if "=" in line and line[0] != "#")
    return {k.strip(): v.strip() for k, v in pairs}


def substitute(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} forms."""

    def one(match: re.Match[str]) -> str:
        name, op, rest = re.match(r"(\w+)(?::([-?]))?(.*)", match.group(1)).groups()  # type: ignore[union-attr]
        return env.get(name, rest[0:] if op == "-" else "")

    return re.sub(r"\$\{([^}]+)\}", one, value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def dockerfile_stages() -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {}
    current = ""
    for line in DOCKERFILE.read_text().splitlines():
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            current = match.group(1)
            stages[current] = []
        elif current and line.strip() and not line.lstrip().startswith("#"):
            stages[current].append(line.strip())
    return stages


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_compose_file_passes_the_compose_schema(profile: str) -> None:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose (Debian package, installed by scripts/setup) validates the file offline"
    env = {**os.environ, **example_env()}
    proc = subprocess.run(
        [binary, "-f", str(COMPOSE), "--profile", profile, "config", "-q"],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr


def test_every_command_exists_in_the_cli(compose: dict[str, Any]) -> None:
    stages = dockerfile_stages()
    for name, service in compose["services"].items():
        command = service.get("command")
        if "build" not in service:
            continue
        assert service["build"]["target"] in stages, f"{name}: no stage {service['build']['target']!r}"
        assert command[0] == "harnessrl", name
        result = CliRunner().invoke(app, [*command[1:], "--help"])
        assert result.exit_code == 0, f"{name}: `{' '.join(command)}` is not a CLI command: {result.output}"
        # The image's own CMD (what runs when compose names no command) is a command too.
        cmd_line = [ln for ln in stages[service["build"]["target"]] if ln.startswith("CMD")]
        assert cmd_line, f"stage {service['build']['target']} has no CMD"
        image_cmd = yaml.safe_load(cmd_line[-1][3:])
        assert CliRunner().invoke(app, [*image_cmd[1:], "--help"]).exit_code == 0, f"stage CMD {image_cmd}"


def test_every_variable_is_a_valid_setting(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    classes = settings_classes()
    env = example_env()
    monkeypatch.setenv("HARNESSRL_HOME", str(tmp_path))
    for name, service in compose["services"].items():
        variables = {k: substitute(str(v), env) for k, v in (service.get("environment") or {}).items()}
        ours = {k: v for k, v in variables.items() if k.startswith("HARNESSRL_") and k not in PATH_VARIABLES}
        if not ours:
            continue
        prefixes = {p for p in classes if any(k.startswith(p) for k in ours)}
        assert len(prefixes) == 1, f"{name}: variables of several services: {sorted(prefixes)}"
        prefix = prefixes.pop()
        section, cls = classes[prefix]
        for key in ours:
            field = key[len(prefix) :].lower().split("__")[0]  # TABLE__FIELD sets a nested field
            assert field in cls.model_fields, f"{name}: {key} is not a field of {cls.__module__}.Settings"
        with monkeypatch.context() as m:
            for key, value in ours.items():
                m.setenv(key, value)
            load_section(cls, None, section)  # raises ConfigError naming the field


def test_ports_and_targets_line_up(compose: dict[str, Any]) -> None:
    services = compose["services"]
    stages = dockerfile_stages()
    listening: dict[str, int] = {}
    for name, service in services.items():
        env = service.get("environment") or {}
        port = next((int(v) for k, v in env.items() if k.startswith("HARNESSRL_") and k.endswith("_PORT")), None)
        if port is None:
            continue
        listening[name] = port
        host = next(v for k, v in env.items() if k.endswith("_HOST"))
        assert host == "0.0.0.0", f"{name}: a container must listen on all its interfaces"
        published = {int(p.rsplit(":", 1)[1]) for p in service.get("ports", [])}
        assert not published or port in published, f"{name}: listens on {port}, publishes {published}"
        exposed = [ln for ln in stages[service["build"]["target"]] if ln.startswith("EXPOSE")]
        assert exposed == [f"EXPOSE {port}"], f"{name}: image exposes {exposed}, service listens on {port}"
    for name, service in services.items():
        for alias in (service.get("networks") or {}).get("default", {}).get("aliases", []):
            assert listening.get(alias) in (None, listening.get(name)), f"{name}: alias {alias} on another port"
            listening[alias] = listening[name]
    for name, service in services.items():
        for key, value in (service.get("environment") or {}).items():
            match = re.fullmatch(r"(?:\w+://)?([a-z][a-z0-9-]*):(\d+)(?:/.*)?", str(value))
            if not (key.startswith("HARNESSRL_") and match) or match.group(1) not in listening:
                continue
            target, port = match.group(1), int(match.group(2))
            assert listening[target] == port, f"{name}: {key} is {target}:{port}; it listens on {listening[target]}"


def test_published_ports_bind_loopback_only(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for mapping in service.get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), f"{name}: {mapping} would listen beyond this machine"


def test_dockerfile_copies_only_what_exists() -> None:
    for lines in dockerfile_stages().values():
        for line in lines:
            if line.startswith("COPY") and "--from=" not in line:
                for source in line.split()[1:-1]:
                    assert (ROOT / source).exists(), f"deploy/Dockerfile copies missing {source}"
