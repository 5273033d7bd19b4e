"""Writing a run directory (the dashboard's ``services/dashboard/rundir.py`` reads it).

``<runs_dir>/<run_id>/``: run.json (status running -> done | failed | stopped),
config.toml (the resolved config), metrics.jsonl (one line per trainer step, the
Metrics RPC shape), eval.jsonl (per-task pass@k / pass^k rows), capture/ (the
embedded store), trainer/ (checkpoints, TensorBoard), artifacts/ (per-trial logs).
Every write of run.json is atomic (tmp + rename); jsonl files are appended line by line.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl import cpu
from harnessrl.config import read_toml
from harnessrl.errors import AlreadyExists, ConfigError, FailedPrecondition, NotFound
from services.trainer.service import TrainerService
from stack.runconfig import RunConfig

STATUSES = ("running", "done", "failed", "stopped")


class RunDirectory:
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.path = cfg.run_dir

    @property
    def info_path(self) -> Path:
        return self.path / "run.json"

    def read_info(self) -> dict[str, Any]:
        try:
            data = json.loads(self.info_path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def create(self, *, resume: bool) -> None:
        """A fresh run refuses an existing run; a resumed one needs it, and not live."""
        self.check(resume=resume)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "config.toml").write_text(self.cfg.resolved_toml())

    def check(self, *, resume: bool) -> None:
        """What ``create`` refuses, checked without writing: the CLI asks before preflight."""
        exists = self.info_path.exists()
        if resume:
            if not exists:
                raise NotFound(f"no run {self.cfg.run_id!r} to resume under {self.path.parent}")
            info = self.read_info()
            pid = info.get("pid")
            if info.get("status") == "running" and isinstance(pid, int) and _alive(pid) and pid != os.getpid():
                raise FailedPrecondition(f"run {self.cfg.run_id!r} is still running (pid {pid})")
            made = self._recorded_seed()
            if made is not None and made != self.cfg.run.seed:
                raise FailedPrecondition(
                    f"run {self.cfg.run_id!r} was made with seed {made}, not {self.cfg.run.seed}: "
                    f"resume it with --seed {made} (the seed decides the tasks of every step)"
                )
        elif exists:
            raise AlreadyExists(f"run {self.cfg.run_id!r} exists at {self.path}; use --resume {self.cfg.run_id}")

    def _recorded_seed(self) -> int | None:
        try:
            seed = read_toml(self.path / "config.toml").get("run", {}).get("seed")
        except ConfigError:  # a missing or unreadable record is no seed to compare
            return None
        return seed if isinstance(seed, int) else None

    def write_info(self, status: str, **extra: Any) -> None:
        assert status in STATUSES
        cfg, info = self.cfg, self.read_info()
        capture: dict[str, Any]
        target = extra.pop("capture_target", None) or info.get("capture", {}).get("target")
        if cfg.capture_store is not None and cfg.capture_store.backend == "embedded":
            capture = {"backend": "embedded", "dir": "capture"}
        else:
            capture = {"backend": "distributed", "target": target}
        info |= {
            "run_id": cfg.run_id,
            "created_at": info.get("created_at", time.time()),
            "status": status,
            "group_size": cfg.run.group_size,
            "batch_groups": cfg.run.groups_per_step,
            "model": cfg.model_name,
            # The folder whose tokenizer made the captured tokens: the dashboard decodes with it.
            "tokenizer": str(cfg.proxy.model_dir if cfg.proxy is not None else cfg.model_dir),
            "harness": cfg.run.harness,
            "engine": cfg.run.engine,
            "steps_planned": cfg.run.steps,
            "capture": {k: v for k, v in capture.items() if v is not None},
            "pid": os.getpid(),
            "updated_at": time.time(),
        }
        info |= {k: v for k, v in extra.items() if v is not None}
        if status != "running":
            info.pop("trainer_target", None)  # nothing serves it any more: the dashboard reads the files
        tmp = self.info_path.with_name("run.json.tmp")
        tmp.write_text(json.dumps(info, indent=1))
        os.replace(tmp, self.info_path)

    def append_jsonl(self, name: str, rows: list[dict[str, Any]]) -> None:
        with (self.path / name).open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


CPU_KEY = "cpu/{}_s"  # a step's CPU-seconds by component (harnessrl.cpu.COMPONENTS)


class RecordingTrainerService(TrainerService):
    """The trainer's service object that also appends each step to metrics.jsonl, with the
    CPU-seconds this process and its children spent by component since the step before
    (``cpu/engine_s``, ``cpu/trainer_s``, ``cpu/harness_s``, ``cpu/sandbox_s``,
    ``cpu/services_s``; the first step's window starts when this object is made)."""

    def __init__(self, run_id: str, tensorboard_dir: Path | None, run_dir: RunDirectory) -> None:
        super().__init__(run_id, tensorboard_dir)
        self._run_dir = run_dir
        self.last_values: dict[str, float] = {}
        # Called (on the event loop) with each recorded step: periodic evaluation starts
        # here, so no step is missed however fast steps follow each other.
        self.on_step: Callable[[int], None] | None = None
        self.cpu = cpu.Meter()

    def cpu_spent(self) -> dict[str, float]:
        """CPU-seconds by component since this object was made (the run's ``cpu_s``)."""
        self.cpu.lap()
        return dict(self.cpu.total)

    def record_step(self, step: int, policy_version: int, values: dict[str, float], alerts: list[str]) -> None:
        values = values | {CPU_KEY.format(c): s for c, s in self.cpu.lap().items()}
        super().record_step(step, policy_version, values, alerts)
        self.last_values = dict(values)
        row = {"step": step, "wall_time": time.time(), "values": values}
        self._run_dir.append_jsonl("metrics.jsonl", [row])
        if self.on_step is not None:
            self.on_step(step)
