"""HTTP application factory of the dashboard: thin routes over DashboardService.

Pages (``/``, ``/runs/<id>``, ``/runs/<id>/trajectories/<trial>``, ``/compare``)
serve the built web UI after checking that what they name exists (else a 404
page); ``/trials/<trial>`` redirects to the trial's page in whichever run holds
it (``/api/trials/<trial>`` says which); ``/api/...`` serves JSON; ``/api/runs/<id>/events`` streams SSE.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles

from harnessrl import metrics
from harnessrl.errors import HarnessError, InvalidArgument
from services.dashboard import pages
from services.dashboard.assist import AnalysisStore, Analyst, anomaly_summary
from services.dashboard.auth import TokenAuth
from services.dashboard.service import DashboardService
from services.dashboard.settings import Settings
from services.dashboard.sources import CaptureOpener

SSE_KEEPALIVE_S = 15.0
FINISHED_RETRY_MS = 60_000


def create_app(settings: Settings, opener: CaptureOpener | None = None) -> FastAPI:
    service = DashboardService(settings, opener)
    analyst = Analyst(settings.analysis)
    auth = TokenAuth(settings.auth_token.get_secret_value() if settings.auth_token else None)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await service.close()

    app = FastAPI(title="harnessrl dashboard", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    app.middleware("http")(auth.middleware)
    metrics.instrument_app(app, "dashboard")

    @app.exception_handler(HarnessError)
    async def harness_error(request: Request, exc: HarnessError) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": str(exc)}, status_code=exc.http_status)
        if exc.http_status == 404:
            return pages.not_found(str(exc))
        return pages.error(exc.http_status, str(exc))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/login", response_model=None)
    async def login(request: Request) -> Response:
        # A urlencoded form, parsed here (FastAPI's Form() would need python-multipart).
        form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
        token, next = form.get("token", [""])[0], form.get("next", ["/"])[0]
        if not auth.check_token(token):
            return pages.login(next, "wrong token", status=401)
        target = next if next.startswith("/") and not next.startswith("//") else "/"
        return auth.set_cookie(RedirectResponse(target, status_code=303))

    # -- pages ------------------------------------------------------------------
    def spa() -> HTMLResponse:
        index = settings.web_dir / "index.html"
        if not index.exists():
            return pages.not_built(str(settings.web_dir))
        # Built with relative asset paths (so the static export opens from disk); the base makes them
        # resolve from the server's root whatever the page's path.
        return HTMLResponse(index.read_text().replace("<head>", '<head><base href="/">', 1))

    @app.get("/", response_class=HTMLResponse)
    async def runs_page() -> HTMLResponse:
        return spa()

    @app.get("/compare", response_class=HTMLResponse)
    async def compare_page() -> HTMLResponse:
        return spa()

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    async def run_page(run_id: str) -> HTMLResponse:
        service.open(run_id)
        return spa()

    @app.get("/trials/{trial_id}")
    async def trial_page(trial_id: str) -> RedirectResponse:
        run_id = await service.find_trial(trial_id)
        return RedirectResponse(f"/runs/{run_id}/trajectories/{trial_id}", status_code=307)

    @app.get("/runs/{run_id}/trajectories/{trial_id}", response_class=HTMLResponse)
    async def trajectory_page(run_id: str, trial_id: str) -> HTMLResponse:
        await service.trajectory_exists(run_id, trial_id)
        return spa()

    # -- API --------------------------------------------------------------------
    @app.get("/api/runs")
    async def api_runs() -> dict[str, Any]:
        return {"runs": await service.list_runs(), "root": str(settings.root())}

    @app.get("/api/runs/{run_id}")
    async def api_run(run_id: str) -> dict[str, Any]:
        return await service.overview(run_id)

    @app.get("/api/runs/{run_id}/summary")
    async def api_summary(run_id: str) -> dict[str, Any]:
        return await service.summary(run_id)

    @app.get("/api/runs/{run_id}/trajectories")
    async def api_trajectories(
        run_id: str, step: int | None = None, task: str | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        return {"trajectories": await service.trajectory_rows(run_id, step, task, reason)}

    @app.get("/api/trials/{trial_id}")
    async def api_trial(trial_id: str) -> dict[str, str]:
        run_id = await service.find_trial(trial_id)
        return {"run_id": run_id, "trial_id": trial_id, "page": f"/runs/{run_id}/trajectories/{trial_id}"}

    @app.get("/api/runs/{run_id}/trajectories/{trial_id}")
    async def api_trajectory(run_id: str, trial_id: str) -> dict[str, Any]:
        return await service.trajectory(run_id, trial_id)

    @app.get("/api/compare")
    async def api_compare(runs: str = "") -> dict[str, Any]:
        return await service.compare([r for r in runs.split(",") if r])

    @app.get("/api/runs/{run_id}/events")
    async def api_events(run_id: str, request: Request) -> StreamingResponse:
        service.open(run_id)
        return StreamingResponse(
            _events(service, run_id, request, settings.poll_s),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @app.get("/api/runs/{run_id}/analysis")
    async def api_analysis(run_id: str) -> dict[str, Any]:
        run = service.open(run_id)
        return {"enabled": analyst.enabled, "candidates": AnalysisStore(run.path, settings.analysis.store_dir).load()}

    @app.post("/api/runs/{run_id}/analysis")
    async def api_analyse(run_id: str) -> dict[str, Any]:
        run = service.open(run_id)
        anomalies = anomaly_summary(run_id, await service.summary(run_id))
        found = await analyst.candidates(anomalies)
        return {"candidates": AnalysisStore(run.path, settings.analysis.store_dir).add(found), "summary": anomalies}

    @app.post("/api/runs/{run_id}/analysis/{candidate_id}")
    async def api_verdict(run_id: str, candidate_id: str, request: Request) -> dict[str, Any]:
        run = service.open(run_id)
        try:
            body = await request.json()
        except json.JSONDecodeError as e:
            raise InvalidArgument(f"body must be JSON {{'verdict': ...}}: {e}") from e
        verdict = body.get("verdict") if isinstance(body, dict) else None
        return AnalysisStore(run.path, settings.analysis.store_dir).decide(candidate_id, str(verdict))

    if (settings.web_dir / "assets").is_dir():
        app.mount("/assets", StaticFiles(directory=settings.web_dir / "assets"), name="assets")
    return app


async def _events(service: DashboardService, run_id: str, request: Request, poll_s: float) -> AsyncIterator[str]:
    """``update`` whenever the run's fingerprint changes (first one at once); comments keep it open.

    A run that is not live (done, failed, stopped) gets its last update and the stream
    ends: nothing polls a finished run (the page closes its EventSource on that update;
    ``retry`` slows down any other client that reconnects)."""
    last: dict[str, Any] | None = None
    quiet = 0.0
    while not await request.is_disconnected():
        try:
            current = await service.fingerprint(run_id)
        except HarnessError as e:
            current = {"error": str(e)}
        changed = current != last
        if changed:
            last, quiet = current, 0.0
            yield f"event: update\ndata: {json.dumps(current)}\n\n"
        if current.get("live") is False:
            yield f"retry: {FINISHED_RETRY_MS}\n\n"
            return
        if not changed and quiet >= SSE_KEEPALIVE_S:
            quiet = 0.0
            yield ": keepalive\n\n"
        await asyncio.sleep(poll_s)
        quiet += poll_s
