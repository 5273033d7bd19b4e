"""The live progress of ``harnessrl run``: step, trials running / done, reward,
termination reasons, train/inference agreement. A rich live panel on a terminal;
one plain line per trainer step otherwise (logs, CI, tests)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.table import Table


@dataclass
class Snapshot:
    step: int
    steps: int
    trials: dict[str, int]
    reasons: dict[str, int]
    values: dict[str, float]
    trainer_state: str
    elapsed_s: float


def step_line(s: Snapshot) -> str:
    v = s.values
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
        if key in s.values:
            t.add_row(key, f"{s.values[key]:.4g}")
    t.add_row("elapsed", f"{s.elapsed_s:.0f} s")
    return t


class Progress:
    """Polls ``snapshot()`` every ``every_s``; prints a line at each new step."""

    def __init__(self, snapshot: Callable[[], Snapshot], console: Console, every_s: float = 1.0) -> None:
        self.snapshot, self.console, self.every_s = snapshot, console, every_s
        self.started = time.monotonic()
        self._printed_step = -1

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
            self.console.print(step_line(s), highlight=False, markup=False, soft_wrap=True)
