"""A live run (status running): metrics and status come from the trainer over
gRPC, not from files; assisted analysis against a local OpenAI-compatible
server started here (never the internet)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from harnessrl.localservers import free_port
from services.trainer.server import create_server as create_trainer_server
from services.trainer.service import TrainerService
from services.trainer.settings import Settings as TrainerSettings
from tests.integration.test_dashboard.conftest import TOKEN, dashboard, serve
from tests.integration.test_dashboard.recorder import RUN_ID
from tests.trainer_support import served

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def trainer() -> AsyncIterator[tuple[str, TrainerService]]:
    """The trainer's real server over a service the test writes to, as the loop would."""
    service = TrainerService(RUN_ID)
    service.set_state("training", groups_pending=5)
    service.record_step(
        1, 7, {"reward/mean": 0.25, "agreement/pearson": 0.5}, ["importance weights degenerate: ESS 0.100 < 0.5"]
    )
    running = await create_trainer_server(TrainerSettings(port=0, run_id=RUN_ID), service)
    try:
        yield f"127.0.0.1:{running.port}", service
    finally:
        await running.stop(0)


def make_live(root: Path, trainer_target: str) -> None:
    path = root / RUN_ID / "run.json"
    info = json.loads(path.read_text()) | {"status": "running", "trainer_target": trainer_target}
    path.write_text(json.dumps(info))


async def test_live_run_reads_the_trainer_over_grpc(runs_root: Path, trainer: tuple[str, TrainerService]) -> None:
    target, service = trainer
    wall_time = service.metrics(0).steps[0].wall_time
    calls = {m: served("trainer", m) for m in ("Status", "Metrics")}
    make_live(runs_root, target)
    async with dashboard(runs_root) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        overview = (await c.get(f"/api/runs/{RUN_ID}")).json()
        summary = (await c.get(f"/api/runs/{RUN_ID}/summary")).json()
    assert overview["live"] and overview["status"]["groups_pending"] == 5
    assert overview["status"]["policy_version"] == 7
    # the trainer's metrics, not metrics.jsonl (which has steps 1-3 with other values)
    values = {"reward/mean": 0.25, "agreement/pearson": 0.5}
    # the trainer's step 1 trained the rollouts of step 0
    assert summary["metrics"] == [{"step": 0, "trainer_step": 1, "wall_time": wall_time, "values": values}]
    assert all(served("trainer", m) > n for m, n in calls.items()), calls
    assert any(a["kind"] == "trainer" and "ESS" in a["message"] for a in summary["alerts"])
    assert any(a["kind"] == "agreement_drop" and a["step"] == 0 for a in summary["alerts"])


async def test_unreachable_trainer_falls_back_to_the_file_and_says_so(runs_root: Path) -> None:
    make_live(runs_root, f"127.0.0.1:{free_port()}")
    async with dashboard(runs_root, rpc_timeout_s=2) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        summary = (await c.get(f"/api/runs/{RUN_ID}/summary")).json()
    assert [m["trainer_step"] for m in summary["metrics"]] == [1, 2, 3]
    assert any("live trainer unreachable" in p for p in summary["problems"])


def openai_compatible(answer: str, seen: list[dict[str, Any]], status: int = 200) -> FastAPI:
    """A minimal OpenAI-compatible chat-completions server (the test's stand-in endpoint)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        seen.append({"auth": request.headers.get("authorization"), "body": await request.json()})
        if status != 200:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=status)
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
        }

    return app


ANSWER = json.dumps(
    {
        "candidates": [
            {
                "title": "Inference engine outage at step 2",
                "explanation": "Half of step 2's trials ended in engine_error: the engine, not the policy.",
                "category": "infrastructure",
                "evidence": ["infra share 0.5 at step 2"],
                "checks": ["gateway logs around step 2"],
            },
            {"title": "Policy got lazier", "explanation": "Mean turns fell.", "category": "policy"},
            {"no_title": True},
        ]
    }
)


async def test_assisted_analysis_sends_the_anomaly_summary_and_keeps_the_key(runs_root: Path) -> None:
    seen: list[dict[str, Any]] = []
    async with serve(openai_compatible(f"Here you go:\n```json\n{ANSWER}\n```", seen)) as llm:
        analysis = {"endpoint": f"{llm}/v1", "model": "local-judge", "api_key": "sk-secret-key"}
        async with dashboard(runs_root, analysis=analysis) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
            assert (await c.get(f"/api/runs/{RUN_ID}/analysis")).json() == {"enabled": True, "candidates": []}
            resp = await c.post(f"/api/runs/{RUN_ID}/analysis")
            assert resp.status_code == 200, resp.text
            assert "sk-secret-key" not in resp.text
            found = resp.json()["candidates"]
            assert [x["title"] for x in found] == ["Inference engine outage at step 2", "Policy got lazier"]
            assert found[0]["category"] == "infrastructure" and found[0]["verdict"] is None
            ok = await c.post(f"/api/runs/{RUN_ID}/analysis/{found[0]['id']}", json={"verdict": "confirmed"})
            assert ok.json()["verdict"] == "confirmed"
            bad = await c.post(f"/api/runs/{RUN_ID}/analysis/{found[1]['id']}", json={"verdict": "maybe"})
            assert bad.status_code == 400
            assert (await c.post(f"/api/runs/{RUN_ID}/analysis/nope", json={"verdict": "dismissed"})).status_code == 404
            assert (await c.post(f"/api/runs/{RUN_ID}/analysis/x", content=b"{not json")).status_code == 400
            stored = (await c.get(f"/api/runs/{RUN_ID}/analysis")).json()["candidates"]
            assert [x["verdict"] for x in stored] == ["confirmed", None]
    assert seen[0]["auth"] == "Bearer sk-secret-key" and seen[0]["body"]["model"] == "local-judge"
    summary = json.loads(seen[0]["body"]["messages"][1]["content"])
    kinds = {a["kind"] for a in summary["alerts"]}
    assert {"infra_spike", "turn_collapse", "agreement_drop", "zero_variance_growth"} <= kinds
    assert summary["termination_by_step"]["2"] == {"completed": 3, "engine_error": 3}


async def test_assisted_analysis_errors_are_clear(runs_root: Path) -> None:
    async with dashboard(runs_root) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        off = await c.post(f"/api/runs/{RUN_ID}/analysis")
        assert off.status_code == 409 and "off" in off.json()["error"]
    seen: list[dict[str, Any]] = []
    for app, status, words in [
        (openai_compatible("I cannot help with that.", seen), 502, "no candidate"),
        (openai_compatible("", seen, status=503), 502, "answered 503"),
    ]:
        async with serve(app) as llm:
            settings = {"analysis": {"endpoint": f"{llm}/v1"}}
            async with dashboard(runs_root, **settings) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
                resp = await c.post(f"/api/runs/{RUN_ID}/analysis")
                assert resp.status_code == status and words in resp.json()["error"], resp.text
    blocked = runs_root / "not-a-dir"
    blocked.write_text("")  # a store_dir that cannot be created (run dirs mounted read-only: same answer)
    async with serve(openai_compatible(ANSWER, seen)) as llm:
        settings = {"analysis": {"endpoint": f"{llm}/v1", "store_dir": str(blocked / "x")}}
        async with dashboard(runs_root, **settings) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
            resp = await c.post(f"/api/runs/{RUN_ID}/analysis")
            assert resp.status_code == 409 and "cannot keep analysis candidates" in resp.json()["error"]
        elsewhere = runs_root.parent / "analysis"
        settings = {"analysis": {"endpoint": f"{llm}/v1", "store_dir": str(elsewhere)}}
        async with dashboard(runs_root, **settings) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
            assert (await c.post(f"/api/runs/{RUN_ID}/analysis")).status_code == 200
        assert (elsewhere / RUN_ID / "analysis.json").exists()
        assert not (runs_root / RUN_ID / "dashboard").exists()
    gone = {"analysis": {"endpoint": f"http://127.0.0.1:{free_port()}/v1", "timeout_s": 5}}
    async with dashboard(runs_root, **gone) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        resp = await c.post(f"/api/runs/{RUN_ID}/analysis")
        assert resp.status_code == 503 and "unreachable" in resp.json()["error"]
