"""What one ``harnessrl trial run`` runs with: flags, then the config file, then the
defaults the quickstart uses for the default model.

A newcomer's first trial is ``trial run --task T --harness mini-swe-agent`` with no
other flag. mini-swe-agent's own config asks for JSON tool calls, which the default
model (SmolLM2-135M) cannot follow, so with the default model and no ``config``
harness option the trial runs as the quickstart does (``QUICKSTART_DEFAULTS``:
the compact config, temperature 0.7, 3 turns, and the proxy settings that config
needs). ``tests/unit/test_trial_config.py`` pins these values to
``examples/quickstart.toml``.

``--config FILE``: its ``[run]`` fields that mean something for one trial are
honoured (``TRIAL_FIELDS``), the rest of ``[run]`` is refused by name, as is any
table other than ``[run] [sandbox] [proxy] [gateway]``: nothing is ignored silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl import paths
from harnessrl.config import load_section, read_toml, validate
from harnessrl.errors import ConfigError, InvalidArgument
from services.gateway.settings import Settings as GatewaySettings
from services.proxy.settings import Settings as ProxySettings
from services.sandbox.common.settings import Settings as SandboxSettings
from stack.runconfig import RunSection

DEFAULT_HARNESS = "mini-swe-agent"
# [run] fields a single trial honours; every other [run] field is a run's (steps, groups, evaluation...).
TRIAL_FIELDS = (
    "harness",
    "harness_options",
    "engine",
    "model_path",
    "model",
    "temperature",
    "max_turns",
    "agent_timeout_s",
    "verifier_timeout_s",
    "runs_dir",
    "reward_key",
    "reward_weights",
)
TRIAL_TABLES = ("run", "sandbox", "proxy", "gateway")


@dataclass(frozen=True)
class SmallModelDefaults:
    """How the quickstart runs mini-swe-agent with the default model (examples/quickstart.toml)."""

    harness_options: dict[str, str]
    temperature: float
    max_turns: int
    proxy: dict[str, Any]


QUICKSTART_DEFAULTS = SmallModelDefaults(
    harness_options={"config": "compact"},
    temperature=0.7,
    max_turns=3,
    # The compact config's requests carry no tools: the main thread is the first one.
    proxy={"main_requires_tools": False, "default_max_tokens": 128},
)


@dataclass
class TrialFlags:
    """What the command line says; None: not given."""

    harness: str | None = None
    engine: str | None = None
    model: str | None = None
    harness_options: dict[str, str] = field(default_factory=dict)
    temperature: float | None = None
    max_turns: int | None = None


@dataclass
class TrialConfig:
    """A trial's resolved configuration; ``defaults_used`` says what came from QUICKSTART_DEFAULTS."""

    harness: str
    engine: str | None
    model: str | None
    model_dir: Path
    harness_options: dict[str, str]
    temperature: float | None
    max_turns: int
    agent_timeout_s: float
    verifier_timeout_s: float
    runs_dir: Path
    sandbox: SandboxSettings
    reward_key: str | None = None  # which of the verifier's rewards the trial reports ([run] reward_key)
    reward_weights: dict[str, float] | None = None
    proxy_fields: dict[str, Any] = field(default_factory=dict)
    gateway_fields: dict[str, Any] = field(default_factory=dict)
    defaults_used: list[str] = field(default_factory=list)


def parse_options(items: list[str] | None, flag: str = "--harness-option") -> dict[str, str]:
    """``KEY=VALUE`` items as a dict; a malformed one is an InvalidArgument naming it."""
    options: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidArgument(f"{flag} {item!r}: expected KEY=VALUE")
        options[key.strip()] = value
    return options


def _run_table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """``[run]`` restricted to TRIAL_FIELDS, validated with the run's own bounds."""
    table = data.get("run", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [run] must be a table")
    for key in table:
        if key in RunSection.model_fields and key not in TRIAL_FIELDS:
            raise ConfigError(
                f"{path}: [run] {key} does not apply to a single trial; it honours {', '.join(TRIAL_FIELDS)}"
            )
    for name in data:
        if name not in TRIAL_TABLES:
            raise ConfigError(f"{path}: [{name}] does not apply to a single trial (it reads {list(TRIAL_TABLES)})")
    # train_tasks is required by RunSection and refused above: a placeholder to validate the rest.
    run = validate(RunSection, {**table, "train_tasks": ["."]}, f"{path}: [run]")  # type: ignore[type-var]
    base = path.parent.resolve()
    out = {k: getattr(run, k) for k in table}
    for key in ("model_path", "runs_dir"):
        if out.get(key) is not None:
            p = Path(out[key]).expanduser()
            out[key] = p if p.is_absolute() else (base / p).resolve()
    return out


def _service_table(data: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{name}] must be a table")
    return dict(table)


def resolve(flags: TrialFlags, config: Path | None) -> TrialConfig:
    """Flags win over ``config``'s [run], which wins over QUICKSTART_DEFAULTS (default model +
    mini-swe-agent + no ``config`` option only). Errors name the flag or the file and field."""
    data = read_toml(config) if config is not None else {}
    run = _run_table(data, config) if config is not None else {}
    harness = flags.harness or run.get("harness") or DEFAULT_HARNESS
    _check_harness(harness)
    options = {**run.get("harness_options", {}), **flags.harness_options}
    model_path: Path | None = run.get("model_path")
    quick = harness == DEFAULT_HARNESS and model_path is None and "config" not in options
    used: list[str] = []

    def pick(name: str, flag: Any, fallback: Any) -> Any:
        if flag is not None:
            return flag
        if name in run:
            return run[name]
        if quick and fallback is not None:
            used.append(name)
        return fallback

    d = QUICKSTART_DEFAULTS
    if quick:
        options = {**d.harness_options, **options}
        used.append("harness_options")
    temperature = pick("temperature", flags.temperature, d.temperature if quick else None)
    where = f"{config}" if config is not None else "trial"
    proxy = _service_table(data, "proxy", config) if config is not None else {}
    gateway = _service_table(data, "gateway", config) if config is not None else {}
    if quick:
        proxy = {**d.proxy, **proxy}
    if temperature is not None:
        if "temperature" in proxy and proxy["temperature"] != temperature:
            raise ConfigError(f"{where}: [proxy] temperature conflicts with the trial's {temperature}; set it in [run]")
        proxy["temperature"] = temperature
    if model_path is not None:
        gateway = _put(gateway, "model_path", model_path, f"{where}: [gateway]")
        proxy = _put(proxy, "model_dir", model_path, f"{where}: [proxy]")
    model = flags.model or run.get("model")
    if model:
        proxy.setdefault("served_model_names", [model])
    proxy_settings = validate(ProxySettings, {**proxy, "port": 0}, f"{where}: [proxy]")  # type: ignore[type-var]
    validate(GatewaySettings, {**gateway, "port": 0}, f"{where}: [gateway]")  # type: ignore[type-var]
    return TrialConfig(
        harness=harness,
        engine=flags.engine or run.get("engine"),
        model=model,
        model_dir=proxy_settings.model_dir,
        harness_options=options,
        temperature=temperature,
        max_turns=pick("max_turns", flags.max_turns, d.max_turns if quick else 0),
        agent_timeout_s=run.get("agent_timeout_s", 0.0),  # 0: the task's own (the quickstart's 300 s is a run's)
        verifier_timeout_s=run.get("verifier_timeout_s", 0.0),
        runs_dir=run.get("runs_dir") or paths.runs_dir(),
        reward_key=run.get("reward_key"),
        reward_weights=run.get("reward_weights"),
        sandbox=load_section(SandboxSettings, config, "sandbox"),  # the environment applies too
        proxy_fields=proxy,
        gateway_fields=gateway,
        defaults_used=used,
    )


def _check_harness(name: str) -> None:
    from services.sandbox.harnesses import HARNESSES

    if name not in HARNESSES:
        raise InvalidArgument(f"--harness {name!r}: unknown harness; valid harnesses: {sorted(HARNESSES)}")


def _put(table: dict[str, Any], key: str, value: Path, where: str) -> dict[str, Any]:
    if key in table and Path(str(table[key])).expanduser().resolve() != value:
        raise ConfigError(f"{where}: {key} = {table[key]!r} conflicts with [run] model_path; set it in [run]")
    return {**table, key: value}


def describe(cfg: TrialConfig) -> str:
    """One line for the user: what came from the quickstart's defaults, and how to change it."""
    if not cfg.defaults_used:
        return ""
    opts = " ".join(f"-o {k}={v}" for k, v in cfg.harness_options.items())
    return (
        f"default model + {cfg.harness}: the quickstart's settings ({opts}, --temperature {cfg.temperature}, "
        f"--max-turns {cfg.max_turns}); "
        "-o config=default for mini-swe-agent's own tool-calling config"
    )
