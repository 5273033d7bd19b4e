"""The config file of ``harnessrl run`` / ``preflight`` / ``eval``: one TOML file
with a ``[run]`` table and one table per service.

``[run]`` says what to train (tasks, harness, group size, steps); each service
table (``[gateway] [proxy] [sandbox] [capture_store] [trainer] [dashboard]``) is
validated by that service's own Settings class, so a typo anywhere is an error
naming the file, the table and the field, before anything starts. Values the run
decides (run id, model folder, groups per step, where the trainer writes) are
filled into the service tables; setting one of them differently in a service
table is an error too ("set it in [run]").

Embedded or distributed: a service whose address is given in ``[run]``
(``capture_target``, ``gateway_target``, ``sandbox_target``) is connected to,
every other one is started in-process on 127.0.0.1. Redis and S3 are chosen in
the service tables (``[capture_store] backend = "distributed"``, ``redis_url``,
``s3_*``; ``[sandbox] queue_url = "redis://..."``).

Relative paths in ``[run]`` (tasks, runs_dir, model_path) are relative to the
config file's folder, so a config works from any working directory.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from harnessrl import paths
from harnessrl.config import read_toml, validate
from harnessrl.errors import ConfigError
from services.capture_store.settings import Settings as CaptureSettings
from services.dashboard.settings import Settings as DashboardSettings
from services.gateway.settings import Settings as GatewaySettings
from services.proxy.settings import Settings as ProxySettings
from services.sandbox.common.settings import Settings as SandboxSettings
from services.sandbox.trial.lifecycle import FiniteFloat
from services.trainer.settings import Settings as TrainerSettings

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
TARGET_PATTERN = r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$"


class RunSection(BaseModel):
    """``[run]``: what to train and how the run is laid out."""

    model_config = ConfigDict(extra="forbid")

    run_id: str | None = Field(None, pattern=RUN_ID_PATTERN, description="Unset: run-<date>-<time>-<random>.")
    runs_dir: Path | None = Field(None, description="Root of run directories; unset: $HARNESSRL_HOME/runs.")
    steps: int = Field(3, ge=1, le=1_000_000, description="Optimizer steps of the run.")
    group_size: int = Field(4, ge=1, le=1024, description="G: trials per task in a group.")
    groups_per_step: int = Field(2, ge=1, le=4096, description="Groups (tasks) per optimizer step.")
    harness: str = Field("mini-swe-agent", min_length=1, description="Harness adapter name.")
    harness_options: dict[str, str] = Field(default_factory=dict, description="Options of the harness adapter.")
    engine: str = Field("local", min_length=1, description="Gateway engine: local, vllm, scripted:FILE, module:Class.")
    model_path: Path | None = Field(None, description="HF model folder; unset: the default model (SmolLM2).")
    model: str | None = Field(None, description="Model name the harness asks for; unset: the folder's name.")
    train_tasks: list[Path] = Field(min_length=1, description="Tasks or pools to train on.")
    eval_tasks: list[Path] = Field(default_factory=list, description="Tasks or pools of `harnessrl eval`.")
    families: list[str] = Field(default_factory=list, description="Keep only train tasks of these categories.")
    eval_families: list[str] = Field(default_factory=list, description="Keep only eval tasks of these categories.")
    temperature: float = Field(
        1.0, gt=0, le=5, description="Policy sampling temperature: the proxy samples with it, the trainer trains on it."
    )
    max_turns: int = Field(0, ge=0, description="Model calls per trial (0: the harness's own limit).")
    agent_timeout_s: float = Field(0.0, ge=0, description="Agent phase limit (0: the task's own).")
    verifier_timeout_s: float = Field(0.0, ge=0, description="Verify phase limit (0: the task's own).")
    allow_overlap: bool = Field(False, description="Run even when train and eval tasks overlap.")
    preflight: bool = Field(True, description="Run the preflight checks before training.")
    validate_tasks: bool = Field(True, description="Preflight runs each task's oracle (1) and a no-op (0), cached.")
    dashboard: bool = Field(False, description="Serve the dashboard over the runs dir while the run lasts.")
    calibrate: bool = Field(
        True,
        description="Measure the default model's plain generate tokens/s at the start (a few seconds; "
        "printed and kept in run.json): read the run's times against it.",
    )
    progress_every_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Without a terminal (a log, CI, nohup): a rollout progress line at least this often "
        "while trials run (run and eval).",
    )
    malloc_mmap_threshold_mib: float = Field(
        1.0,
        ge=0,
        le=1024,
        description="Blocks this large or larger are mapped alone by malloc and returned when freed (glibc; "
        "harnessrl/memory.py); 0: glibc's own threshold, which rises to 32 MiB: less kernel time (page faults), "
        "but freed activations stay resident (1.8 GB in a quickstart step).",
    )
    seed: int = Field(0, ge=0, description="Seed of the task choice per step.")
    eval_k: int = Field(4, ge=1, le=1024, description="Trials per eval task (pass@k, pass^k).")
    eval_every: int = Field(0, ge=0, description="Evaluate during the run at steps 0, N, 2N...; 0: never.")
    evaluate_only: bool = Field(
        False, description="The control of a learning run: only its evaluations, with the weights it starts from."
    )
    min_free_disk_gb: float = Field(2.0, ge=0, description="Preflight: free space needed under the runs dir.")
    capture_target: str | None = Field(None, pattern=TARGET_PATTERN, description="Connect to this capture store.")
    gateway_target: str | None = Field(None, pattern=TARGET_PATTERN, description="Connect to this gateway.")
    sandbox_target: str | None = Field(None, pattern=TARGET_PATTERN, description="Submit trials to this sandbox.")
    service_token: SecretStr | None = Field(None, description="Bearer token for the remote services.")
    reward_key: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="Train on this key of the verifier's reward.json; unset: Harbor's trial reward "
        "(the key 'reward', or the only key). A trial whose verifier did not write it is verifier_error.",
    )
    reward_weights: dict[str, FiniteFloat] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Train on the weighted sum of these reward.json keys, e.g. {correctness = 1.0, "
        "performance = 0.5}; keys not named count 0. Set reward_key or reward_weights, not both.",
    )

    @model_validator(mode="after")
    def _control_evaluates(self) -> RunSection:
        if self.evaluate_only and not (self.eval_every and self.eval_tasks):
            raise ValueError("evaluate_only needs eval_tasks and eval_every > 0: the evaluations are all it runs")
        return self

    @model_validator(mode="after")
    def _one_reward_selection(self) -> RunSection:
        if self.reward_key is not None and self.reward_weights is not None:
            raise ValueError("set reward_key or reward_weights, not both")
        if any(not key or len(key) > 128 for key in self.reward_weights or {}):
            raise ValueError("reward_weights keys must be 1-128 characters (keys of the verifier's reward.json)")
        return self

    @field_validator("harness")
    @classmethod
    def _known_harness(cls, value: str) -> str:
        from services.sandbox.harnesses import HARNESSES

        if value not in HARNESSES:
            raise ValueError(f"unknown harness {value!r}; valid: {sorted(HARNESSES)}")
        return value


@dataclass
class RunConfig:
    """A loaded, validated config: ``run`` plus each service's settings.

    A service that is connected to (its target is in ``[run]``) has no settings
    here (None). ``sandbox`` is always present: preflight and the local worker
    use it."""

    path: Path
    run: RunSection
    run_id: str
    run_dir: Path
    sandbox: SandboxSettings
    trainer: TrainerSettings
    gateway: GatewaySettings | None = None
    proxy: ProxySettings | None = None
    capture_store: CaptureSettings | None = None
    dashboard: DashboardSettings | None = None
    tables: dict[str, Any] = field(default_factory=dict)

    @property
    def distributed(self) -> bool:
        r = self.run
        remote = bool(r.capture_target or r.gateway_target or r.sandbox_target)
        stores = self.capture_store is not None and self.capture_store.backend == "distributed"
        return remote or stores or self.sandbox.queue_url.startswith("redis")

    @property
    def model_dir(self) -> Path:
        return self.run.model_path or paths.default_model_dir()

    @property
    def model_name(self) -> str:
        return self.run.model or self.model_dir.name

    def token(self) -> str | None:
        return self.run.service_token.get_secret_value() if self.run.service_token else None

    def resolved_toml(self) -> str:
        """The config as it runs (defaults filled, secrets masked): ``<run>/config.toml``."""
        out: dict[str, Any] = {"run": settings_table(self.run) | {"run_id": self.run_id}}
        for name in ("gateway", "proxy", "sandbox", "capture_store", "trainer", "dashboard"):
            settings = getattr(self, name)
            if settings is not None:
                out[name] = settings_table(settings)
        return tomli_w.dumps(out)


def settings_table(settings: BaseModel, *, reveal: bool = False) -> dict[str, Any]:
    """Settings as a TOML table, defaults filled; secrets masked unless ``reveal``
    (a config file written for the processes a bench starts)."""
    table: dict[str, Any] = settings.model_dump(mode="json")
    if reveal:
        _reveal(settings, table)
    return dict(_plain(table))


def _reveal(settings: BaseModel, table: dict[str, Any]) -> None:
    for name, value in settings:
        if isinstance(value, SecretStr):
            table[name] = value.get_secret_value()
        elif isinstance(value, BaseModel):
            _reveal(value, table[name])


def _plain(value: Any) -> Any:
    """TOML has no null: drop Nones (unset = default when read back)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def load(path: Path, *, run_id: str | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Reads and validates ``path``; ``run_id`` (``--resume``) and ``overrides`` (CLI
    flags, into ``[run]``) win over the file. Errors name the file and the field."""
    path = Path(path)
    data = read_toml(path)
    for name in ("tasks", "eval", "telemetry"):
        if name in data:
            raise ConfigError(f"{path}: [{name}] is not read by `harnessrl run`; put its settings in [run]")
    tables = {name: _table(data, name, path) for name in ("run", "gateway", "proxy", "sandbox")}
    tables |= {name: _table(data, name, path) for name in ("capture_store", "trainer", "dashboard")}
    run_data = dict(tables["run"]) | {k: v for k, v in (overrides or {}).items() if v is not None}
    if run_id is not None:
        run_data["run_id"] = run_id
    run = validate(RunSection, run_data, f"{path}: [run]")  # type: ignore[type-var]
    run = _resolve_paths(run, path.parent.resolve())
    rid = run.run_id or new_run_id()
    run_dir = (run.runs_dir or paths.runs_dir()) / rid
    cfg = RunConfig(
        path=path,
        run=run,
        run_id=rid,
        run_dir=run_dir,
        sandbox=_sandbox(tables["sandbox"], run, run_dir, path),
        trainer=_trainer(tables["trainer"], run, rid, run_dir, path),
        tables=tables,
    )
    if run.gateway_target is None:
        cfg.gateway = _gateway(tables["gateway"], run, path)
    elif tables["gateway"]:
        raise ConfigError(f"{path}: [gateway] is set but [run] gateway_target connects to a running gateway")
    if run.sandbox_target is None:
        cfg.proxy = _proxy(tables["proxy"], run, path)
    if run.capture_target is None:
        cfg.capture_store = _capture(tables["capture_store"], run_dir, path)
    elif tables["capture_store"]:
        raise ConfigError(f"{path}: [capture_store] is set but [run] capture_target connects to a running store")
    cfg.dashboard = _dashboard(tables["dashboard"], run, path)
    return cfg


def _table(data: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{name}] must be a table")
    if name == "run" and not table:
        raise ConfigError(f"{path}: [run] is missing (it needs at least train_tasks)")
    return dict(table)


def _resolve_paths(run: RunSection, base: Path) -> RunSection:
    def fix(p: Path) -> Path:
        p = p.expanduser()
        return p if p.is_absolute() else (base / p).resolve()

    return run.model_copy(
        update={
            "train_tasks": [fix(p) for p in run.train_tasks],
            "eval_tasks": [fix(p) for p in run.eval_tasks],
            "runs_dir": fix(run.runs_dir) if run.runs_dir else None,
            "model_path": fix(run.model_path) if run.model_path else None,
        }
    )


def _put(table: dict[str, Any], key: str, value: Any, where: str) -> None:
    """Fills a value the run decides; a different value already there is a conflict."""
    if value is None:
        return
    if key in table and _same(table[key], value) is False:
        raise ConfigError(f"{where}: {key} = {table[key]!r} conflicts with the run's {value!r}; set it in [run]")
    table[key] = value


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, Path):
        return Path(str(a)).expanduser().resolve() == b.resolve()
    return bool(a == b)


def _gateway(table: dict[str, Any], run: RunSection, path: Path) -> GatewaySettings:
    where = f"{path}: [gateway]"
    table = dict(table)
    _put(table, "engine", run.engine, where)
    _put(table, "model_path", run.model_path, where)
    table.setdefault("port", 0)
    return validate(GatewaySettings, table, where)  # type: ignore[type-var]


def _proxy(table: dict[str, Any], run: RunSection, path: Path) -> ProxySettings:
    where = f"{path}: [proxy]"
    table = dict(table)
    _put(table, "model_dir", run.model_path, where)
    _put(table, "temperature", run.temperature, where)
    if run.model:
        table.setdefault("served_model_names", [run.model])
    table.setdefault("port", 0)
    return validate(ProxySettings, table, where)  # type: ignore[type-var]


def _sandbox(table: dict[str, Any], run: RunSection, run_dir: Path, path: Path) -> SandboxSettings:
    table = dict(table)
    table.setdefault("artifacts_dir", run_dir / "artifacts")
    table.setdefault("port", 0)
    return validate(SandboxSettings, table, f"{path}: [sandbox]")  # type: ignore[type-var]


def _capture(table: dict[str, Any], run_dir: Path, path: Path) -> CaptureSettings:
    table = dict(table)
    if table.get("backend", "embedded") == "embedded":
        table.setdefault("store_dir", run_dir / "capture")
    table.setdefault("port", 0)
    return validate(CaptureSettings, table, f"{path}: [capture_store]")  # type: ignore[type-var]


def _trainer(table: dict[str, Any], run: RunSection, run_id: str, run_dir: Path, path: Path) -> TrainerSettings:
    where = f"{path}: [trainer]"
    table = dict(table)
    _put(table, "run_id", run_id, where)
    _put(table, "model_path", run.model_path, where)
    _put(table, "output_dir", run_dir / "trainer", where)
    rollout = table.get("rollout", {})
    if not isinstance(rollout, dict):
        raise ConfigError(f"{where}: rollout must be a table")
    rollout = dict(rollout)
    _put(rollout, "groups_per_step", run.groups_per_step, f"{where}.rollout")
    _put(rollout, "temperature", run.temperature, f"{where}.rollout")
    if "max_steps" in rollout:
        raise ConfigError(f"{where}.rollout: max_steps is decided by [run] steps; remove it")
    table["rollout"] = rollout
    table.setdefault("port", 0)
    return validate(TrainerSettings, table, where)  # type: ignore[type-var]


def _dashboard(table: dict[str, Any], run: RunSection, path: Path) -> DashboardSettings:
    where = f"{path}: [dashboard]"
    table = dict(table)
    _put(table, "runs_dir", run.runs_dir, where)
    table.setdefault("port", 0)
    return validate(DashboardSettings, table, where)  # type: ignore[type-var]
