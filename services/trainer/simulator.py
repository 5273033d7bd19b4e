"""A discrete-event simulator of rollout workers, the trainer and weight sync,
to size async training before renting a cluster (``harnessrl bench async``).

Trials go through setup -> agent -> verify -> teardown. ``workers`` trials run
at once. A group (G trials of one task) is ready when its last trial ends.
Admission bounds staleness the way the real system does: groups meant for step
s (the s-th batch of ``tasks_per_step`` groups) start only once the trainer is
at version >= s - k, so k = 0 is synchronous RL (launch a batch, wait for all
of it, train, sync) and the same code with k >= 1 is async. The trainer takes
the first ``tasks_per_step`` ready groups; one sampled more than k versions
before the weights it would train is dropped and counted.

A weight sync pauses model calls (agent phases stall) for ``sync_s``. With
partial rollout, in-flight generations are held at a token boundary and resume
on the new weights; without it, the gateway must first drain every in-flight
model call (the longest residual call time of the running agents) before the
sync, and agents stall for that too.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Z99 = 2.3263478740408408  # standard normal 99th percentile


@dataclass(frozen=True)
class TrialDistribution:
    """Trial phases; defaults are the reference measurements (mean trial 920 s,
    91% agent, 2.3% setup, 3.9% verification with a p99 of 928 s)."""

    mean_s: float = 920.0
    agent_frac: float = 0.91
    setup_frac: float = 0.023
    verify_frac: float = 0.039
    verify_p99_s: float = 928.0
    verify_tail_frac: float = 0.02  # verifications that run into their timeout
    agent_sigma: float = 0.5  # lognormal shape of agent time
    setup_sigma: float = 0.5

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
        """[n, 4] seconds: setup, agent, verify, teardown."""
        agent = _lognormal(rng, self.mean_s * self.agent_frac, self.agent_sigma, n)
        setup = _lognormal(rng, self.mean_s * self.setup_frac, self.setup_sigma, n)
        verify_mean = self.mean_s * self.verify_frac
        tail = rng.random(n) < self.verify_tail_frac
        # A p99 far above the mean is a mixture: most verifications are quick, a few hang until the timeout.
        body_mean = max((verify_mean - self.verify_tail_frac * self.verify_p99_s) / (1 - self.verify_tail_frac), 1e-3)
        verify = np.where(
            tail,
            np.maximum(rng.normal(self.verify_p99_s, 0.03 * self.verify_p99_s, n), 0),
            _lognormal(rng, body_mean, 0.5, n),
        )
        rest = max(1 - self.agent_frac - self.setup_frac - self.verify_frac, 0) * self.mean_s
        return np.stack([setup, agent, verify, np.full(n, rest)], axis=1)


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int) -> npt.NDArray[np.float64]:
    return rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, n)


@dataclass(frozen=True)
class SimConfig:
    tasks_per_step: int = 64
    group_size: int = 8
    workers: int = 512
    steps: int = 30
    train_s: float = 300.0
    sync_s: float = 30.0
    staleness: int = 1
    partial_rollout: bool = True
    window: int | None = None  # batches launched ahead of the trainer; default k + 1 (k = 0: synchronous)
    call_mean_s: float = 20.0  # mean model-call latency (drain cost without partial rollout)
    seed: int = 0
    trials: TrialDistribution = field(default_factory=TrialDistribution)


@dataclass(frozen=True)
class SimResult:
    config: SimConfig
    seconds: float
    steps: int
    steps_per_hour: float
    trainer_idle_fraction: float
    dropped_groups: int
    mean_staleness: float


class _Sim:
    """Event loop over a wall-clock heap. Agent phases run on an 'agent clock'
    that stands still while model calls are paused for a weight sync; their
    ends sit in a second heap keyed by that clock."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.t = 0.0
        self.paused_before = 0.0  # total length of finished pauses
        self.pause: tuple[float, float] | None = None  # (start, length) of the current pause
        self.events: list[tuple[float, int, str, int]] = []  # (wall time, seq, kind, trial or -1)
        self.agent_ends: list[tuple[float, int, int]] = []  # (agent-clock time, seq, trial)
        self.seq = 0
        self.free = cfg.workers
        self.launched = 0  # groups
        self.queue: deque[int] = deque()  # trials waiting for a worker
        self.group_of: dict[int, int] = {}
        self.phases: dict[int, npt.NDArray[np.float64]] = {}
        self.remaining: dict[int, int] = {}
        self.version_of: dict[int, int] = {}
        self.ready: deque[int] = deque()
        self.version = 0
        self.busy_until = 0.0
        self.trainer_busy = 0.0
        self.steps = 0
        self.dropped = 0
        self.staleness: list[int] = []
        self.trials = 0

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

    def admit(self) -> None:
        """Launches groups of steps <= version + k, then starts queued trials on free workers."""
        cfg = self.cfg
        window = cfg.window if cfg.window is not None else cfg.staleness + 1
        while self.launched // cfg.tasks_per_step < self.version + window:
            g = self.launched
            self.launched += 1
            self.remaining[g] = cfg.group_size
            self.version_of[g] = self.version
            for _ in range(cfg.group_size):
                self.group_of[self.trials] = g
                self.queue.append(self.trials)
                self.trials += 1
        while self.queue and self.free:
            trial = self.queue.popleft()
            self.free -= 1
            self.phases[trial] = self.cfg.trials.sample(self.rng, 1)[0]
            self.push(self.t + self.phases[trial][0], "setup_done", trial)

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
        while self.steps < cfg.steps:
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
        return SimResult(
            cfg,
            self.t,
            self.steps,
            self.steps / self.t * 3600,
            1 - self.trainer_busy / self.t,
            self.dropped,
            float(np.mean(self.staleness)) if self.staleness else 0.0,
        )

    def _on_setup_done(self, trial: int) -> None:
        self.seq += 1
        heapq.heappush(self.agent_ends, (self.agent_clock() + self.phases[trial][1], self.seq, trial))

    def _on_trial_done(self, trial: int) -> None:
        g = self.group_of.pop(trial)
        del self.phases[trial]
        self.free += 1
        self.remaining[g] -= 1
        if self.remaining[g] == 0:
            self.ready.append(g)
        self.admit()
        self._maybe_train()

    def _maybe_train(self) -> None:
        cfg = self.cfg
        if self.t < self.busy_until:
            return
        batch: list[int] = []
        while self.ready and len(batch) < cfg.tasks_per_step:
            g = self.ready.popleft()
            if self.version - self.version_of[g] > cfg.staleness:
                self.dropped += 1
                continue
            batch.append(g)
        if len(batch) < cfg.tasks_per_step:
            self.ready.extendleft(reversed(batch))
            return
        self.staleness += [self.version - self.version_of[g] for g in batch]
        self.busy_until = self.t + cfg.train_s
        self.trainer_busy += cfg.train_s
        self.push(self.busy_until, "train_done")

    def _on_train_done(self, _trial: int) -> None:
        cfg = self.cfg
        in_agent = len(self.agent_ends)
        drain = 0.0
        if not cfg.partial_rollout and in_agent:
            drain = float(self.rng.exponential(cfg.call_mean_s, in_agent).max())
        length = drain + cfg.sync_s
        self.pause = (self.t, length)  # model calls wait; agents stall
        self.busy_until = self.t + length
        self.trainer_busy += length
        self.push(self.busy_until, "sync_done")

    def _on_sync_done(self, _trial: int) -> None:
        if self.pause is not None:
            self.paused_before += self.pause[1]
            self.pause = None
        self.version += 1
        self.steps += 1
        self.admit()
        self._maybe_train()


def simulate(cfg: SimConfig) -> SimResult:
    return _Sim(cfg).run()
