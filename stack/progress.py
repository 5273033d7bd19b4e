"""The live progress of ``harnessrl run``: step, trials running / done, reward,
termination reasons, train/inference agreement. A rich live panel on a terminal;
otherwise (logs, CI, ``nohup``, tests) one plain line per trainer step, and
between them a rollout line every ``[run] progress_every_s`` while trials run
(trials done of the step, rewards so far, the slowest running trial's phase):
a step can take minutes, and a log that says nothing for that long looks hung.
``harnessrl eval`` prints the same rollout lines."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from rich.live import Live
from rich.table import Table


@dataclass
class _Trial:
    step: int
    state: str = "queued"
    since: float = field(default_factory=time.monotonic)
    reward: float | None = None


@dataclass(frozen=True)
class Rollouts:
    """The trials of the oldest step that has some not done."""

    step: int
    done: int
    total: int
    rewards: tuple[float, ...]
    running: dict[str, int]  # phase -> trials in it (queued included)
    slowest: tuple[str, str, float] | None  # (trial id, phase, seconds in it)


class TrialBoard:
    """Every submitted trial's step, state, when it entered that state and its reward;
    ``per_step``: the trials a step will have (its groups are submitted one by one)."""

    def __init__(self, per_step: int = 0) -> None:
        self._trials: dict[str, _Trial] = {}
        self.per_step = per_step

    def submitted(self, trial_id: str, step: int) -> None:
        self._trials.setdefault(trial_id, _Trial(step)).step = step

    def update(self, trial_id: str, state: str, reward: float | None = None) -> None:
        trial = self._trials.get(trial_id)
        if trial is None:  # a status before its submit returned: the step comes with the submit
            trial = self._trials[trial_id] = _Trial(-1)
        if state != trial.state:
            trial.state, trial.since = state, time.monotonic()
        if state == "done":
            trial.reward = reward

    def rollouts(self) -> Rollouts | None:
        pending = [t.step for t in self._trials.values() if t.state != "done" and t.step >= 0]
        if not pending:
            return None
        step = min(pending)
        trials = [(tid, t) for tid, t in self._trials.items() if t.step == step]
        done = [t for _, t in trials if t.state == "done"]
        running = [(tid, t) for tid, t in trials if t.state != "done"]
        phases: dict[str, int] = {}
        for _, t in running:
            phases[t.state] = phases.get(t.state, 0) + 1
        now = time.monotonic()
        active = [(tid, t) for tid, t in running if t.state != "queued"] or running
        tid, oldest = min(active, key=lambda item: item[1].since)
        return Rollouts(
            step,
            len(done),
            max(len(trials), self.per_step),
            tuple(t.reward for t in done if t.reward is not None),
            phases,
            (tid, oldest.state, now - oldest.since),
        )


def rollout_line(r: Rollouts, label: str = "rollouts of step") -> str:
    rewards = f"rewards {sum(r.rewards):g}/{len(r.rewards)}" if r.rewards else "rewards -"
    if r.rewards and any(x not in (0.0, 1.0) for x in r.rewards):
        rewards = f"reward mean {sum(r.rewards) / len(r.rewards):.3f} ({len(r.rewards)})"
    phases = ", ".join(f"{k} {n}" for k, n in sorted(r.running.items())) or "-"
    parts = [f"{label} {r.step}: done {r.done}/{r.total}", rewards, f"running [{phases}]"]
    if r.slowest is not None:
        trial, phase, seconds = r.slowest
        parts.append(f"slowest {trial} in {phase} {seconds:.0f}s")
    return "  ".join(parts)


@dataclass
class Snapshot:
    step: int
    steps: int
    trials: dict[str, int]
    reasons: dict[str, int]
    values: dict[str, float]
    trainer_state: str
    elapsed_s: float
    rollouts: Rollouts | None = None


def step_line(s: Snapshot) -> str:
    v = {k: x for k, x in s.values.items() if math.isfinite(x)}  # no agreement without comparable tokens: nan
    reward = v.get("reward/mean")
    pearson = v.get("agreement/pearson")
    reasons = ", ".join(f"{k} {n}" for k, n in sorted(s.reasons.items())) or "-"
    parts = [
        f"step {s.step}/{s.steps}",
        f"reward {reward:.3f}" if reward is not None else "reward -",
        f"pearson {pearson:.4f}" if pearson is not None else "pearson -",
        f"trials done {s.trials.get('done', 0)}",
        f"reasons [{reasons}]",
        f"{s.elapsed_s:.0f}s",
    ]
    return "  ".join(parts)


def table(s: Snapshot) -> Table:
    t = Table(title=f"harnessrl run: step {s.step}/{s.steps} ({s.trainer_state})", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    running = sum(n for k, n in s.trials.items() if k not in ("done", "queued"))
    t.add_row("trials", f"queued {s.trials.get('queued', 0)}  running {running}  done {s.trials.get('done', 0)}")
    t.add_row("termination", ", ".join(f"{k} {n}" for k, n in sorted(s.reasons.items())) or "-")
    for key in ("reward/mean", "agreement/pearson", "loss/total", "step/seconds"):
        if key in s.values and math.isfinite(s.values[key]):
            t.add_row(key, f"{s.values[key]:.4g}")
    t.add_row("elapsed", f"{s.elapsed_s:.0f} s")
    return t


class Progress:
    """Polls ``snapshot()`` every ``every_s``; prints a line at each new step and,
    without a terminal, a rollout line when ``line_every_s`` passed without a line."""

    def __init__(
        self, snapshot: Callable[[], Snapshot], console: Console, every_s: float = 1.0, line_every_s: float = 30.0
    ) -> None:
        self.snapshot, self.console, self.every_s, self.line_every_s = snapshot, console, every_s, line_every_s
        self.started = time.monotonic()
        self._printed_step = -1
        self._last_line = time.monotonic()

    async def run(self) -> None:
        live = Live(console=self.console, refresh_per_second=2, transient=True) if self.console.is_terminal else None
        if live is not None:
            live.start()
        try:
            while True:
                self.tick(live)
                await asyncio.sleep(self.every_s)
        finally:
            if live is not None:
                live.stop()
            self.tick(None)

    def tick(self, live: Live | None) -> None:
        s = self.snapshot()
        if live is not None:
            live.update(table(s))
        if s.step != self._printed_step and s.step > 0:
            self._printed_step = s.step
            self._print(step_line(s))
        elif live is None and s.rollouts is not None and time.monotonic() - self._last_line >= self.line_every_s:
            self._print(f"{rollout_line(s.rollouts)}  {s.elapsed_s:.0f}s")

    def _print(self, line: str) -> None:
        self._last_line = time.monotonic()
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)


async def heartbeat(board: TrialBoard, console: Console, every_s: float, label: str) -> None:
    """A rollout line every ``every_s`` while ``board`` has trials not done (``harnessrl eval``)."""
    started = time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        r = board.rollouts()
        if r is not None:
            line = f"{rollout_line(r, label)}  {time.monotonic() - started:.0f}s"
            console.print(line, highlight=False, markup=False, soft_wrap=True)
