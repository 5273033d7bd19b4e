"""The dashboard's HTTP API over a recorded run: every panel's data is checked
against the capture store and the engine's own log, not against itself."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from harnessrl.arrays import unpack_f32, unpack_i32
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2
from stack.dashboard import EmbeddedCaptureOpener
from tests.integration.test_dashboard.conftest import TOKEN, dashboard
from tests.integration.test_dashboard.recorder import BEHAVIOURS, EVAL_PLAN, PLAN, RUN_ID, Recorded

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def store_trajectories(root: Path, include_tokens: bool = False) -> list:
    """The recorded run as the capture store returns it (the ground truth)."""
    from services.dashboard.rundir import open_run

    opener = EmbeddedCaptureOpener()
    try:
        endpoint = await opener.target_for(open_run(root, RUN_ID))
        async with connect(endpoint.target, endpoint.token) as channel:
            stub = capture_pb2_grpc.CaptureStoreStub(channel)
            listed = await stub.ListTrajectories(capture_pb2.ListTrajectoriesRequest(run_id=RUN_ID))
            if not include_tokens:
                return list(listed.trajectories)
            return [
                await stub.GetTrajectory(
                    capture_pb2.GetTrajectoryRequest(run_id=RUN_ID, trial_id=t.trial_id, include_tokens=True)
                )
                for t in listed.trajectories
            ]
    finally:
        await opener.close()


async def test_runs_overview_and_panels_match_the_capture_store(runs_root: Path) -> None:
    truth = await store_trajectories(runs_root)
    async with dashboard(runs_root) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        runs = (await c.get("/api/runs")).json()["runs"]
        assert [r["run_id"] for r in runs] == [RUN_ID] and runs[0]["problems"] == 0
        overview = (await c.get(f"/api/runs/{RUN_ID}")).json()
        assert overview["problems"] == [] and overview["info"]["group_size"] == 3
        assert 'tool_parser = "hermes"' in overview["config"]
        s = (await c.get(f"/api/runs/{RUN_ID}/summary")).json()
    # termination reasons per step, as the store has them
    expected: dict[str, Counter[str]] = {}
    for t in truth:
        name = records_pb2.TerminationReason.Name(t.termination_reason)
        expected.setdefault(str(t.step), Counter())[name.removeprefix("TERMINATION_REASON_").lower()] += 1
    assert s["termination"]["by_step"] == {k: dict(v) for k, v in expected.items()}
    assert s["termination"]["by_step"]["2"] == {"completed": 3, "engine_error": 3}
    # successes out of G per group, with G from the run
    groups = {g["group_id"]: g for g in s["groups"]["groups"]}
    for t in truth:
        assert groups[t.group_id]["G"] == 3
    for group_id, g in groups.items():
        members = [t for t in truth if t.group_id == group_id]
        assert g["successes"] == sum(t.has_reward and t.reward >= 1 and t.termination_reason == 1 for t in members)
    assert groups["s1-hello"]["successes"] == 2 and groups["s0-greet"]["zero_variance"]
    assert s["tasks"]["tasks"]["hello"]["1"] == {"solved": 2, "trials": 3, "rate": 2 / 3}
    # behaviour: every tool call the scripted policies made, and the malformed ones
    calls: dict[int, Counter[str]] = {}
    malformed: Counter[int] = Counter()
    for step, plan in PLAN.items():
        for behaviours in plan.values():
            for b in behaviours:
                for entry in BEHAVIOURS.get(b, []):
                    calls.setdefault(step, Counter()).update(c["name"] for c in entry.get("tool_calls", []))
                    malformed[step] += "<tool_call>" in entry["content"]
    assert s["behaviour"]["tool_calls"] == {str(k): dict(v) for k, v in calls.items()}
    assert s["behaviour"]["malformed"] == {str(k): malformed[k] for k in PLAN}
    assert s["behaviour"]["mean_turns"]["0"] == pytest.approx((4 + 1 + 2 + 4 + 4 + 1) / 6)
    assert s["failures"]["by_step"]["2"] == {"agent/infra": 3}
    kinds = {(a["kind"], a["step"]) for a in s["alerts"]}
    assert {("infra_spike", 2), ("turn_collapse", 2), ("agreement_drop", 2)} <= kinds  # the rollout step axis
    assert not any(k == "infra_spike" and step != 2 for k, step in kinds)
    assert [(m["step"], m["trainer_step"]) for m in s["metrics"]] == [(0, 1), (1, 2), (2, 3)]


async def test_heldout_behaviour_per_evaluation_step_comes_from_the_evaluations_captures(runs_root: Path) -> None:
    """What the scripted policies did in the evaluations (run rec-1-eval), step by step:
    derived here from the plan, read there from the captured tokens."""
    async with dashboard(runs_root) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        held = (await c.get(f"/api/runs/{RUN_ID}/summary")).json()["heldout"]
    assert sorted(held, key=int) == [str(s) for s in EVAL_PLAN]
    for step, plan in EVAL_PLAN.items():
        row = held[str(step)]
        trials = [(task, b) for task, behaviours in plan.items() for b in behaviours]
        replies = [BEHAVIOURS[b] for _, b in trials]
        solved = {task: [float(b == f"solve_{task}") for t, b in trials if t == task] for task in plan}
        malformed = sum("<tool_call>" in e["content"] and not e.get("tool_calls") for r in replies for e in r)
        calls = sum(len(r) + 1 for r in replies)  # + the side thread's title call
        ended = [not r[-1].get("tool_calls") and "<tool_call>" not in r[-1]["content"] for r in replies]
        assert row["trials"] == len(trials) and row["infra"] == 0
        assert row["success_rate"] == pytest.approx(sum(map(sum, solved.values())) / len(trials))
        assert row["pass"]["pass@1"] == pytest.approx(sum(sum(v) / len(v) for v in solved.values()) / len(plan))
        assert row["pass"]["pass^2"] == pytest.approx(sum(min(v) for v in solved.values()) / len(plan))
        assert row["malformed_rate"] == pytest.approx(malformed / calls)
        assert row["calls_per_trial"] == pytest.approx(sum(len(r) for r in replies) / len(trials))
        assert row["submit_rate"] == pytest.approx(sum(ended) / len(trials))
        assert row["response_tokens"] > 0 and row["termination"] == {"completed": len(trials)}
    assert held["0"]["pass"]["pass@1"] < held["3"]["pass"]["pass@1"]


async def test_trajectory_view_shows_exactly_what_the_engine_sampled(runs_root: Path, recorded: Recorded) -> None:
    truth = {t.trial_id: t for t in await store_trajectories(runs_root, include_tokens=True)}
    engine = [json.loads(line) for line in recorded.engine_logs["explore"].read_text().splitlines()]
    trial = "s0-hello-0"  # an "explore" trial: four model calls, three tool calls
    jaeger = "http://127.0.0.1:16686/trace/{trace_id}"
    async with dashboard(runs_root, trace_url=jaeger) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        view = (await c.get(f"/api/runs/{RUN_ID}/trajectories/{trial}")).json()
        rows = (await c.get(f"/api/runs/{RUN_ID}/trajectories", params={"step": 0, "task": "hello"})).json()
    assert sorted((s["thread"], s["kind"]) for s in view["segments_detail"])[0][1] == "main"
    assert {s["kind"] for s in view["segments_detail"]} == {"main", "side"}  # the title call is its own thread
    seg = next(s for s in view["segments_detail"] if s["kind"] == "main")
    stored = next(s for s in truth[trial].segments if s.thread_kind == "main")
    tokens = seg["tokens"]
    prompt, ids = unpack_i32(stored.prompt_ids).tolist(), unpack_i32(stored.response.ids).tolist()
    assert tokens["ids"] == prompt + ids and tokens["prompt_len"] == len(prompt)
    mask = list(stored.response.mask)
    assert tokens["kind"] == [2] * len(prompt) + mask
    sampled = [(i, lp) for i, lp, k in zip(tokens["ids"], tokens["logprobs"], tokens["kind"], strict=True) if k == 1]
    from_engine = [
        (i, lp)
        for g in engine
        if g["trial_id"] == trial and g["thread"] == seg["thread"]
        for i, lp in zip(g["sampled_ids"], g["logprobs"], strict=True)
    ]
    assert [i for i, _ in sampled] == [i for i, _ in from_engine]
    assert [lp for _, lp in sampled] == pytest.approx([lp for _, lp in from_engine], abs=1e-4)
    assert unpack_f32(stored.response.logprobs).tolist()  # the store holds them too
    assert seg["calls"] == 4 and len(tokens["turn_starts"]) == 3
    # the segment shows what the engine was asked to sample with, pinned by the run (the proxy's default)
    asked = {g["sampling"]["temperature"] for g in engine if g["trial_id"] == trial and g["thread"] == seg["thread"]}
    assert seg["sampling"]["mode"] == "pin" and asked == {seg["sampling"]["temperature"]}
    assert seg["sampling"]["min_p"] == 0 and seg["sampling"]["top_p"] == stored.sampling.top_p
    messages = seg["transcript"]
    assistant = [m for m in messages if m["role"] == "assistant"]
    assert [m["source"] for m in assistant] == ["sampled"] * 4
    assert [c["arguments"]["command"] for m in assistant for c in m["tool_calls"]] == ["ls -la", "cat README.md", "pwd"]
    assert [m["tool_results"][0] for m in messages if m["role"] == "tool"][1].strip() == "# repo"
    assert messages[1] == {**messages[1], "role": "user", "text": "Write hello to hello.txt.", "source": "prompt"}
    assert view["termination_reason"] == "completed" and view["reward"] == 0.0 and view["timings"]["agent_s"] > 0
    # one trace per trial: the trajectory links to its own trace
    trace_ids = {t.metadata["trace_id"] for t in truth.values()}
    assert len(trace_ids) == len(truth) and all(len(t) == 32 for t in trace_ids)
    assert view["trace_url"] == f"http://127.0.0.1:16686/trace/{truth[trial].metadata['trace_id']}"
    assert {r["trial_id"] for r in rows["trajectories"]} == {"s0-hello-0", "s0-hello-1", "s0-hello-2"}
    assert {r["trial_id"]: r["model_calls"] for r in rows["trajectories"]} == {  # + 1 title call each
        "s0-hello-0": 5,
        "s0-hello-1": 2,
        "s0-hello-2": 3,
    }


async def test_unknown_ids_are_404_pages_and_json(runs_root: Path) -> None:
    async with dashboard(runs_root) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        page = await c.get("/runs/no-such-run")
        assert page.status_code == 404 and "text/html" in page.headers["content-type"]
        assert "no-such-run" in page.text
        page = await c.get(f"/runs/{RUN_ID}/trajectories/no-such-trial")
        assert page.status_code == 404 and "no-such-trial" in page.text
        assert (await c.get(f"/runs/{RUN_ID}/trajectories/..%2F..%2Fetc")).status_code == 404
        api = await c.get("/api/runs/no-such-run/summary")
        assert api.status_code == 404 and "no-such-run" in api.json()["error"]
        api = await c.get(f"/api/runs/{RUN_ID}/trajectories/nope")
        assert api.status_code == 404
        assert (await c.get("/api/runs/bad%20id")).status_code == 400
        assert (await c.get("/api/compare", params={"runs": RUN_ID})).status_code == 400
        assert (await c.get(f"/runs/{RUN_ID}")).status_code == 200


async def test_a_broken_run_directory_says_what_is_missing(runs_root: Path) -> None:
    broken = runs_root / "broken"
    broken.mkdir()
    (broken / "run.json").write_text(json.dumps({"run_id": "broken", "status": "done", "group_size": 0}))
    (broken / "metrics.jsonl").write_text('{"step": 1, "values": {"reward/mean": 0.5}}\nnot json\n{"step": "x"}\n')
    half = runs_root / "half"
    half.mkdir()
    info = json.loads((runs_root / RUN_ID / "run.json").read_text()) | {"run_id": "half"}
    (half / "run.json").write_text(json.dumps(info))
    async with dashboard(runs_root) as d, httpx.AsyncClient(base_url=d.url, headers=AUTH) as c:
        problems = (await c.get("/api/runs/broken")).json()["problems"]
        assert any("run.json" in p and "group_size" in p for p in problems)
        assert any("config.toml is missing" in p for p in problems)
        summary = (await c.get("/api/runs/broken/summary")).json()
        assert any("metrics.jsonl line 2" in p for p in summary["problems"])
        assert any("metrics.jsonl line 3" in p for p in summary["problems"])
        assert [m["trainer_step"] for m in summary["metrics"]] == [1]
        half_problems = (await c.get("/api/runs/half/summary")).json()["problems"]
        assert any("capture store directory" in p and "missing" in p for p in half_problems)
        assert any("metrics.jsonl is missing" in p for p in half_problems)
        assert (await c.get("/runs/half")).status_code == 200  # the page renders and shows the problems


async def test_token_protects_pages_and_api(runs_root: Path) -> None:
    async with dashboard(runs_root) as d, httpx.AsyncClient(base_url=d.url) as c:
        assert (await c.get("/healthz")).status_code == 200
        denied = await c.get(f"/runs/{RUN_ID}")
        assert denied.status_code == 401 and "<form" in denied.text
        assert (await c.get("/api/runs")).status_code == 401
        assert (await c.get("/api/runs", headers={"Authorization": "Bearer wrong-token"})).status_code == 401
        assert (await c.get("/", params={"token": "wrong-token"})).status_code == 401
        ok = await c.get(f"/runs/{RUN_ID}", params={"token": TOKEN, "x": "1"})
        assert ok.status_code == 303 and ok.headers["location"] == f"/runs/{RUN_ID}?x=1"
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
        assert (await c.get("/api/runs")).status_code == 200  # the client kept the cookie
    async with dashboard(runs_root) as d, httpx.AsyncClient(base_url=d.url) as c:
        assert (await c.post("/login", data={"token": "nope", "next": "/"})).status_code == 401
        ok = await c.post("/login", data={"token": TOKEN, "next": "//evil.example/"})
        assert ok.status_code == 303 and ok.headers["location"] == "/"
        assert (await c.get("/api/runs")).status_code == 200


async def test_sse_sends_an_update_when_the_run_moves_on(runs_root: Path) -> None:
    info_path = runs_root / RUN_ID / "run.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps(info | {"status": "running"}))  # a live run (its metrics from the file)
    async with (
        dashboard(runs_root) as d,
        httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as c,
        c.stream("GET", f"/api/runs/{RUN_ID}/events") as events,
    ):
        assert events.headers["content-type"].startswith("text/event-stream")
        lines = events.aiter_lines()

        async def next_update() -> dict:
            async for line in lines:
                if line.startswith("data: "):
                    return json.loads(line[6:])
            raise AssertionError("stream ended")

        first = await asyncio.wait_for(next_update(), 20)
        assert first["last_step"] == 3 and first["finalized"] == 18
        with (runs_root / RUN_ID / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": 4, "wall_time": 0.0, "values": {"reward/mean": 0.9}}) + "\n")
        second = await asyncio.wait_for(next_update(), 20)
        assert second["last_step"] == 4 and second["live"]
        info_path.write_text(json.dumps(info | {"status": "done"}))
        last = await asyncio.wait_for(next_update(), 20)
        assert last["live"] is False and last["status"] == "done"
        rest = await asyncio.wait_for(_drain(lines), 20)
        assert rest == [], "a finished run's stream ends after its last update"


async def _drain(lines: Any) -> list[str]:
    return [line async for line in lines if line.startswith("data: ")]
