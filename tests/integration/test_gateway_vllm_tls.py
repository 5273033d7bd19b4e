"""The gateway's vLLM pool dials ``https`` replicas the way its TLS settings say
(issue 16): a real HTTPS server (uvicorn, a throwaway CA from tests/tls_support.py)
stands in for a vLLM replica's HTTP API, answering what the pool calls (/health,
/v1/models, streamed /v1/completions over token ids). The right CA works, with a
client certificate where the replica wants mTLS; a wrong CA or a missing client
certificate is a clear error naming the replica."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from harnessrl import tls
from harnessrl.errors import ConfigError
from services.gateway.engines.base import GenerateInput, Sampling
from services.gateway.engines.vllm_pool import VllmEngine
from services.gateway.errors import EngineUnavailable
from services.gateway.settings import Settings
from tests.asgi_support import serve
from tests.tls_support import Pki, make_pki

MODEL = "replica-model"
REPLY = [[11, 12], [13, 0]]


def replica_app(seen: list[dict[str, Any]]) -> FastAPI:
    """The endpoints of vLLM's OpenAI server that the pool calls, in vLLM's wire format."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"data": [{"id": MODEL, "max_model_len": 4096}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> StreamingResponse:
        seen.append(await request.json())

        async def events() -> AsyncIterator[str]:
            for i, ids in enumerate(REPLY):
                choice = {
                    "token_ids": ids,
                    "logprobs": {"token_logprobs": [-0.25] * len(ids)},
                    "finish_reason": "stop" if i == len(REPLY) - 1 else None,
                }
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@contextlib.asynccontextmanager
async def https_replica(pki: Pki, *, mtls: bool) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    async with serve(replica_app(seen), **tls.uvicorn_options(pki.server(mtls))) as url:
        yield url, seen


def engine(url: str, client: tls.TlsSettings | None, name: str = "vllm-tls") -> VllmEngine:
    table = {} if client is None else {"tls": client}
    return VllmEngine(Settings.model_validate({"engine": "vllm", "vllm_urls": [url], **table}), url, name)


async def generate(e: VllmEngine) -> list[int]:
    request = GenerateInput("r1", "t1", "main", np.asarray([1, 2, 3], np.int32), Sampling(), 16)
    return [int(i) for chunk in [c async for c in e.generate(request)] for i in chunk.ids]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def _process_tls(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("CA_FILE", "CERT_FILE", "KEY_FILE", "CLIENT_CA_FILE"):
        monkeypatch.delenv(f"HARNESSRL_TLS_{name}", raising=False)
    tls.reset()
    yield
    tls.reset()


@pytest.mark.parametrize("mtls", [False, True])
async def test_the_gateways_ca_verifies_an_https_replica(pki: Pki, mtls: bool) -> None:
    async with https_replica(pki, mtls=mtls) as (url, seen):
        e = engine(url, pki.client(cert=mtls))
        await e.start()
        try:
            assert e.info().model == MODEL and e.info().context_window == 4096
            assert await generate(e) == [11, 12, 13, 0]
            assert seen[0]["prompt"] == [1, 2, 3] and seen[0]["stream"] is True
        finally:
            await e.close()


async def test_the_process_table_is_used_when_the_gateways_says_nothing(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARNESSRL_TLS_CA_FILE", str(pki.ca))
    async with https_replica(pki, mtls=False) as (url, _):
        e = engine(url, None)
        await e.start()
        try:
            await e.check_health()
        finally:
            await e.close()


async def test_a_wrong_ca_is_a_clear_error_naming_the_replica(pki: Pki) -> None:
    async with https_replica(pki, mtls=False) as (url, _):
        e = engine(url, pki.client(cert=False, ca=pki.other_ca))
        await e.start()  # a replica may still be starting: logged, not raised
        try:
            with pytest.raises(EngineUnavailable, match=rf"{url} is not healthy.*does not verify against .*other"):
                await e.check_health()
            with pytest.raises(EngineUnavailable, match=rf"{url} unreachable.*CERTIFICATE_VERIFY_FAILED"):
                await generate(e)
        finally:
            await e.close()


async def test_system_cas_do_not_trust_a_private_ca(pki: Pki) -> None:
    """No CA anywhere: httpx's default verification, never an unverified https."""
    async with https_replica(pki, mtls=False) as (url, _):
        e = engine(url, None)
        await e.start()
        try:
            with pytest.raises(EngineUnavailable, match=rf"{url}.*CERTIFICATE_VERIFY_FAILED"):
                await e.check_health()
        finally:
            await e.close()


async def test_a_missing_client_certificate_is_a_clear_error_naming_the_replica(pki: Pki) -> None:
    async with https_replica(pki, mtls=True) as (url, _):
        e = engine(url, pki.client(cert=False))
        await e.start()
        try:
            with pytest.raises(EngineUnavailable, match=rf"vLLM server {url} is not healthy.*presents none"):
                await e.check_health()
        finally:
            await e.close()


async def test_a_ca_file_that_is_no_certificate_fails_at_start_naming_the_replica(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    e = engine("https://127.0.0.1:9", tls.TlsSettings(ca_file=bad), name="vllm-bad")
    with pytest.raises(ConfigError, match=r"vLLM replica vllm-bad: cannot load the TLS files \(ca_file .*ca.pem"):
        await e.start()
