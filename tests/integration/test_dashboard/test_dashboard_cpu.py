"""A real run's CPU breakdown on its dashboard page (headless Chromium): ``harnessrl run``
with the local engine (tests/run_support.py ``local_engine_run``), then the run page's
"CPU by component" panel shows each component's seconds of the step as metrics.jsonl
recorded them, their shares, the whole run's seconds from run.json, and one bar each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnessrl import cpu, paths
from tests.integration.test_dashboard.conftest import TOKEN, dashboard, needs_chromium, page_check
from tests.run_support import local_engine_run

pytestmark = [
    needs_chromium,
    pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared"),
]
LABELS = {  # web/src/views/cpu.js
    "engine": "engine (forward passes)",
    "trainer": "trainer (optimizer step)",
    "harness": "harness processes (agent phase)",
    "sandbox": "sandbox (setup, verifier, other children)",
    "services": "proxy, capture, other services (event loop)",
}


def seconds_text(v: float) -> str:
    """web/src/dom.js fmt(v, 1) + ' s' for the values a run records (3 decimals at most)."""
    if float(v).is_integer():
        return f"{int(v):,} s"
    text = f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{text or '0'} s"


@pytest.mark.timeout(900)
async def test_a_runs_page_shows_its_cpu_by_component(tmp_path: Path, web_dist: Path, artifacts: Path) -> None:
    proc, run_dir = local_engine_run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [step] = [json.loads(line)["values"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    async with dashboard(run_dir.parent) as d:
        cfg = {
            "url": d.url,
            "token": TOKEN,
            "runId": run_dir.name,
            "components": list(cpu.COMPONENTS),
            "stepText": {c: seconds_text(step[f"cpu/{c}_s"]) for c in cpu.COMPONENTS},
            "series": [f"{LABELS[c]}:1" for c in cpu.COMPONENTS],
            "artifacts": str(artifacts),
        }
        await page_check("cpu_run.mjs", cfg, tmp_path)
    assert (artifacts / "cpu_breakdown.png").stat().st_size > 5_000
