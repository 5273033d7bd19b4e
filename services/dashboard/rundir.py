"""Reading a run directory (its layout: stack/rundir.py, which writes it) without trusting it.

Every file is optional to the reader: what is missing or malformed becomes a
*problem* shown on the run's page (with the file and line), and the panels
that still have data render. Nothing here talks to a live service.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harnessrl.config import format_validation_error
from harnessrl.errors import InvalidArgument, NotFound

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Files that make a folder a run directory (any one of them).
MARKERS = ("run.json", "metrics.jsonl", "config.toml", "capture")
MAX_LINE_PROBLEMS = 5


class CaptureRef(BaseModel):
    """Where the run's capture store is: an embedded directory or a gRPC target."""

    model_config = ConfigDict(extra="allow")

    backend: Literal["embedded", "distributed"]
    dir: str | None = None
    target: str | None = None


class RunInfo(BaseModel):
    """``run.json``; unknown fields are kept (shown in the overview), known ones checked."""

    model_config = ConfigDict(extra="allow")

    run_id: str
    # "trial": one ``harnessrl trial run`` (no trainer, no config file; run id = trial id).
    kind: Literal["run", "trial"] = "run"
    created_at: float | str | None = None
    status: Literal["running", "done", "failed", "stopped"] = "running"
    group_size: int | None = Field(None, ge=1)
    batch_groups: int | None = Field(None, ge=1)
    model: str | None = None
    # The folder of the tokenizer the run's tokens were made with (absent in older runs: ``model``).
    tokenizer: str | None = None
    harness: str | None = None
    engine: str | None = None
    steps_planned: int | None = Field(None, ge=0)
    capture: CaptureRef | None = None
    trainer_target: str | None = None
    # CPU-seconds by component from the trainer's start to the run's end (harnessrl.cpu; absent in older runs).
    cpu_s: dict[str, float] | None = None

    @property
    def live(self) -> bool:
        return self.status == "running"


@dataclass
class StepRecord:
    """One line of metrics.jsonl, the same shape as the Trainer Metrics RPC."""

    step: int
    wall_time: float
    values: dict[str, float]

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "wall_time": self.wall_time, "values": self.values}


@dataclass
class RunDir:
    """A run directory as read now: its info (or None), and what is wrong with it."""

    run_id: str
    path: Path
    info: RunInfo | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.info is not None and self.info.status == "running"

    def capture_dir(self) -> Path | None:
        """The embedded store directory named by run.json (relative to the run)."""
        ref = self.info.capture if self.info else None
        if ref is None or ref.backend != "embedded":
            return None
        return (self.path / (ref.dir or "capture")).resolve()

    def config_text(self) -> str | None:
        try:
            return (self.path / "config.toml").read_text()
        except (OSError, UnicodeDecodeError):
            return None

    def config(self) -> dict[str, Any]:
        """The resolved run config; {} when absent or broken (a problem says which)."""
        text = self.config_text()
        if text is None:
            return {}
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            return {}


def check_run_id(run_id: str) -> str:
    if not RUN_ID.match(run_id):
        raise InvalidArgument(f"bad run id {run_id!r}: letters, digits, '.', '_', '-' (max 128)")
    return run_id


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / m).exists() for m in MARKERS)


def list_run_ids(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if RUN_ID.match(p.name) and is_run_dir(p))


def open_run(root: Path, run_id: str) -> RunDir:
    """Reads ``root/run_id``; NotFound when no such run directory exists."""
    path = root / check_run_id(run_id)
    if not is_run_dir(path):
        raise NotFound(f"no run {run_id!r} under {root}")
    run = RunDir(run_id, path)
    run.info = _read_info(path, run_id, run.problems)
    _check_files(run)
    return run


def _read_info(path: Path, run_id: str, problems: list[str]) -> RunInfo | None:
    file = path / "run.json"
    if not file.exists():
        problems.append("run.json is missing: status, group size, model and capture store are unknown")
        return None
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        problems.append(f"run.json is not valid JSON: {e}")
        return None
    if not isinstance(data, dict):
        problems.append("run.json must hold a JSON object")
        return None
    try:
        info = RunInfo.model_validate(data)
    except ValidationError as e:
        problems.append(f"run.json: {format_validation_error(e)}")
        return None
    if info.run_id != run_id:
        problems.append(f"run.json names run {info.run_id!r} but the folder is {run_id!r}")
    return info


def _check_files(run: RunDir) -> None:
    info, path = run.info, run.path
    if info is not None and info.kind == "trial":
        _check_capture(run, info)
        return
    if not (path / "config.toml").exists():
        run.problems.append("config.toml is missing: the resolved config cannot be shown")
    elif run.config_text() is None:
        run.problems.append("config.toml is unreadable")
    else:
        try:
            tomllib.loads(run.config_text() or "")
        except tomllib.TOMLDecodeError as e:
            run.problems.append(f"config.toml is not valid TOML: {e}")
    # An evaluation that never trained (``steps_planned = 0``) has no trainer metrics by design.
    evaluation = info is not None and info.steps_planned == 0
    if not (path / "metrics.jsonl").exists() and not (info and info.live and info.trainer_target) and not evaluation:
        run.problems.append("metrics.jsonl is missing: no trainer metrics (training panels are empty)")
    if info is None:
        return
    _check_capture(run, info)
    if info.live and not info.trainer_target:
        run.problems.append("run.json: status is running but trainer_target is not set (metrics from file)")


def _check_capture(run: RunDir, info: RunInfo) -> None:
    if info.capture is None:
        run.problems.append("run.json names no capture store: trajectories cannot be shown")
    elif info.capture.backend == "embedded":
        store = run.capture_dir()
        if store is None or not (store / "index.sqlite3").exists():
            run.problems.append(f"capture store directory {store} is missing (run.json: capture.dir)")
    elif not info.capture.target:
        run.problems.append("run.json: a distributed capture store needs capture.target (host:port)")


def runs_holding(root: Path, trial_id: str) -> list[str]:
    """Runs under ``root`` whose directory shows the trial, cheapest first and without
    opening a store: the single-trial run of that id, then every run whose artifacts
    hold a folder of that trial (``artifacts/<run id>/<trial id>``)."""
    if not RUN_ID.match(trial_id):
        raise InvalidArgument(f"bad trial id {trial_id!r}: letters, digits, '.', '_', '-' (max 128)")
    out = [trial_id] if is_run_dir(root / trial_id) else []
    if root.is_dir():
        out += [r for r in list_run_ids(root) if r != trial_id and (root / r / "artifacts" / r / trial_id).is_dir()]
    return out


def read_metrics(run: RunDir) -> tuple[list[StepRecord], list[str]]:
    """metrics.jsonl -> records sorted by step; bad lines are skipped and reported.

    Two line shapes are read: harnessrl's trainer writes ``{"step", "wall_time",
    "values"}``; verl's file logger (``trainer.logger`` with ``file``, its
    ``VERL_FILE_LOGGER_PATH`` set to the run's ``metrics.jsonl``) writes ``{"step",
    "data"}``, without a wall time. Lines of one step are merged (verl logs a step's
    validation apart from its training metrics): a later value of a key wins."""
    records: dict[int, StepRecord] = {}
    problems: list[str] = []
    for lineno, obj in _jsonl(run.path / "metrics.jsonl", problems):
        try:
            step, values, wall_time = _metrics_line(obj)
        except (KeyError, TypeError, ValueError) as e:
            _line_problem(problems, f"metrics.jsonl line {lineno}: {type(e).__name__}: {e}")
            continue
        clean = {str(k): float(v) for k, v in values.items() if _number(v)}
        if step in records:
            records[step].values.update(clean)
            records[step].wall_time = max(records[step].wall_time, wall_time)
        else:
            records[step] = StepRecord(step, wall_time, clean)
    return [records[s] for s in sorted(records)], problems


def _metrics_line(obj: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
    """(step, values, wall time) of one line in either shape (see ``read_metrics``)."""
    key = "values" if "values" in obj else "data" if "data" in obj else None  # data: verl's file logger
    if key is None:
        raise ValueError("a line needs 'values' (harnessrl's trainer) or 'data' (verl's file logger)")
    step, values = obj["step"], obj[key]
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(values, dict):
        raise TypeError(f"step must be an integer and {key} an object")
    wall_time = obj.get("wall_time", 0.0)
    if not _number(wall_time):
        raise TypeError(f"wall_time must be a number, got {wall_time!r}")
    return step, values, float(wall_time)


def read_eval(run: RunDir) -> tuple[list[dict[str, Any]], list[str]]:
    """eval.jsonl rows (per task pass@k / pass^k); bad lines are reported."""
    problems: list[str] = []
    rows = [obj for _, obj in _jsonl(run.path / "eval.jsonl", problems)]
    return rows, problems


def _jsonl(path: Path, problems: list[str]) -> list[tuple[int, dict[str, Any]]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        problems.append(f"{path.name} is unreadable: {e}")
        return []
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            # A run being written may end in a partial line: only the last one is forgiven.
            if lineno < len(text.splitlines()) or text.endswith("\n"):
                _line_problem(problems, f"{path.name} line {lineno}: not JSON ({e.msg})")
            continue
        if not isinstance(obj, dict):
            _line_problem(problems, f"{path.name} line {lineno}: not a JSON object")
            continue
        out.append((lineno, obj))
    return out


def _line_problem(problems: list[str], line: str) -> None:
    if len(problems) < MAX_LINE_PROBLEMS:
        problems.append(line)
    elif len(problems) == MAX_LINE_PROBLEMS:
        problems.append("... more bad lines not shown")


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
