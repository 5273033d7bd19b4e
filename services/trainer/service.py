"""The trainer's observable state: status, per-step metrics (TensorBoard files
and the Metrics RPC), alerts and idle time. The gRPC servicer only maps this.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.errors import InvalidArgument
from harnessrl.v1 import trainer_pb2

STATES = ("starting", "waiting", "training", "syncing", "done", "failed")
MAX_ALERTS = 50


@dataclass
class StepRecord:
    step: int
    wall_time: float
    values: dict[str, float]


@dataclass
class TrainerState:
    run_id: str
    state: str = "starting"
    step: int = 0
    policy_version: int = 0
    groups_pending: int = 0
    alerts: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_ALERTS))


class TrainerService:
    """Thread-safe: the training loop writes, RPC handlers read."""

    def __init__(self, run_id: str, tensorboard_dir: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._state = TrainerState(run_id)
        self._steps: list[StepRecord] = []
        self._writer = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(tensorboard_dir))
        self._created = time.monotonic()
        self._idle_s = 0.0
        self._idle_since: float | None = None

    # -- written by the loop ----------------------------------------------------

    def set_state(self, state: str, groups_pending: int | None = None) -> None:
        if state not in STATES:
            raise ValueError(f"unknown trainer state {state!r}; valid: {STATES}")
        now = time.monotonic()
        with self._lock:
            # Idle = waiting for rollouts: the time the optimizer could have been busy.
            if state == "waiting" and self._idle_since is None:
                self._idle_since = now
            elif state != "waiting" and self._idle_since is not None:
                self._idle_s += now - self._idle_since
                self._idle_since = None
            self._state.state = state
            if groups_pending is not None:
                self._state.groups_pending = groups_pending

    def record_step(self, step: int, policy_version: int, values: dict[str, float], alerts: list[str]) -> None:
        record = StepRecord(step, time.time(), dict(values))
        with self._lock:
            self._state.step = step
            self._state.policy_version = policy_version
            self._state.alerts.extend(alerts)
            self._steps.append(record)
        if self._writer is not None:
            for key, value in values.items():
                self._writer.add_scalar(key, value, step, walltime=record.wall_time)
            for line in alerts:
                self._writer.add_text("alerts", line, step)
            self._writer.flush()

    def set_progress(self, step: int, policy_version: int) -> None:
        """After a resume: where the restored trainer stands."""
        with self._lock:
            self._state.step, self._state.policy_version = step, policy_version

    def alert(self, line: str) -> None:
        with self._lock:
            self._state.alerts.append(line)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    # -- read by RPCs -----------------------------------------------------------

    def idle_fraction(self) -> float:
        now = time.monotonic()
        with self._lock:
            idle = self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)
        return idle / max(now - self._created, 1e-9)

    def status(self) -> trainer_pb2.TrainerStatus:
        fraction = self.idle_fraction()
        with self._lock:
            s = self._state
            return trainer_pb2.TrainerStatus(
                run_id=s.run_id,
                step=s.step,
                policy_version=s.policy_version,
                state=s.state,
                groups_pending=s.groups_pending,
                trainer_idle_fraction=fraction,
                alerts=list(s.alerts),
            )

    def metrics(self, since_step: int) -> trainer_pb2.MetricsResponse:
        if since_step < 0:
            raise InvalidArgument(f"since_step must be >= 0, got {since_step}")
        with self._lock:
            start = bisect.bisect_right([r.step for r in self._steps], since_step)
            records = self._steps[start:]
        return trainer_pb2.MetricsResponse(
            steps=[trainer_pb2.StepMetrics(step=r.step, wall_time=r.wall_time, values=r.values) for r in records]
        )
