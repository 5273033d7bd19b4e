"""A discrete-event simulator of rollout slots, the trainer and weight sync, to
size async training before renting a cluster (``harnessrl bench async``).

Trials go through setup -> agent -> verify -> teardown. Groups (G trials of one
task) are admitted and trained by the same policy as the real loop
(``services.trainer.admission.Admission``): a group starts as soon as ``slots``
has room for its G trials and the staleness window allows it, tagged with the
served policy version; it is ready when its last trial ends; the trainer takes
the groups whose last chance is this step (waiting for them) and fills the
batch with the oldest ready ones. k = 0 is synchronous RL (launch a batch, wait
for all of it, train, sync); the same code with k >= 1 is async.

A weight sync pauses model calls (agent phases stall) for ``sync_s``. With
partial rollout, in-flight generations are held at a token boundary and resume
on the new weights; without it, the gateway must first drain every in-flight
model call (the longest residual call time of the running agents) before the
sync, and agents stall for that too.

Assumptions (``harnessrl bench async`` prints them): trial phases are
independent of the policy version; the trainer step time is constant (train_s,
plus sync_s of weight sync that the trainer also waits for); a group holds its
G slots until its slowest trial ends (the loop only learns that a group is
ready, not each trial).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from services.trainer.admission import Admission

Z99 = 2.3263478740408408  # standard normal 99th percentile


@dataclass(frozen=True)
class TrialDistribution:
    """Trial phases; defaults are the reference measurements: mean trial 920 s,
    91% agent, 2.3% setup, 3.9% verification, p99 928 s.

    ``tail="trial"`` (default) reads the p99 as the trial's: durations are then
    tight (std ~3.4 s; every phase normal with the same coefficient of
    variation), as when most trials run into the agent's time budget.
    ``tail="verify"`` reads it as the verification's: most verifications are
    quick and ``verify_tail_frac`` hang until ~``p99_s``, with lognormal agent
    times (``agent_sigma``) - a heavy tail that sync training waits for.
    """

    mean_s: float = 920.0
    agent_frac: float = 0.91
    setup_frac: float = 0.023
    verify_frac: float = 0.039
    p99_s: float = 928.0
    tail: Literal["trial", "verify"] = "trial"
    verify_tail_frac: float = 0.02
    agent_sigma: float = 0.5
    setup_sigma: float = 0.5

    def means(self) -> npt.NDArray[np.float64]:
        rest = max(1 - self.agent_frac - self.setup_frac - self.verify_frac, 0)
        return self.mean_s * np.array([self.setup_frac, self.agent_frac, self.verify_frac, rest])

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
        """[n, 4] seconds: setup, agent, verify, teardown."""
        means = self.means()
        if self.tail == "trial":
            std = max(self.p99_s - self.mean_s, 0.0) / Z99
            cv = std / float(np.sqrt((means**2).sum()))
            return np.maximum(rng.normal(means, cv * means, (n, 4)), 0.0)
        agent = _lognormal(rng, means[1], self.agent_sigma, n)
        setup = _lognormal(rng, means[0], self.setup_sigma, n)
        tail = rng.random(n) < self.verify_tail_frac
        # A p99 far above the mean is a mixture: most verifications are quick, a few hang until the timeout.
        body_mean = max((means[2] - self.verify_tail_frac * self.p99_s) / (1 - self.verify_tail_frac), 1e-3)
        verify = np.where(
            tail, np.maximum(rng.normal(self.p99_s, 0.03 * self.p99_s, n), 0), _lognormal(rng, body_mean, 0.5, n)
        )
        return np.stack([setup, agent, verify, np.full(n, means[3])], axis=1)


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int) -> npt.NDArray[np.float64]:
    return rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, n)


@dataclass(frozen=True)
class SimConfig:
    tasks_per_step: int = 64
    group_size: int = 8
    workers: int = 1024  # rollout slots (trials at once): the fleet
    steps: int = 30
    train_s: float = 300.0
    sync_s: float = 30.0
    staleness: int = 1
    partial_rollout: bool = True
    call_mean_s: float = 20.0  # mean model-call latency (drain cost without partial rollout)
    seed: int = 0
    warmup_steps: int = 4  # steady-state figures start after this many steps
    trials: TrialDistribution = field(default_factory=TrialDistribution)


@dataclass(frozen=True)
class SimResult:
    config: SimConfig
    seconds: float
    steps: int
    steps_per_hour: float  # whole run, warm-up included (what a real run of ``steps`` steps measures)
    trainer_idle_fraction: float  # whole run
    steady_steps_per_hour: float  # after ``warmup_steps``
    steady_idle_fraction: float
    dropped_groups: int
    mean_staleness: float
    max_staleness: int
    mean_slots_busy: float  # fraction of rollout slots held by groups, whole run


class _Sim:
    """Event loop over a wall-clock heap. Agent phases run on an 'agent clock'
    that stands still while model calls are paused for a weight sync; their
    ends sit in a second heap keyed by that clock."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)  # trials: the same draws whatever the mode (common random numbers)
        self.drain_rng = np.random.default_rng([cfg.seed, 1])
        self.adm = Admission(
            cfg.tasks_per_step, cfg.staleness, cfg.group_size, cfg.workers, max_groups=cfg.steps * cfg.tasks_per_step
        )
        self.t = 0.0
        self.paused_before = 0.0  # total length of finished pauses
        self.pause: tuple[float, float] | None = None  # (start, length) of the current pause
        self.events: list[tuple[float, int, str, int]] = []  # (wall time, seq, kind, trial or -1)
        self.agent_ends: list[tuple[float, int, int]] = []  # (agent-clock time, seq, trial)
        self.seq = 0
        self.trials = 0
        self.group_of: dict[int, str] = {}
        self.phases: dict[int, npt.NDArray[np.float64]] = {}
        self.remaining: dict[str, int] = {}
        self.version = 0
        self.training = False
        self.busy: list[tuple[float, float]] = []  # trainer busy intervals
        self.step_ends: list[float] = []
        self.dropped = 0
        self.staleness: list[int] = []
        self.slot_seconds = 0.0
        self.slots_since = 0.0

    def agent_clock(self, t: float | None = None) -> float:
        t = self.t if t is None else t
        paused = self.paused_before
        if self.pause is not None:
            start, length = self.pause
            paused += min(max(t - start, 0.0), length)
        return t - paused

    def push(self, when: float, kind: str, trial: int = -1) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, kind, trial))

    def _slots_changed(self) -> None:
        self.slot_seconds += (self.t - self.slots_since) * self.adm.running_trials
        self.slots_since = self.t

    def admit(self) -> None:
        """Starts every group the admission policy allows now."""
        cfg = self.cfg
        self._slots_changed()
        for _ in range(self.adm.admissible(self.version)):
            step, index = self.adm.next_slot()
            gid = f"s{step}-t{index}-{self.seq}"
            self.adm.admit(gid, self.version)
            self.remaining[gid] = cfg.group_size
            for phases in cfg.trials.sample(self.rng, cfg.group_size):
                trial = self.trials
                self.trials += 1
                self.group_of[trial], self.phases[trial] = gid, phases
                self.push(self.t + phases[0], "setup_done", trial)

    def next_agent_wall(self) -> float:
        if not self.agent_ends:
            return math.inf
        target = self.agent_ends[0][0]
        if self.pause is not None and self.t < self.pause[0] + self.pause[1]:
            resume = self.pause[0] + self.pause[1]
            return max(resume + target - self.agent_clock(resume), self.t)
        return max(self.t + target - self.agent_clock(), self.t)

    def run(self) -> SimResult:
        cfg = self.cfg
        self.admit()
        while len(self.step_ends) < cfg.steps:
            wall = self.events[0][0] if self.events else math.inf
            agent_wall = self.next_agent_wall()
            if agent_wall < wall:
                self.t = agent_wall
                _, _, trial = heapq.heappop(self.agent_ends)
                self.push(self.t + self.phases[trial][2] + self.phases[trial][3], "trial_done", trial)
                continue
            if wall == math.inf:
                raise RuntimeError("simulation stalled")
            self.t, _, kind, trial = heapq.heappop(self.events)
            getattr(self, f"_on_{kind}")(trial)
        self._slots_changed()
        return self._result()

    def _result(self) -> SimResult:
        cfg = self.cfg
        w = min(cfg.warmup_steps, cfg.steps - 1)
        start = self.step_ends[w - 1] if w > 0 else 0.0
        return SimResult(
            cfg,
            self.t,
            cfg.steps,
            cfg.steps / self.t * 3600,
            1 - _busy_within(self.busy, 0.0, self.t) / self.t,
            (cfg.steps - w) / (self.t - start) * 3600,
            1 - _busy_within(self.busy, start, self.t) / (self.t - start),
            self.dropped,
            float(np.mean(self.staleness)) if self.staleness else 0.0,
            max(self.staleness, default=0),
            self.slot_seconds / (self.t * cfg.workers),
        )

    def _on_setup_done(self, trial: int) -> None:
        self.seq += 1
        heapq.heappush(self.agent_ends, (self.agent_clock() + self.phases[trial][1], self.seq, trial))

    def _on_trial_done(self, trial: int) -> None:
        gid = self.group_of.pop(trial)
        del self.phases[trial]
        self.remaining[gid] -= 1
        if self.remaining[gid] == 0:
            del self.remaining[gid]
            self._slots_changed()
            self.adm.ready(gid, self.version)
            self.admit()
            self._maybe_train()

    def _maybe_train(self) -> None:
        if self.training:
            return
        sel = self.adm.select(self.version)
        self.dropped += len(sel.dropped)
        if not sel.batch:
            return
        self.staleness += sel.staleness
        self.training = True
        self.busy.append((self.t, self.t + self.cfg.train_s))
        self.push(self.t + self.cfg.train_s, "train_done")

    def _on_train_done(self, _trial: int) -> None:
        cfg = self.cfg
        in_agent = len(self.agent_ends)
        drain = 0.0
        if not cfg.partial_rollout and in_agent:
            drain = float(self.drain_rng.exponential(cfg.call_mean_s, in_agent).max())
        length = drain + cfg.sync_s
        self.pause = (self.t, length)  # model calls wait; agents stall
        self.busy.append((self.t, self.t + length))
        self.push(self.t + length, "sync_done")

    def _on_sync_done(self, _trial: int) -> None:
        if self.pause is not None:
            self.paused_before += self.pause[1]
            self.pause = None
        self.version += 1
        self.adm.step_done()
        self.training = False
        self.step_ends.append(self.t)
        self.admit()
        self._maybe_train()


def _busy_within(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(min(b, end) - max(a, start), 0.0) for a, b in intervals)


def simulate(cfg: SimConfig) -> SimResult:
    return _Sim(cfg).run()
