"""HTTP application factory of the dashboard."""

from __future__ import annotations

from fastapi import FastAPI

from services.dashboard.settings import Settings


def create_app(settings: Settings) -> FastAPI:
    app = FastAPI(title="harnessrl dashboard")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
