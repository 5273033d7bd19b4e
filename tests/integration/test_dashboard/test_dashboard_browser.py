"""The dashboard in headless Chromium over a recorded run beside a single trial and an
evaluation: login, the runs list's order, every panel with its data on one step axis,
no live badge or event stream for a finished run and live updates for a running one,
assisted analysis, a trial's and a trajectory's decoded transcript and tokens, the trace
link only where a trace UI is configured, compare, 404 pages, the static export opened
from disk; and a finished run's page settles under ``--virtual-time-budget``.

The checks run in web/test/browser.mjs (playwright-core); this test serves the
run, exports it, computes what the pages must show from the capture store, and
keeps the screenshots in ``artifacts`` ($HARNESSRL_TEST_SCREENSHOTS, else tmp_path).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Any

from harnessrl.arrays import unpack_i32
from harnessrl.paths import PROJECT_ROOT, default_model_dir
from services.dashboard.export import export_run
from services.dashboard.service import DashboardService
from stack.dashboard import EmbeddedCaptureOpener
from tests.integration.test_dashboard.conftest import (
    CHROMIUM,
    TOKEN,
    dashboard,
    dashboard_settings,
    needs_chromium,
    serve,
)
from tests.integration.test_dashboard.recorder import EVAL_ONLY_ID, RUN_ID, Extras
from tests.integration.test_dashboard.test_dashboard_api import store_trajectories
from tests.integration.test_dashboard.test_dashboard_live import ANSWER, openai_compatible

WEB = PROJECT_ROOT / "web"

pytestmark = needs_chromium
EXPLORE_TRIAL = "s0-hello-0"


def second_run(root: Path) -> str:
    """A run to compare with: rec-1's metrics, rewards halved, no capture store; its
    trainer step 2 trained a batch of stale rollouts only (no agreement, as the trainer
    then records it)."""
    other = root / "rec-1b"
    other.mkdir()
    info = json.loads((root / RUN_ID / "run.json").read_text()) | {"run_id": "rec-1b", "capture": None}
    (other / "run.json").write_text(json.dumps(info))
    lines = []
    for line in (root / RUN_ID / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rec["values"]["reward/mean"] *= 0.5
        if rec["step"] == 2:
            rec["values"] = {k: v for k, v in rec["values"].items() if not k.startswith("agreement/")}
            rec["values"] |= {"agreement/tokens": 0.0, "staleness/mean": 1.0}
        lines.append(json.dumps(rec) + "\n")
    (other / "metrics.jsonl").write_text("".join(lines))
    return "rec-1b"


STEP_AXIS = "rollout step (policy after N updates)"  # web/src/charts.js
JAEGER = "http://127.0.0.1:16686/trace/{trace_id}"


async def test_dashboard_in_a_browser(
    mixed_root: Path, extras: Extras, tmp_path: Path, web_dist: Path, artifacts: Path
) -> None:
    runs_root = mixed_root
    compare_run = second_run(runs_root)
    evals = [json.loads(line) for line in (extras.eval_dir / "eval.jsonl").read_text().splitlines()]
    eval_pass = next(r["pass@1"] for r in evals if r["task_id"] == "*")
    truth = {t.trial_id: t for t in await store_trajectories(runs_root, include_tokens=True)}
    segments = truth[EXPLORE_TRIAL].segments
    tokens = sum(len(unpack_i32(s.prompt_ids)) + len(unpack_i32(s.response.ids)) for s in segments)
    integrity = integrity_truth(list(truth.values()))
    # the recorded greet solver plants a conftest.py and a gc module (recorder.py): real counts
    assert any(integrity["tamper"]) and any(integrity["suspicious"]), integrity
    exported = tmp_path / "export"
    service = DashboardService(dashboard_settings(runs_root), EmbeddedCaptureOpener())
    try:
        await export_run(service, RUN_ID, exported)
    finally:
        await service.close()
    seen: list[dict[str, Any]] = []
    async with serve(openai_compatible(ANSWER, seen)) as llm:
        analysis = {"endpoint": f"{llm}/v1", "api_key": "sk-browser"}
        async with dashboard(runs_root, analysis=analysis, trace_url=JAEGER) as d:
            cfg = {
                "url": d.url,
                "token": TOKEN,
                "runId": RUN_ID,
                "compareRun": compare_run,
                "runsOrder": [RUN_ID, compare_run, EVAL_ONLY_ID, extras.trial_dir.name],
                "trialRun": extras.trial_dir.name,
                "evalRun": EVAL_ONLY_ID,
                "evalPass": f"{eval_pass:.3f}".rstrip("0").rstrip(".") or "0",
                "stepAxis": STEP_AXIS,
                # the served dashboard has a trace UI configured, the export was made without one
                "traceLink": {"trajectory": True, "export-trajectory": False},
                "runInfoFile": str(runs_root / RUN_ID / "run.json"),
                "model": default_model_dir().name,
                "trial": EXPLORE_TRIAL,
                "commands": ["ls -la", "cat README.md", "pwd"],
                "tokens": tokens,
                "segments": len(segments),
                # what each segment's sampling line says (mode:temperature), as the capture recorded it
                "sampling": sorted(f"{s.sampling.mode}:{round(s.sampling.temperature, 6):g}" for s in segments),
                "exportDir": str(exported),
                "metricsFile": str(runs_root / RUN_ID / "metrics.jsonl"),
                "integrity": integrity,
                "artifacts": str(artifacts),
                "chromium": str(CHROMIUM),
            }
            (tmp_path / "browser.json").write_text(json.dumps(cfg))
            node = shutil.which("node")
            assert node, "node is needed for the browser test (Debian nodejs)"
            proc = await asyncio.create_subprocess_exec(
                node,
                str(WEB / "test" / "browser.mjs"),
                str(tmp_path / "browser.json"),
                cwd=WEB,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 300)
    report = out.decode()
    print(report)
    assert proc.returncode == 0, report
    assert "0 failed" in report
    assert seen and seen[0]["auth"] == "Bearer sk-browser"
    shots = ["login", "runs", "trial", "run", "integrity-panel", "trajectory-transcript", "trajectory-tokens"]
    shots += ["compare", "export-run"]
    for name in shots:
        assert (artifacts / f"{name}.png").stat().st_size > 10_000, name


def integrity_truth(trajectories: list[Any]) -> dict[str, Any]:
    """Per step (ascending) what the integrity panel must chart, from the capture store: the
    sandbox's tamper and suspicious event counts (each trajectory's metadata) and the trials
    with either."""
    per: dict[int, list[int]] = {}
    for t in trajectories:
        counts = [int(t.metadata.get("tamper_events", "0")), int(t.metadata.get("suspicious_events", "0"))]
        row = per.setdefault(t.step, [0, 0, 0])
        row[0], row[1], row[2] = row[0] + counts[0], row[1] + counts[1], row[2] + int(any(counts))
    steps = sorted(per)
    return {
        "steps": steps,
        "tamper": [per[s][0] for s in steps],
        "suspicious": [per[s][1] for s in steps],
        "flagged": [per[s][2] for s in steps],
        "trials": len(trajectories),
    }


async def test_a_finished_runs_page_settles_under_a_virtual_time_budget(
    mixed_root: Path, tmp_path: Path, web_dist: Path
) -> None:
    """Headless Chromium's ``--virtual-time-budget`` waits for the network to go quiet: a
    page that keeps a stream open (or polls) for a finished run never returns."""
    async with dashboard(mixed_root) as d:
        proc = await asyncio.create_subprocess_exec(
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=20000",
            "--dump-dom",
            f"{d.url}/runs/{RUN_ID}?token={TOKEN}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 240)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError("chromium --virtual-time-budget never returned (network never quiet)") from None
    dom = out.decode()
    assert proc.returncode == 0
    assert 'data-panel="trajectories"' in dom and "data-step-convention" in dom, dom[-2000:]
    assert re.search(r'<span id="live"[^>]*hidden', dom), "a finished run shows no live badge"
