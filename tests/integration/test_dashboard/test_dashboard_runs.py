"""What a newcomer sees first: the runs list (training runs before single trials and
evaluations, each filled in), one step convention on every per-step series, why a step
has no agreement, no trace link without a trace UI, and no polling of a finished run."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from harnessrl.paths import default_model_dir
from services.dashboard import panels
from services.dashboard.rundir import StepRecord
from tests.integration.test_dashboard.conftest import TOKEN, dashboard, dashboard_settings
from tests.integration.test_dashboard.recorder import EVAL_ONLY_ID, RUN_ID, Extras
from tests.integration.test_dashboard.test_dashboard_api import store_trajectories

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_training_runs_come_first_and_trials_and_evaluations_are_filled_in(
    mixed_root: Path, extras: Extras
) -> None:
    trial_id = extras.trial_dir.name
    async with dashboard(mixed_root) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        runs = (await c.get("/api/runs")).json()["runs"]
    # The trial and the evaluation were made after the training run: newest-first alone would list them above it.
    assert [(r["run_id"], r["kind"]) for r in runs] == [(RUN_ID, "run"), (EVAL_ONLY_ID, "eval"), (trial_id, "trial")]
    train, evaluation, trial = runs
    assert train["steps"] == 3 and train["steps_planned"] == 3 and train["reward"] is not None
    assert train["validation"] is not None and train["evaluated_steps"] == [0, 3]
    info = json.loads((extras.trial_dir / "run.json").read_text())
    assert trial["model"] == info["model"] == default_model_dir().name
    assert trial["reward"] == 1.0 and trial["termination_reason"] == "completed" and trial["task_id"] == "test/hello"
    assert trial["status"] == "done" and trial["problems"] == 0
    rows = [json.loads(line) for line in (extras.eval_dir / "eval.jsonl").read_text().splitlines()]
    overall = next(r for r in rows if r["task_id"] == "*")
    assert evaluation["validation"] == overall["pass@1"] and evaluation["evaluated_steps"] == [0]
    assert evaluation["problems"] == 0, "an evaluation has no trainer metrics by design"


async def test_every_per_step_series_is_keyed_by_the_rollout_step(runs_root: Path) -> None:
    """metrics.jsonl writes the trainer's step k for the batch enqueued at k - 1: on the
    page both are step k - 1, so the train reward of a step is the mean reward of that
    step's trajectories in the capture store."""
    truth = await store_trajectories(runs_root)
    async with dashboard(runs_root) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        s = (await c.get(f"/api/runs/{RUN_ID}/summary")).json()
    assert [(m["step"], m["trainer_step"]) for m in s["metrics"]] == [(0, 1), (1, 2), (2, 3)]
    for m in s["metrics"]:
        done = [t.reward for t in truth if t.step == m["step"] and t.termination_reason == 1]
        assert m["values"]["reward/mean"] == pytest.approx(statistics.fmean(done)), m["step"]
    assert set(s["success_rate"]) == {str(m["step"]) for m in s["metrics"]} == set(s["termination"]["by_step"])
    assert set(s["rollout_tokens_per_s"]) <= set(s["success_rate"])
    assert set(s["validation"]) == {"0", "3"}, "validation at N: the policy after N updates"
    assert ("agreement_drop", 2) in {(a["kind"], a["step"]) for a in s["alerts"]}


async def test_a_step_without_agreement_says_why(runs_root: Path) -> None:
    """A batch sampled entirely by older weights: the trainer records agreement/tokens = 0 and no Pearson."""
    path = runs_root / RUN_ID / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    stale = records[1]["values"]
    for key in [k for k in stale if k.startswith("agreement/")]:
        del stale[key]
    stale |= {"agreement/tokens": 0.0, "staleness/mean": 1.0, "staleness/max": 1.0}
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    async with dashboard(runs_root) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        s = (await c.get(f"/api/runs/{RUN_ID}/summary")).json()
    assert list(s["agreement_gaps"]) == ["1"]
    why = s["agreement_gaps"]["1"]
    assert "sampled by the weights being trained" in why and "staleness 1 versions" in why


def test_agreement_gap_reasons_come_from_what_the_trainer_recorded() -> None:
    measured = StepRecord(0, 0.0, {"agreement/pearson": 0.999, "agreement/tokens": 40.0})
    flat = StepRecord(1, 0.0, {"skipped/zero_variance_groups": 2.0})
    silent = StepRecord(2, 0.0, {"reward/mean": 0.5, "batch/samples": 4.0})
    gaps = panels.agreement_gaps([measured, flat, silent])
    assert list(gaps) == [1, 2]
    assert "no optimizer update" in gaps[1] and "recorded no agreement" in gaps[2]
    assert panels.agreement_gaps([flat, silent]) == {}, "a trainer that records none: the panel says so once"


async def test_the_trace_link_appears_only_when_a_trace_ui_is_configured(runs_root: Path) -> None:
    trial = "s0-hello-0"
    async with dashboard(runs_root) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        assert (await c.get(f"/api/runs/{RUN_ID}/trajectories/{trial}")).json()["trace_url"] is None
    ui = "http://127.0.0.1:16686/search?service=sandbox&tags=run:{run_id},trial:{trial_id}"
    async with dashboard(runs_root, trace_url=ui) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        view = (await c.get(f"/api/runs/{RUN_ID}/trajectories/{trial}")).json()
    assert view["trace_url"] == ui.format(run_id=RUN_ID, trial_id=trial)


@pytest.mark.parametrize(
    ("url", "why"),
    [("127.0.0.1:16686/trace/{trace_id}", "not an http(s) URL"), ("http://j/trace/{span}", "only {trace_id}")],
)
def test_a_malformed_trace_url_is_refused_by_name(tmp_path: Path, url: str, why: str) -> None:
    with pytest.raises(ValidationError) as e:
        dashboard_settings(tmp_path, trace_url=url)
    assert "trace_url" in str(e.value) and why in str(e.value)


def test_serve_refuses_a_malformed_trace_url(tmp_path: Path) -> None:
    env = {**os.environ, "HARNESSRL_DASHBOARD_TRACE_URL": "http://jaeger/trace/{span_id}"}
    proc = subprocess.run(
        [sys.executable, "-m", "stack.cli", "dashboard", "serve", "--port", "0", "--runs-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert "trace_url" in proc.stderr and "span_id" in proc.stderr and "Traceback" not in proc.stderr


async def test_a_finished_runs_event_stream_ends_after_its_last_update(runs_root: Path) -> None:
    async with (
        dashboard(runs_root) as d,
        httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as c,
        c.stream("GET", f"/api/runs/{RUN_ID}/events") as events,
    ):

        async def read_all() -> list[str]:
            return [line async for line in events.aiter_lines()]

        lines = await asyncio.wait_for(read_all(), 60)  # the server ends the stream: this returns
    updates = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert len(updates) == 1 and updates[0]["live"] is False and updates[0]["status"] == "done"
    assert any(line.startswith("retry: ") for line in lines)
