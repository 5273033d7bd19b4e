"""Checks the async simulator against a real, scaled-down async run
(``harnessrl bench async --check``).

The real run is the trainer's own loop (``TrainingLoop``: WatchReady with acks,
the continuous group-level admission of ``services.trainer.admission``, weight
sync) against the real capture store over gRPC. Time is scaled down (a 920 s
trial becomes a few seconds) and the two expensive parts are timed stand-ins:
trials sleep through their phases drawn from the simulator's trial
distribution (the agent phase stands still while a weight sync pauses model
calls, as the gateway does), then write their capture like the proxy and
sandbox do; the optimizer step and the weight sync sleep for ``train_s`` and
``sync_s``. The simulator gets the same parameters; both report steps/hour and
trainer idle fraction.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from harnessrl import arrays
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from services.capture_store.server import create_server as create_capture
from services.capture_store.settings import Settings as CaptureSettings
from services.trainer.cpu_trainer import StepResult
from services.trainer.loop import ReadyGroupSource, TrainingLoop
from services.trainer.service import TrainerService
from services.trainer.settings import Settings
from services.trainer.simulator import SimConfig, TrialDistribution, simulate

RUN = "async-check"


@dataclass(frozen=True)
class CheckResult:
    staleness: int
    measured_steps_per_hour: float
    predicted_steps_per_hour: float
    measured_idle: float
    predicted_idle: float

    @property
    def throughput_error(self) -> float:
        return abs(self.predicted_steps_per_hour - self.measured_steps_per_hour) / self.measured_steps_per_hour


def scaled(cfg: SimConfig, trial_mean_s: float) -> SimConfig:
    """The same run with every duration scaled so that a mean trial lasts ``trial_mean_s``."""
    f = trial_mean_s / cfg.trials.mean_s
    trials = replace(cfg.trials, mean_s=trial_mean_s, p99_s=cfg.trials.p99_s * f)
    return replace(cfg, trials=trials, train_s=cfg.train_s * f, sync_s=cfg.sync_s * f, call_mean_s=cfg.call_mean_s * f)


class _TimedTrainer:
    """Stands in for the optimizer: a step takes ``train_s`` of wall time."""

    def __init__(self, train_s: float) -> None:
        self.train_s, self.step, self.policy_version = train_s, 0, 0

    def train_step(self, groups: object) -> StepResult:
        time.sleep(self.train_s)
        self.step += 1
        self.policy_version += 1
        return StepResult(self.step, self.policy_version, {}, updated=True)

    def save(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        return directory


class _TimedSync:
    """Stands in for Pause -> UpdateWeights -> Resume: model calls (agent phases) stall for ``sync_s``."""

    def __init__(self, sync_s: float, rollouts: _SleepingRollouts) -> None:
        self.sync_s, self.rollouts = sync_s, rollouts

    async def publish(self, version: int, checkpoint_path: str) -> dict[str, float]:
        self.rollouts.pause()
        try:
            await asyncio.sleep(self.sync_s)
        finally:
            self.rollouts.resume()
        return {}


class _SleepingRollouts:
    """A group launcher: each trial sleeps its sampled phases, then is captured."""

    def __init__(self, cfg: SimConfig, capture: str) -> None:
        self.cfg, self.capture = cfg, capture
        self.rng = np.random.default_rng(cfg.seed)
        self.tasks: list[asyncio.Task[None]] = []
        self._running = asyncio.Event()
        self._running.set()
        self._paused = asyncio.Event()

    def pause(self) -> None:
        self._running.clear()
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()
        self._running.set()

    async def launch(self, step: int, policy_version: int) -> None:
        raise RuntimeError("driven group by group (launch_group)")

    async def launch_group(self, group_id: str, step: int, index: int, policy_version: int) -> None:
        for i, phases in enumerate(self.cfg.trials.sample(self.rng, self.cfg.group_size)):
            self.tasks.append(asyncio.ensure_future(self._trial(group_id, i, phases, policy_version)))

    async def _agent(self, seconds: float) -> None:
        """Sleeps ``seconds`` of agent time: the clock stands still while model calls are paused."""
        loop = asyncio.get_running_loop()
        while seconds > 0:
            await self._running.wait()
            started = loop.time()
            try:
                await asyncio.wait_for(self._paused.wait(), seconds)
            except TimeoutError:
                return
            seconds -= loop.time() - started

    async def _trial(self, group: str, index: int, phases: np.ndarray, version: int) -> None:
        await asyncio.sleep(float(phases[0]))
        await self._agent(float(phases[1]))
        await asyncio.sleep(float(phases[2] + phases[3]))
        trial = f"{group}-{index}"
        async with connect(self.capture) as channel:
            stub = capture_pb2_grpc.CaptureStoreStub(channel)
            key = records_pb2.SegmentKey(run_id=RUN, trial_id=trial, thread="main")
            tokens = arrays.make_tokens([4, 5], [1, 1], [-1.0, -1.0], [version, version])
            await stub.AppendSegment(
                capture_pb2.AppendSegmentRequest(
                    key=key,
                    thread_kind="main",
                    trainable=True,
                    prompt_ids=arrays.pack_i32([1, 2, 3]),
                    tokens=tokens,
                    close=True,
                    task_id=group,
                    group_id=group,
                )
            )
            await stub.FinalizeTrajectory(
                capture_pb2.FinalizeTrajectoryRequest(
                    run_id=RUN,
                    trial_id=trial,
                    task_id=group,
                    group_id=group,
                    group_size=self.cfg.group_size,
                    reward=float(index % 2),
                    has_reward=True,
                    termination_reason=records_pb2.TERMINATION_REASON_COMPLETED,
                )
            )


async def measure(cfg: SimConfig) -> tuple[float, float]:
    """Steps/hour and trainer idle fraction of a real loop run with ``cfg`` (already scaled)."""
    with tempfile.TemporaryDirectory(prefix="hrl-async-check-") as tmp:
        server = await create_capture(
            CaptureSettings.model_validate({"store_dir": Path(tmp) / "store", "fsync": False})
        )
        target = f"127.0.0.1:{server.port}"
        settings = Settings.model_validate(
            {
                "run_id": RUN,
                "output_dir": str(Path(tmp) / "out"),
                "rollout": {
                    "groups_per_step": cfg.tasks_per_step,
                    "max_staleness": cfg.staleness,
                    "max_steps": cfg.steps,
                    "max_groups_in_flight": cfg.workers // cfg.group_size,
                    "partial_rollout": cfg.partial_rollout,
                },
            }
        )
        service = TrainerService(RUN)
        source = ReadyGroupSource(target, RUN, "trainer")
        await source.start()
        rollouts = _SleepingRollouts(cfg, target)
        trainer = _TimedTrainer(cfg.train_s)
        sync = _TimedSync(cfg.sync_s, rollouts)
        loop = TrainingLoop(settings, trainer, source, service, sync, rollouts)  # type: ignore[arg-type]
        started = time.monotonic()
        try:
            await loop.run()
        finally:
            elapsed = time.monotonic() - started
            for t in rollouts.tasks:
                t.cancel()
            await asyncio.gather(*rollouts.tasks, return_exceptions=True)
            await source.close(grace_s=0.0)
            await asyncio.sleep(0.5)  # let writes already inside the store finish before it closes
            await server.stop(0)
    busy = cfg.steps * (cfg.train_s + cfg.sync_s)
    return cfg.steps / elapsed * 3600, 1 - busy / elapsed


def check(base: SimConfig, trial_mean_s: float = 3.0, seeds: int = 8) -> list[CheckResult]:
    """Measured vs predicted for k = 0 and k = 1 (prediction: mean over ``seeds`` simulations)."""
    out = []
    for k in (0, 1):
        cfg = scaled(replace(base, staleness=k), trial_mean_s)
        measured, idle = asyncio.run(measure(cfg))
        sims = [simulate(replace(cfg, seed=s)) for s in range(seeds)]
        out.append(
            CheckResult(
                k,
                measured,
                float(np.mean([r.steps_per_hour for r in sims])),
                idle,
                float(np.mean([r.trainer_idle_fraction for r in sims])),
            )
        )
    return out


# The bench's default ratios (train 300 s + sync 30 s per 920 s trial), a fleet of two batches, small batches.
DEFAULT_CHECK = SimConfig(
    tasks_per_step=4, group_size=4, workers=32, steps=6, train_s=300, sync_s=30, trials=TrialDistribution()
)


def check_table(base: SimConfig, trial_mean_s: float = 3.0) -> list[CheckResult]:
    from rich.console import Console
    from rich.table import Table

    results = check(base, trial_mean_s)
    table = Table(title=f"simulator vs a real scaled run (mean trial {trial_mean_s:.1f} s, {base.steps} steps)")
    cols = (
        "staleness",
        "measured steps/h",
        "predicted steps/h",
        "error (target <= 20 %)",
        "measured vs sync",
        "predicted vs sync",
    )
    for col in (*cols, "measured idle", "predicted idle"):
        table.add_column(col, justify="right")
    sync = results[0]
    for r in results:
        table.add_row(
            str(r.staleness),
            f"{r.measured_steps_per_hour:.0f}",
            f"{r.predicted_steps_per_hour:.0f}",
            f"{r.throughput_error:.1%}",
            f"{r.measured_steps_per_hour / sync.measured_steps_per_hour:.2f}x",
            f"{r.predicted_steps_per_hour / sync.predicted_steps_per_hour:.2f}x",
            f"{r.measured_idle:.0%}",
            f"{r.predicted_idle:.0%}",
        )
    Console().print(table)
    return results
