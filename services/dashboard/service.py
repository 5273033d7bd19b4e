"""The dashboard's service object: runs, their panels, trajectories and live
fingerprints. Routes and the static export only call this.

Sources per run: run.json/config.toml/eval.jsonl from the run directory; the
trainer's metrics over gRPC while the run is live (metrics.jsonl otherwise, or
when the trainer cannot be reached, with a problem saying so); trajectories
from the run's capture store over gRPC.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from harnessrl.errors import ConfigError, HarnessError, InvalidArgument, NotFound
from harnessrl.logs import kv
from harnessrl.v1 import records_pb2
from services.dashboard import heldout, panels, rundir, runlist, trajectories
from services.dashboard.rundir import RunDir, StepRecord
from services.dashboard.settings import Settings
from services.dashboard.sources import CaptureOpener, Readers, TargetOpener
from services.dashboard.text import Decoder, ToolParser, load_decoder, resolve_model_dir, tool_parser

log = logging.getLogger(__name__)
DIGEST_CONCURRENCY = 8


@dataclass
class RunState:
    """What one read of a run gathered; ``problems`` add to the run directory's own."""

    run: RunDir
    rows: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[StepRecord] = field(default_factory=list)
    eval_rows: list[dict[str, Any]] = field(default_factory=list)
    status: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    decoder: Decoder | None = None
    parser: ToolParser | None = None


class DashboardService:
    def __init__(self, settings: Settings, opener: CaptureOpener | None = None) -> None:
        self.settings = settings
        self.opener = opener or TargetOpener()
        token = settings.capture_token.get_secret_value() if settings.capture_token else None
        trainer_token = settings.trainer_token.get_secret_value() if settings.trainer_token else None
        self.readers = Readers(token, trainer_token, settings.rpc_timeout_s)
        self._digests: dict[tuple[str, str], dict[str, Any]] = {}

    async def close(self) -> None:
        await self.readers.close()
        await self.opener.close()

    # -- runs -------------------------------------------------------------------
    def open(self, run_id: str) -> RunDir:
        root = self.settings.root()
        if self.settings.run_dir is not None and run_id != self.settings.run_dir.name:
            raise NotFound(f"no run {run_id!r}: this dashboard serves {self.settings.run_dir.name} only")
        return rundir.open_run(root, run_id)

    def run_ids(self) -> list[str]:
        if self.settings.run_dir is not None:
            return [self.settings.run_dir.name] if rundir.is_run_dir(self.settings.run_dir) else []
        return rundir.list_run_ids(self.settings.runs_dir)

    async def list_runs(self) -> list[dict[str, Any]]:
        """Every run directory's row (``runlist``): training runs, evaluations, single trials."""
        rows = [runlist.row(rundir.open_run(self.settings.root(), run_id)) for run_id in self.run_ids()]
        return runlist.ordered(rows)

    async def gather(self, run_id: str, *, with_rows: bool = True) -> RunState:
        state = RunState(self.open(run_id))
        run = state.run
        state.eval_rows, eval_problems = rundir.read_eval(run)
        state.problems += eval_problems
        await self._gather_metrics(state)
        if with_rows:
            await self._gather_rows(state)
        return state

    async def _gather_metrics(self, state: RunState) -> None:
        run = state.run
        if run.live and run.info and run.info.trainer_target:
            try:
                trainer = await self.readers.trainer(run.info.trainer_target)
                state.status = await trainer.status()
                state.metrics = await trainer.metrics(0)
                return
            except HarnessError as e:
                state.problems.append(f"live trainer unreachable, metrics from metrics.jsonl: {e}")
        state.metrics, problems = rundir.read_metrics(run)
        state.problems += problems

    async def _gather_rows(self, state: RunState) -> None:
        state.rows = await self._rows(state, state.run.run_id)

    async def _rows(self, state: RunState, run_id: str) -> list[dict[str, Any]]:
        """The listing rows of ``run_id``'s trajectories in the run's capture store."""
        run = state.run
        if run.info is None or run.info.capture is None:
            return []
        try:
            reader = await self.readers.capture(await self.opener.target_for(run))
            return [trajectories.row(t) for t in await reader.list_all(run_id)]
        except HarnessError as e:
            state.problems.append(f"capture store: {e}")
            return []

    def _text(self, state: RunState) -> None:
        """The run's decoder and tool parser; what is unavailable becomes a problem."""
        run, cfg = state.run, state.run.config()
        name = self.settings.tool_parser or cfg.get("proxy", {}).get("tool_parser") or "hermes"
        try:
            state.parser = tool_parser(str(name))
        except ConfigError as e:
            state.problems.append(f"{e}; tool calls parsed as hermes")
            state.parser = tool_parser("hermes")
        named = (run.info.tokenizer or run.info.model) if run.info else None
        model_dir = resolve_model_dir(self.settings.model_dir, named)
        if model_dir is None:
            state.problems.append("no model named: tokens are shown as ids, tool calls are not parsed")
            return
        try:
            state.decoder = load_decoder(model_dir)
        except ConfigError as e:
            state.problems.append(f"{e}: tokens are shown as ids, tool calls are not parsed")

    # -- pages ------------------------------------------------------------------
    async def overview(self, run_id: str) -> dict[str, Any]:
        state = await self.gather(run_id, with_rows=False)
        run = state.run
        return {
            "run_id": run.run_id,
            "info": run.info.model_dump(mode="json") if run.info else None,
            "config": run.config_text(),
            "live": run.live,
            "status": state.status,
            "problems": run.problems + state.problems,
            "latest": state.metrics[-1].as_json() if state.metrics else None,
            "analysis_enabled": self.settings.analysis.endpoint is not None,
            "trace_url": self.settings.trace_url,
        }

    async def summary(self, run_id: str) -> dict[str, Any]:
        state = await self.gather(run_id)
        self._text(state)
        digests = await self._digests_for(state)
        info, cfg = state.run.info, state.run.config()
        threshold = float(cfg.get("trainer", {}).get("algo", {}).get("success_threshold", 1.0))
        summary = panels.summarize(
            state.rows,
            digests,
            state.metrics,
            state.eval_rows,
            threshold=threshold,
            group_size=info.group_size if info else None,
            alert_cfg=self.settings.alerts,
        )
        summary["heldout"] = await self._heldout(state, threshold)
        summary["problems"] = state.run.problems + state.problems
        summary["status"] = state.status
        if state.status:
            summary["alerts"] += [{"kind": "trainer", "step": None, "message": a} for a in state.status["alerts"]]
        return summary

    async def _heldout(self, state: RunState, threshold: float) -> dict[int, dict[str, Any]]:
        """Behaviour per evaluation step, from the evaluations' captured trajectories."""
        if not state.eval_rows:
            return {}
        run_id = heldout.eval_run_id(state.run.run_id)
        rows = await self._rows(state, run_id)
        digests = await self._digests_for(state, run_id, rows)
        return heldout.behaviour(rows, digests, state.eval_rows, threshold)

    async def _digests_for(
        self, state: RunState, run_id: str | None = None, rows: list[dict[str, Any]] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Per-trajectory digests (the run's own rows unless given); finalized ones are
        cached (they no longer change)."""
        run_id = run_id or state.run.run_id
        rows = state.rows if rows is None else rows
        out: dict[str, dict[str, Any]] = {}
        todo = []
        for r in rows:
            cached = self._digests.get((run_id, r["trial_id"]))
            if cached is not None:
                out[r["trial_id"]] = cached
            else:
                todo.append(r)
        if not todo:
            return out
        reader = await self.readers.capture(await self.opener.target_for(state.run))
        sem = asyncio.Semaphore(DIGEST_CONCURRENCY)

        async def one(r: dict[str, Any]) -> None:
            async with sem:
                try:
                    traj = await reader.get(run_id, r["trial_id"], include_tokens=True)
                except HarnessError as e:
                    log.warning("digest failed", extra=kv(run=run_id, trial=r["trial_id"], error=str(e)))
                    return
            assert state.parser is not None
            d = (await asyncio.to_thread(trajectories.digest, traj, state.decoder, state.parser)).as_json()
            out[r["trial_id"]] = d
            if traj.finalized:
                self._digests[(run_id, r["trial_id"])] = d

        await asyncio.gather(*(one(r) for r in todo))
        return out

    async def trajectory_rows(
        self, run_id: str, step: int | None = None, task: str | None = None, reason: str | None = None
    ) -> list[dict[str, Any]]:
        state = await self.gather(run_id)
        self._text(state)
        digests = await self._digests_for(state)
        rows = [{**r, "model_calls": digests.get(r["trial_id"], {}).get("calls")} for r in state.rows]
        if step is not None:
            rows = [r for r in rows if r["step"] == step]
        if task:
            rows = [r for r in rows if r["task_id"] == task]
        if reason:
            rows = [r for r in rows if r["termination_reason"] == reason]
        return rows

    async def trajectory(self, run_id: str, trial_id: str) -> dict[str, Any]:
        if not rundir.RUN_ID.match(trial_id):
            raise InvalidArgument(f"bad trial id {trial_id!r}")
        state = RunState(self.open(run_id))
        self._text(state)
        reader = await self.readers.capture(await self.opener.target_for(state.run))
        traj: records_pb2.Trajectory = await reader.get(run_id, trial_id, include_tokens=True)
        assert state.parser is not None
        view = await asyncio.to_thread(
            trajectories.view, traj, state.decoder, state.parser, self.settings.max_token_view
        )
        view["trace_url"] = self.trace_link(view)
        view["problems"] = state.problems
        return view

    async def trajectory_exists(self, run_id: str, trial_id: str) -> None:
        """NotFound unless the run and the trial exist (a page check, metadata only)."""
        if not rundir.RUN_ID.match(trial_id):
            raise NotFound(f"no trajectory {trial_id!r}")
        run = self.open(run_id)
        reader = await self.readers.capture(await self.opener.target_for(run))
        await reader.get(run_id, trial_id, include_tokens=False)

    async def find_trial(self, trial_id: str) -> str:
        """The run holding a trial, found by its id alone (``rundir.runs_holding``)."""
        candidates = [r for r in rundir.runs_holding(self.settings.root(), trial_id) if r in self.run_ids()]
        for run_id in candidates:
            try:
                await self.trajectory_exists(run_id, trial_id)
            except HarnessError as e:
                log.info("trial not in a candidate run", extra=kv(run=run_id, trial=trial_id, error=str(e)))
                continue
            return run_id
        raise NotFound(f"no run under {self.settings.root()} holds a trial {trial_id!r}")

    def trace_link(self, view: dict[str, Any]) -> str | None:
        """The trial's trace in the configured trace UI; None when none is configured
        (a link to a UI that is not running is worse than no link)."""
        template = self.settings.trace_url
        trace_id = view["metadata"].get("trace_id")
        if template is None or (not trace_id and "{trace_id}" in template):
            return None
        return template.format(trace_id=trace_id or "", trial_id=view["trial_id"], run_id=view["run_id"])

    async def fingerprint(self, run_id: str) -> dict[str, Any]:
        """What changes when a live run moves on: SSE sends an update when it does."""
        state = await self.gather(run_id)
        return {
            "live": state.run.live,
            "status": state.run.info.status if state.run.info else None,
            "last_step": state.metrics[-1].step if state.metrics else None,
            "trajectories": len(state.rows),
            "finalized": sum(r["finalized"] for r in state.rows),
            "trainer_step": state.status["step"] if state.status else None,
        }

    async def compare(self, run_ids: list[str]) -> dict[str, Any]:
        if not 2 <= len(run_ids) <= 4:
            raise InvalidArgument("compare needs 2 to 4 run ids")
        out = []
        for run_id in run_ids:
            s = await self.summary(run_id)
            out.append(
                {
                    "run_id": run_id,
                    "metrics": s["metrics"],
                    "success_rate": s["success_rate"],
                    "infra_share": s["termination"]["infra_share"],
                    "zero_variance_share": s["groups"]["zero_variance_share"],
                    "mean_turns": s["behaviour"]["mean_turns"],
                    "validation": s["validation"],
                    "alerts": s["alerts"],
                }
            )
        return {"runs": out}
