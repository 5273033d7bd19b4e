"""Fixtures of the dashboard tests: a recorded run (real trials, see recorder.py),
the built web UI, and the dashboard served by uvicorn on a free 127.0.0.1 port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from harnessrl.paths import PROJECT_ROOT, default_model_dir
from tests.asgi_support import serve
from tests.integration.test_dashboard.recorder import RUN_ID, Extras, Recorded, record, record_extras

TOKEN = "dashboard-test-token"

needs_stack = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(not (default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"),
]


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """One recorded run per test session (18 real trials, ~10 s)."""
    if shutil.which("bwrap") is None or not (default_model_dir() / "tokenizer.json").exists():
        pytest.skip("needs bubblewrap and the default model (scripts/setup)")
    root = tmp_path_factory.mktemp("runs")
    return asyncio.run(record(root))


@pytest.fixture
def runs_root(recorded: Recorded, tmp_path: Path) -> Path:
    """A private copy of the recorded runs root (tests may break or extend it)."""
    root = tmp_path / "runs"
    shutil.copytree(recorded.run_dir, root / RUN_ID)
    return root


@pytest.fixture(scope="session")
def extras(recorded: Recorded, tmp_path_factory: pytest.TempPathFactory) -> Extras:
    """A single trial's run directory (the real ``harnessrl trial run``) and an evaluation-only one."""
    return asyncio.run(record_extras(tmp_path_factory.mktemp("extras"), recorded))


@pytest.fixture
def mixed_root(runs_root: Path, extras: Extras) -> Path:
    """The recorded run among the other kinds of directory: a single trial and an evaluation."""
    for made in (extras.trial_dir, extras.eval_dir):
        shutil.copytree(made, runs_root / made.name)
    return runs_root


@pytest.fixture(scope="session")
def web_dist() -> Path:
    """The built UI; built here (scripts/build_web.sh) when setup has not built it yet."""
    dist = PROJECT_ROOT / "web" / "dist"
    if not (dist / "index.html").exists():
        subprocess.run(["bash", str(PROJECT_ROOT / "scripts" / "build_web.sh")], check=True, timeout=600)
    return dist


CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian chromium (apt-get install -y chromium; scripts/setup installs it)"
)


async def page_check(script: str, cfg: dict[str, Any], tmp_path: Path, timeout_s: float = 120) -> str:
    """Runs web/test/SCRIPT (a web/test/page.mjs check) with ``cfg`` (plus the Chromium
    to use) and fails the test with its report unless every check passed."""
    node = shutil.which("node")
    assert node, "node is needed for the browser tests (Debian nodejs)"
    config = tmp_path / f"{Path(script).stem}.json"
    config.write_text(json.dumps({"chromium": str(CHROMIUM), **cfg}))
    proc = await asyncio.create_subprocess_exec(
        node,
        str(PROJECT_ROOT / "web" / "test" / script),
        str(config),
        cwd=PROJECT_ROOT / "web",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    report = out.decode()
    assert proc.returncode == 0 and "0 failed" in report, report
    return report


@dataclass
class Served:
    url: str
    app: FastAPI


def dashboard_settings(root: Path, **extra: Any) -> Any:
    from services.dashboard.settings import Settings

    return Settings.model_validate({"runs_dir": root, "auth_token": TOKEN, "poll_s": 0.2, **extra})


@contextlib.asynccontextmanager
async def dashboard(root: Path, **extra: Any) -> AsyncIterator[Served]:
    from services.dashboard.app import create_app
    from stack.dashboard import EmbeddedCaptureOpener

    app = create_app(dashboard_settings(root, **extra), EmbeddedCaptureOpener())
    async with serve(app) as url:
        yield Served(url, app)


@pytest.fixture
def artifacts(tmp_path: Path) -> Iterator[Path]:
    """Where browser tests keep their screenshots: $HARNESSRL_TEST_SCREENSHOTS (kept after
    the session, e.g. for a review), else the test's tmp_path."""
    env = os.environ.get("HARNESSRL_TEST_SCREENSHOTS")
    out = Path(env) if env else tmp_path / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    yield out
