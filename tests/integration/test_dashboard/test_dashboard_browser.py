"""The dashboard in headless Chromium over a recorded run: login, every panel
with its data, live updates, assisted analysis, a trajectory (transcript and
tokens), compare, 404 pages, and the static export opened from disk.

The checks run in web/test/browser.mjs (playwright-core); this test serves the
run, exports it, computes what the pages must show from the capture store, and
keeps the screenshots under test-artifacts/dashboard/.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harnessrl.arrays import unpack_i32
from harnessrl.paths import PROJECT_ROOT, default_model_dir
from services.dashboard.export import export_run
from services.dashboard.service import DashboardService
from stack.dashboard import EmbeddedCaptureOpener
from tests.integration.test_dashboard.conftest import TOKEN, dashboard, dashboard_settings, serve
from tests.integration.test_dashboard.recorder import RUN_ID
from tests.integration.test_dashboard.test_dashboard_api import store_trajectories
from tests.integration.test_dashboard.test_dashboard_live import ANSWER, openai_compatible

CHROMIUM = Path("/usr/bin/chromium")
WEB = PROJECT_ROOT / "web"

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian chromium (apt-get install -y chromium; scripts/setup installs it)"
)
EXPLORE_TRIAL = "s0-hello-0"


def second_run(root: Path) -> str:
    """A run to compare with: rec-1's metrics, rewards halved, no capture store."""
    other = root / "rec-1b"
    other.mkdir()
    info = json.loads((root / RUN_ID / "run.json").read_text()) | {"run_id": "rec-1b", "capture": None}
    (other / "run.json").write_text(json.dumps(info))
    lines = []
    for line in (root / RUN_ID / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rec["values"]["reward/mean"] *= 0.5
        lines.append(json.dumps(rec) + "\n")
    (other / "metrics.jsonl").write_text("".join(lines))
    return "rec-1b"


async def test_dashboard_in_a_browser(runs_root: Path, tmp_path: Path, web_dist: Path, artifacts: Path) -> None:
    compare_run = second_run(runs_root)
    truth = {t.trial_id: t for t in await store_trajectories(runs_root, include_tokens=True)}
    segments = truth[EXPLORE_TRIAL].segments
    tokens = sum(len(unpack_i32(s.prompt_ids)) + len(unpack_i32(s.response.ids)) for s in segments)
    exported = tmp_path / "export"
    service = DashboardService(dashboard_settings(runs_root), EmbeddedCaptureOpener())
    try:
        await export_run(service, RUN_ID, exported)
    finally:
        await service.close()
    seen: list[dict[str, Any]] = []
    async with serve(openai_compatible(ANSWER, seen)) as llm:
        async with dashboard(runs_root, analysis={"endpoint": f"{llm}/v1", "api_key": "sk-browser"}) as d:
            cfg = {
                "url": d.url,
                "token": TOKEN,
                "runId": RUN_ID,
                "compareRun": compare_run,
                "model": default_model_dir().name,
                "trial": EXPLORE_TRIAL,
                "commands": ["ls -la", "cat README.md", "pwd"],
                "tokens": tokens,
                "segments": len(segments),
                "exportDir": str(exported),
                "metricsFile": str(runs_root / RUN_ID / "metrics.jsonl"),
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
    for name in ["login", "runs", "run", "trajectory-transcript", "trajectory-tokens", "compare", "export-run"]:
        assert (artifacts / f"{name}.png").stat().st_size > 10_000, name
