"""HTTP application factory of the proxy."""

from __future__ import annotations

from fastapi import FastAPI

from services.proxy.settings import Settings


def create_app(settings: Settings) -> FastAPI:
    app = FastAPI(title="harnessrl proxy")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
