"""A verl run on the dashboard: verl's own file logger (``verl.utils.tracking``,
backend ``file``) writes a run's metrics.jsonl in its shape (``{"step", "data"}``)
with the ``harnessrl/*`` counts that stack/verl/hooks.py adds to verl's step
metrics, computed by verl's ``compute_data_metrics`` on a batch that verl's agent
loop worker assembled (tests/integration/test_verl_hooks.py). The dashboard's API
and its page (headless Chromium) show the masked rows and the dropped segments;
a torn line is one problem, and no other line is lost."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import metric_utils
from verl.utils.tracking import Tracking

from harnessrl import paths
from stack.verl import hooks as verl_hooks
from tests.integration.test_dashboard.conftest import TOKEN, dashboard, needs_chromium, page_check
from tests.integration.test_verl_hooks import group_batch
from tests.verl_support import compute_advantage

RUN = "verl-run"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

pytestmark = pytest.mark.skipif(
    not (paths.default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"
)


async def step_metrics(dropped: list[int] | None = None) -> dict[str, Any]:
    """verl's step metrics of the hooks test's batch (7 rows, 3 masked), optionally
    with segments the agent loop could not hand to verl."""
    batch = await group_batch()
    if dropped is not None:
        batch.non_tensor_batch["harnessrl_dropped_segments"] = np.array(dropped, dtype=object)
    batch = compute_advantage(batch, adv_estimator=verl_hooks.ESTIMATOR, config=AlgoConfig())
    return metric_utils.compute_data_metrics(batch=batch, use_critic=False)


@pytest.fixture(scope="module")
def verl_steps() -> tuple[dict[str, Any], dict[str, Any]]:
    """Two steps' metrics, made once: the batch as is, then with dropped segments."""

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        return await step_metrics(), await step_metrics(dropped=[0, 2, 0, 0, 1, 0, 0])

    return asyncio.run(both())


def write_verl_run(root: Path, steps: tuple[dict[str, Any], dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run folder holding only what verl writes: metrics.jsonl from its file logger
    (steps 1 and 2, step 2's validation logged apart as verl does, a torn line between)."""
    run = root / RUN
    run.mkdir(parents=True)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(run / "metrics.jsonl"))
    tracking = Tracking(project_name="harnessrl", experiment_name=RUN, default_backend=["file"])
    tracking.log(data=steps[0], step=1)
    tracking.logger["file"].fp.write(b'{"step": 2, "data": {"harnessrl/masked_rows": \n')  # a torn write
    tracking.log(data=steps[1], step=2)
    tracking.log(data={"val-core/harnessrl/reward/mean@1": 0.25}, step=2)
    tracking.finish()
    return run


async def test_a_verl_runs_metrics_show_masked_rows_and_dropped_segments(
    tmp_path: Path, verl_steps: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = write_verl_run(tmp_path, verl_steps, monkeypatch)
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0]).keys() == {"step", "data"}
    async with dashboard(tmp_path) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        assert RUN in [r["run_id"] for r in (await c.get("/api/runs")).json()["runs"]]
        summary = (await c.get(f"/api/runs/{RUN}/summary")).json()
    bad = [p for p in summary["problems"] if p.startswith("metrics.jsonl")]
    assert bad == ["metrics.jsonl line 2: not JSON (Expecting value)"], summary["problems"]
    assert [m["trainer_step"] for m in summary["metrics"]] == [1, 2], "nothing but the torn line is lost"
    step2 = summary["metrics"][1]["values"]
    assert step2["val-core/harnessrl/reward/mean@1"] == 0.25 and "critic/score/mean" in step2, "one step, merged"
    masking = summary["masking"]
    # verl's global step k trains the rollouts of step k - 1 (the charts' rollout step axis)
    assert masking["masked_rows"] == {"0": 3.0, "1": 3.0}
    assert masking["dropped_segments"] == {"0": 0.0, "1": 3.0}
    assert masking["by_reason"] == {
        "infra": {"0": 2.0, "1": 2.0},
        "infra/env_setup_failed": {"0": 1.0, "1": 1.0},
        "infra/verifier_error": {"0": 1.0, "1": 1.0},
        "response_too_long": {"0": 1.0, "1": 1.0},
    }


@needs_chromium
async def test_a_verl_runs_page_shows_masked_rows_and_dropped_segments(
    tmp_path: Path, verl_steps: Any, monkeypatch: pytest.MonkeyPatch, web_dist: Path, artifacts: Path
) -> None:
    write_verl_run(tmp_path / "runs", verl_steps, monkeypatch)
    async with dashboard(tmp_path / "runs") as d:
        cfg = {
            "url": d.url,
            "token": TOKEN,
            "runId": RUN,
            "maskedRowsText": "masked rows3 (infra/env_setup_failed 1, infra/verifier_error 1, response_too_long 1)",
            "droppedText": "dropped segments3",
            "series": ["masked rows:2", "masked: infra:2", "dropped segments:2", "train reward:2"],
            "artifacts": str(artifacts),
        }
        await page_check("verl_run.mjs", cfg, tmp_path)
    assert (artifacts / "verl-run.png").stat().st_size > 10_000
