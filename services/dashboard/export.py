"""``harnessrl dashboard export``: a self-contained static copy of one run.

The built UI plus the run's data as classic scripts (``data/run.js`` and one
``data/traj/tNNNN.js`` per trajectory): a browser opens ``index.html`` from
disk (file://), where fetch() and ES modules are refused, with no backend.
The copy is written into a temporary sibling folder and renamed into place, so
a failed export leaves nothing half-written.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.errors import AlreadyExists, ConfigError, HarnessError
from services.dashboard.assist import AnalysisStore
from services.dashboard.service import DashboardService

DATA_MARK = "<!-- harnessrl:data -->"


@dataclass(frozen=True)
class ExportResult:
    out: Path
    trajectories: int
    skipped: list[str]
    bytes: int


def _js(name: str, value: Any) -> str:
    return f"window.{name} = {json.dumps(value, separators=(',', ':'))};\n"


async def export_run(service: DashboardService, run_id: str, out: Path, *, force: bool = False) -> ExportResult:
    index = _check(service.settings.web_dir, out, force)
    run = service.open(run_id)
    overview = await service.overview(run_id)
    summary = await service.summary(run_id)
    rows = await service.trajectory_rows(run_id)
    views, skipped = [], []
    for row in rows:
        try:
            views.append(await service.trajectory(run_id, row["trial_id"]))
        except HarnessError as e:
            skipped.append(f"{row['trial_id']}: {e}")
    static = {
        "run_id": run_id,
        "exported_at": time.time(),
        "runs": [r for r in await service.list_runs() if r["run_id"] == run_id],
        "overview": {**overview, "live": False, "status": None},
        "summary": summary,
        "trajectories": rows,
        "analysis": AnalysisStore(run.path, service.settings.analysis.store_dir).load(),
        "skipped": skipped,
    }
    size = await asyncio.to_thread(_write, index, out, static, views)
    return ExportResult(out, len(views), skipped, size)


def _check(web: Path, out: Path, force: bool) -> Path:
    index = web / "index.html"
    if not index.exists() or DATA_MARK not in index.read_text():
        raise ConfigError(f"the web UI is not built in {web}: run scripts/build_web.sh first")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise AlreadyExists(f"{out} exists and is not empty (use --force to replace it)")
    return index


def _write(index: Path, out: Path, static: dict[str, Any], views: list[dict[str, Any]]) -> int:
    """Writes everything into a temporary sibling, then renames it to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        shutil.copytree(index.parent / "assets", tmp / "assets")
        (tmp / "data" / "traj").mkdir(parents=True)
        files = {}
        for i, view in enumerate(views):
            rel = f"data/traj/t{i:05d}.js"
            key = json.dumps(view["trial_id"])
            head = f"window.HARNESSRL_TRAJ = window.HARNESSRL_TRAJ || {{}};\nwindow.HARNESSRL_TRAJ[{key}] = "
            (tmp / rel).write_text(head + json.dumps(view, separators=(",", ":")) + ";\n")
            files[view["trial_id"]] = rel
        (tmp / "data" / "run.js").write_text(_js("HARNESSRL_STATIC", {**static, "trajectory_files": files}))
        html = index.read_text().replace(DATA_MARK, '<script src="data/run.js"></script>', 1)
        (tmp / "index.html").write_text(html)
        size = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return size


def _swap_into_place(tmp: Path, out: Path) -> None:
    os.chmod(tmp, 0o755)
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}-old-", dir=out.parent))
        os.replace(out, old / "x")
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
