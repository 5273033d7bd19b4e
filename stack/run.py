"""``harnessrl run CONFIG``: RL end to end in one command.

1. Load and validate the config; expand the task pools; refuse train/eval
   overlaps unless allowed; static preflight. Nothing has started yet: any
   failure here is exit 2 and leaves nothing behind.
2. Create (or, with ``--resume``, reopen) the run directory; start or connect to
   the services (``stack.embedded.services``); live preflight (engine, sandbox,
   task pool). A fresh run that fails preflight is removed again.
3. Train: the trainer's own ``TrainingLoop`` in this process, fed by the capture
   store's WatchReady and launching batches through ``SandboxLauncher``; its
   Status/Metrics gRPC service is up for the dashboard; every step is appended
   to metrics.jsonl. A rich progress display follows the trials and steps.
4. Stop: on completion (status done, exit 0), on SIGINT/SIGTERM (no more
   launches, in-flight trials cancelled and finalized as ``cancelled``, status
   stopped, exit 130) or on an error (status failed, exit 1). Everything started
   is stopped in every case.

``--resume RUN``: the trainer restores its newest checkpoint (weights, optimizer,
step) and publishes it to the gateway; the launcher skips trials the capture
store already holds finalized, so finished groups are not redone; groups that
finished but were not trained on are redelivered by the capture store. A step
interrupted mid-optimization is redone from the last checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from harnessrl import memory, paths
from harnessrl.errors import ConfigError
from stack import pool, preflight
from stack.calibrate import calibrate
from stack.disjoint import find_overlaps
from stack.embedded import Endpoints, services
from stack.launcher import SandboxLauncher, TrialTemplate
from stack.progress import Progress, Snapshot
from stack.runconfig import RunConfig
from stack.rundir import RecordingTrainerService, RunDirectory

if TYPE_CHECKING:
    from stack.evaluate import PeriodicEval

log = logging.getLogger(__name__)

EXIT_DONE, EXIT_FAILED, EXIT_STOPPED = 0, 1, 130
CANCEL_WAIT_S = 60.0


@dataclass
class Outcome:
    status: str
    code: int
    steps_done: int = 0
    error: str = ""


def resolve_tasks(cfg: RunConfig) -> tuple[list[Path], list[Path]]:
    """The train and eval task folders; a bad path is an error naming the config file and field."""
    train = _expand(cfg, "train_tasks", cfg.run.train_tasks, cfg.run.families)
    evaluation = _expand(cfg, "eval_tasks", cfg.run.eval_tasks, cfg.run.eval_families) if cfg.run.eval_tasks else []
    return train, evaluation


def _expand(cfg: RunConfig, name: str, paths: Sequence[Path], families: Sequence[str]) -> list[Path]:
    try:
        return pool.expand(paths, families)
    except ConfigError as e:
        raise ConfigError(f"{cfg.path}: [run] {name}: {e}") from e


def check_overlap(cfg: RunConfig, train: Sequence[Path], evaluation: Sequence[Path]) -> list[str]:
    """Refuses a run whose train and eval tasks overlap (unless allowed); returns the overlaps found."""
    if not evaluation:
        return []
    found = [f"{o.level}: {o.train_task} ~ {o.eval_task} ({o.detail})" for o in find_overlaps(train, evaluation)]
    if found and not cfg.run.allow_overlap:
        more = f" (+{len(found) - 3} more)" if len(found) > 3 else ""
        raise ConfigError(
            f"{cfg.path}: train and eval tasks overlap: {'; '.join(found[:3])}{more}; "
            "remove them from one side, or set [run] allow_overlap = true / --allow-overlap"
        )
    return found


async def execute(cfg: RunConfig, *, resume: bool = False, console: Console | None = None) -> Outcome:
    console = console or Console()
    if cfg.run.malloc_mmap_threshold_mib:  # before any model is loaded
        memory.configure(int(cfg.run.malloc_mmap_threshold_mib * 2**20))
    train, evaluation = resolve_tasks(cfg)
    for overlap in check_overlap(cfg, train, evaluation):
        _say(console, f"warning: overlap allowed: {overlap}")
    if cfg.run.preflight:
        report = preflight.static_checks(cfg, train)
        preflight.print_report(report, lambda line: _say(console, line))
        report.raise_if_failed()
    run_dir = RunDirectory(cfg)
    fresh = not resume
    run_dir.create(resume=resume)
    run_dir.write_info("running")
    _say(console, f"run {cfg.run_id}: {run_dir.path}")
    if cfg.run.calibrate:
        result, text = await asyncio.to_thread(calibrate, paths.default_model_dir())
        _say(console, text)
        run_dir.write_info("running", calibration=result)
    outcome = Outcome("failed", EXIT_FAILED)
    try:
        with _Stop() as stop:
            outcome = await _with_services(cfg, (train, evaluation), run_dir, console, stop)
    except preflight.PreflightFailed:
        if fresh:
            shutil.rmtree(run_dir.path, ignore_errors=True)
            outcome.status = ""
        raise
    except Exception as e:  # the run failed: recorded in run.json, reported, exit 1
        log.exception("run failed")
        outcome = Outcome("failed", EXIT_FAILED, error=f"{type(e).__name__}: {e}")
        _say(console, f"run failed: {outcome.error}")
    finally:
        peak = peak_memory()
        if outcome.status:
            run_dir.write_info(outcome.status, error=outcome.error or None, steps_done=outcome.steps_done, **peak)
        _say(console, memory_line(peak))
    if not cfg.run.dashboard:
        _say(console, f"dashboard: harnessrl dashboard serve --run {run_dir.path}")
    return outcome


def peak_memory() -> dict[str, float]:
    """This process's peak resident set (MiB; engine, trainer, services). Not its children's:
    a child's ru_maxrss counts the pages it shared with this process when it was forked."""
    return {"peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def memory_line(peak: dict[str, float]) -> str:
    return f"peak resident memory: {peak['peak_rss_mib'] / 1024:.2f} GiB (this process: engine, trainer, services)"


def cpu_line(spent: dict[str, float]) -> str:
    parts = ", ".join(f"{component} {seconds:.1f}" for component, seconds in spent.items())
    return f"CPU-seconds by component: {parts} (this process and its children, since training started)"


def _say(console: Console, text: str) -> None:
    console.print(text, highlight=False, markup=False, soft_wrap=True)


async def _with_services(
    cfg: RunConfig, pools: tuple[list[Path], list[Path]], run_dir: RunDirectory, console: Console, stop: _Stop
) -> Outcome:
    train, evaluation = pools
    async with services(cfg, dashboard=cfg.run.dashboard) as ends:
        if cfg.run.preflight:
            assert ends.sandbox_target is not None
            report = await preflight.live_checks(cfg, ends.gateway_target, ends.sandbox_target, train, cfg.token())
            preflight.print_report(report, lambda line: _say(console, line))
            report.raise_if_failed()
        if ends.dashboard_url:
            _say(console, f"dashboard: {ends.dashboard_url}")
        if stop.event.is_set():
            _say(console, f"{stop.signal_name}: stopping before training")
            return Outcome("stopped", EXIT_STOPPED)
        from stack.evaluate import PeriodicEval

        assert ends.sandbox_target is not None
        periodic = PeriodicEval(cfg, ends.sandbox_target, ends.capture_target, evaluation, run_dir)
        if cfg.run.evaluate_only:
            return await _control(cfg, periodic, console, stop)
        return await _train(cfg, ends, train, run_dir, console, stop, periodic)


async def _control(cfg: RunConfig, periodic: PeriodicEval, console: Console, stop: _Stop) -> Outcome:
    """``[run] evaluate_only``: the control of a learning run. With no update the
    policy at step N is the policy at step 0, so no training trial is run: the
    evaluations at steps 0, eval_every, ... steps are made one after another with
    the weights the gateway starts from, each row named ``base``; their spread is
    what seed and sampling noise alone give. ``--resume`` skips the steps already evaluated."""
    for step in (s for s in range(0, cfg.run.steps + 1, cfg.run.eval_every) if s not in periodic.done):
        if stop.event.is_set():
            _say(console, f"{stop.signal_name}: stopping the control before step {step}")
            await periodic.finish(wait=False)
            return Outcome("stopped", EXIT_STOPPED, step)
        started = time.monotonic()
        evaluation = periodic.start(step, checkpoint="base")
        stopper = asyncio.ensure_future(stop.event.wait())
        await asyncio.wait({evaluation, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not evaluation.done():
            continue  # stopped: the next turn cancels the evaluation's trials
        evaluation.result()
        _say(console, f"control: evaluation at step {step} done in {time.monotonic() - started:.0f} s")
    await periodic.finish(wait=True)
    return Outcome("done", EXIT_DONE, cfg.run.steps)


class _Stop:
    """SIGINT/SIGTERM -> an event; a second signal exits at once."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.signal_name = ""

    def __enter__(self) -> _Stop:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        return self

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.event.is_set():
            raise SystemExit(EXIT_STOPPED)
        self.signal_name = sig.name
        self.event.set()

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _train(
    cfg: RunConfig,
    ends: Endpoints,
    train: Sequence[Path],
    run_dir: RunDirectory,
    console: Console,
    stop: _Stop,
    periodic: Any,
) -> Outcome:
    from services.trainer import checkpoint
    from services.trainer.cpu_trainer import CpuTrainer
    from services.trainer.loop import GatewaySync, ReadyGroupSource, TrainingLoop
    from services.trainer.server import create_server

    settings = _trainer_settings(cfg, ends)
    out = settings.resolved_output_dir()
    # Imports torch and TensorBoard: seconds the event loop (proxy, dashboard) must not wait.
    service = await asyncio.to_thread(RecordingTrainerService, cfg.run_id, out / "tensorboard", run_dir)
    server = await create_server(settings, service)
    ends.trainer_target = f"127.0.0.1:{server.port}"
    run_dir.write_info("running", trainer_target=ends.trainer_target, capture_target=ends.capture_target)
    closers: list[Any] = []
    try:
        trainer = await asyncio.to_thread(CpuTrainer, settings)
        latest = checkpoint.latest(out)
        sync = GatewaySync(ends.gateway_target, True, 60.0, cfg.token()) if ends.gateway_target else None
        if sync is not None:
            closers.append(sync)
        if latest is not None:
            await asyncio.to_thread(trainer.restore, latest)
            service.set_progress(trainer.step, trainer.policy_version)
            _say(console, f"resumed from {latest.name} (step {trainer.step})")
            if sync is not None:
                await sync.publish(trainer.policy_version, str(latest))
        remaining = cfg.run.steps - trainer.step
        if stop.event.is_set():
            _say(console, f"{stop.signal_name}: stopping before training")
            return Outcome("stopped", EXIT_STOPPED, trainer.step)
        if remaining <= 0:
            return Outcome("done", EXIT_DONE, trainer.step)
        rollout = settings.rollout.model_copy(update={"max_steps": cfg.run.steps})  # total, not remaining
        settings = settings.model_copy(update={"rollout": rollout})
        source = ReadyGroupSource(ends.capture_target, cfg.run_id, settings.consumer_group, cfg.token())
        await source.start()
        closers.insert(0, source)
        launcher = _launcher(cfg, ends, train)
        await launcher.start()
        closers.insert(0, launcher)
        loop = TrainingLoop(settings, trainer, source, service, sync, launcher)
        return await _drive(cfg, loop, launcher, service, stop, console, periodic)
    finally:
        for closer in closers:
            with contextlib.suppress(Exception):
                await closer.close()
        # Before the services stop: the engine's threads must still be alive to be read.
        spent = {c: round(s, 2) for c, s in service.cpu_spent().items()}
        run_dir.write_info("running", cpu_s=spent)
        _say(console, cpu_line(spent))
        service.close()
        await server.stop(1.0)


def _trainer_settings(cfg: RunConfig, ends: Endpoints) -> Any:
    from pydantic import SecretStr

    update: dict[str, Any] = {"capture_target": ends.capture_target, "gateway_target": ends.gateway_target}
    token = cfg.token()
    if token and cfg.trainer.service_token is None:
        update["service_token"] = SecretStr(token)
    return cfg.trainer.model_copy(update=update)


def _launcher(cfg: RunConfig, ends: Endpoints, train: Sequence[Path]) -> SandboxLauncher:
    r = cfg.run
    assert ends.sandbox_target is not None
    return SandboxLauncher(
        TrialTemplate.for_run(cfg),
        train,
        sandbox_target=ends.sandbox_target,
        capture_target=ends.capture_target,
        groups_per_step=r.groups_per_step,
        steps=r.steps,
        seed=r.seed,
        token=cfg.token(),
        gateway_target=ends.gateway_target,
    )


async def _drive(
    cfg: RunConfig,
    loop: Any,
    launcher: SandboxLauncher,
    service: RecordingTrainerService,
    stop: _Stop,
    console: Console,
    periodic: Any,
) -> Outcome:
    started = time.monotonic()

    def snapshot() -> Snapshot:
        status = service.status()
        return Snapshot(
            status.step,
            cfg.run.steps,
            launcher.counts(),
            launcher.reasons(),
            service.last_values,
            status.state,
            time.monotonic() - started,
            launcher.board.rollouts(),
        )

    progress = asyncio.ensure_future(Progress(snapshot, console, line_every_s=cfg.run.progress_every_s).run())
    periodic.maybe_start(service.status().step)  # the weights the run starts from
    service.on_step = periodic.maybe_start
    training = asyncio.ensure_future(loop.run())
    stopper = asyncio.ensure_future(stop.event.wait())
    done = False
    try:
        await asyncio.wait({training, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if training.done():
            training.result()  # raises what the loop raised
            done = True
            periodic.maybe_start(service.status().step)
            if periodic.running:
                _say(console, "waiting for the evaluations under way")
            return Outcome("done", EXIT_DONE, service.status().step)
        _say(console, f"{stop.signal_name}: stopping (in-flight trials are cancelled)")
        return Outcome("stopped", EXIT_STOPPED, service.status().step)
    finally:
        for task in (training, stopper):
            task.cancel()
        await asyncio.gather(training, stopper, return_exceptions=True)
        await periodic.finish(wait=done and not stop.event.is_set())
        cancelled = await launcher.cancel_in_flight()
        if cancelled and not await launcher.wait_settled(CANCEL_WAIT_S):
            log.warning("trials still running after %.0fs: %s", CANCEL_WAIT_S, launcher.in_flight())
        progress.cancel()
        await asyncio.gather(progress, return_exceptions=True)


def run_blocking(cfg: RunConfig, *, resume: bool = False, console: Console | None = None) -> Outcome:
    """``execute`` on a fresh event loop that does not wait for worker threads at the end.

    ``asyncio.run`` joins the default executor, i.e. waits for an optimizer step
    still running in a thread after Ctrl-C (minutes on a CPU). Here the loop
    closes without that wait; ``exit_now`` then ends the process (the step's
    result is discarded: nothing is saved after a stop, its groups are redelivered
    on resume)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(execute(cfg, resume=resume, console=console))
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(_settle(pending))
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()  # shuts the executor down without waiting


async def _settle(tasks: list[asyncio.Task[Any]]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)


def exit_now(code: int) -> None:
    """Leaves without joining worker threads (a stopped run's abandoned optimizer step)."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
