"""Transport security between the services, with a throwaway CA (tests/tls_support.py):
real gRPC servers (capture store, gateway) and the real proxy over TLS and mTLS,
reached by the project's own clients (``rpc.connect``/``check_health``, the
sandbox's ``ProxyAdmin``, ``CaptureFinalizer`` and its relay, the proxy's engine
and capture clients); a wrong CA, an expired certificate and a missing client
certificate each fail naming the peer; a plaintext bind off loopback warns."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from harnessrl import tls
from harnessrl.config import load_section
from harnessrl.errors import ConfigError, Unavailable
from harnessrl.rpc import check_health
from services.capture_store.server import create_server as create_capture
from services.capture_store.settings import Settings as CaptureSettings
from services.sandbox.common.relay import UnixRelay
from services.sandbox.trial.endpoints import CaptureFinalizer, ProxyAdmin
from tests.tls_support import Pki, make_pki

TOKEN = "tls-service-token"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def _process_tls() -> Iterator[None]:
    """Each test decides its process's client TLS; none leaks into the next."""
    tls.reset()
    yield
    tls.reset()


async def _store(tmp: Path, server_tls: tls.TlsSettings) -> Any:
    settings = CaptureSettings.model_validate(
        {"store_dir": tmp / "capture", "fsync": False, "auth_token": TOKEN, "tls": server_tls}
    )
    return await create_capture(settings)


async def test_a_grpc_server_over_tls_and_mtls_answers_the_real_clients(tmp_path: Path, pki: Pki) -> None:
    for mtls in (False, True):
        store = await _store(tmp_path / str(mtls), pki.server(mtls=mtls))
        target = f"127.0.0.1:{store.port}"
        try:
            assert await check_health(target, tls_settings=pki.client(cert=mtls)) == "SERVING"
            finalizer = CaptureFinalizer(target, TOKEN, tls_settings=pki.client(cert=mtls))
            try:  # a real RPC through the project's client: NOT_FOUND maps to None
                assert await finalizer.finalized_outcome("run", "trial") is None
            finally:
                await finalizer.aclose()
            tls.use(pki.client(cert=mtls))  # the process's table is what connect() uses by default
            assert await check_health(target) == "SERVING"
            tls.reset()
        finally:
            await store.stop(0)


async def _rpc_error(target: str, client: tls.TlsSettings) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await check_health(target, wait_s=0, tls_settings=client)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    return str(info.value.details())


async def test_grpc_tls_failures_name_the_peer(tmp_path: Path, pki: Pki) -> None:
    good = await _store(tmp_path / "good", pki.server(mtls=True))
    expired = await _store(tmp_path / "expired", pki.server(expired=True))
    try:
        target, old = f"127.0.0.1:{good.port}", f"127.0.0.1:{expired.port}"
        wrong_ca = await _rpc_error(target, pki.client(ca=pki.other_ca))
        assert wrong_ca.startswith(f"TLS to {target}: the server's certificate does not verify against"), wrong_ca
        assert "CERTIFICATE_VERIFY_FAILED" in wrong_ca, wrong_ca
        out_of_date = await _rpc_error(old, pki.client())
        assert out_of_date.startswith(f"TLS to {old}: the server's certificate"), out_of_date
        assert "certificate has expired" in out_of_date, out_of_date
        no_client_cert = await _rpc_error(target, pki.client(cert=False))
        assert no_client_cert.startswith(f"TLS to {target}: "), no_client_cert
        assert "requires a client certificate (mTLS) and this client presents none" in no_client_cert
        plaintext = await _rpc_error(target, tls.TlsSettings())
        assert target in plaintext, plaintext
    finally:
        await good.stop(0)
        await expired.stop(0)


# -- the proxy (HTTP) and the clients the sandbox has of it ------------------------------------
@contextlib.asynccontextmanager
async def _proxy_stack(tmp: Path, pki: Pki, proxy_tls: tls.TlsSettings) -> AsyncIterator[Any]:
    from services.gateway.server import create_server as create_gateway
    from services.gateway.settings import Settings as GatewaySettings
    from services.proxy.server import start as start_proxy
    from services.proxy.settings import Settings as ProxySettings
    from tests.sandbox_support import write_script

    script = write_script(tmp, {"context_window": 200_000, "threads": {"*": [{"content": "over tls"}]}})
    store = await _store(tmp, pki.server(mtls=True))
    gateway = await create_gateway(
        GatewaySettings.model_validate({"engine": f"scripted:{script}", "tls": pki.server(mtls=True)})
    )
    # The proxy's engine and capture clients dial as the process's table says (its CLI's use()).
    tls.use(pki.client())
    proxy = await start_proxy(
        ProxySettings.model_validate(
            {
                "gateway_target": f"127.0.0.1:{gateway.port}",
                "capture_target": f"127.0.0.1:{store.port}",
                "capture_token": TOKEN,
                "admin_token": "admin-secret",
                "tls": proxy_tls,
            }
        )
    )
    try:
        yield proxy
    finally:
        await proxy.stop()
        await gateway.stop(0)
        await store.stop(0)


async def test_the_proxy_over_mtls_serves_a_trial_through_the_sandbox_relay(tmp_path: Path, pki: Pki) -> None:
    from services.sandbox.trial.lifecycle import TrialSpec

    async with _proxy_stack(tmp_path, pki, pki.server(mtls=True)) as proxy:
        assert proxy.url.startswith("https://127.0.0.1:")
        admin = ProxyAdmin(proxy.url, "admin-secret", tls_settings=pki.client())
        spec = TrialSpec.model_validate(
            {"trial_id": "tls-trial", "run_id": "tls-run", "task_path": str(tmp_path), "harness": "shell"}
        )
        try:
            trial = await admin.register(spec, "task")
            host, port, secure = admin.address
            assert secure and (host, port) == ("127.0.0.1", proxy.port)
            # The harness's way out: plain HTTP to the relay, TLS (client certificate too) to the proxy.
            relay = UnixRelay(tmp_path / "relay.sock", tcp=(host, port), tcp_tls=tls.client_context(pki.client()))
            await relay.start()
            try:
                transport = httpx.AsyncHTTPTransport(uds=str(tmp_path / "relay.sock"))
                async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as harness:
                    answer = await harness.post(
                        f"{trial.base_path}/chat/completions",
                        headers={"Authorization": f"Bearer {trial.token}"},
                        json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
                        timeout=60,
                    )
            finally:
                await relay.stop()
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"] == "over tls"
            summary = await admin.close(trial.trial_id)  # segments durable in the store, over mTLS
            assert summary.num_turns == 1 and summary.num_segments == 1, summary
        finally:
            await admin.aclose()


async def test_https_failures_name_the_proxy(tmp_path: Path, pki: Pki) -> None:
    from services.proxy.server import start as start_proxy
    from services.proxy.settings import Settings as ProxySettings

    base = {"gateway_target": "127.0.0.1:1", "capture_target": "127.0.0.1:1", "admin_token": "admin-secret"}
    good = await start_proxy(ProxySettings.model_validate({**base, "tls": pki.server(mtls=True)}))
    old = await start_proxy(ProxySettings.model_validate({**base, "tls": pki.server(expired=True)}))
    cases = [
        (good.url, pki.client(ca=pki.other_ca), "TLS: the server's certificate does not verify against"),
        (old.url, pki.client(), "certificate has expired"),
        (
            good.url,
            pki.client(cert=False),
            "TLS: the server closed the connection after the TLS handshake: it "
            "requires a client certificate (mTLS) and this client presents none",
        ),
    ]
    try:
        for url, client, why in cases:
            admin = ProxyAdmin(url, "admin-secret", tls_settings=client)
            try:
                with pytest.raises(Unavailable) as info:
                    await admin.close("nothing")
            finally:
                await admin.aclose()
            assert f"proxy at {url} unreachable" in str(info.value) and why in str(info.value), info.value
    finally:
        await good.stop()
        await old.stop()


def test_an_https_proxy_url_without_a_ca_is_refused_for_the_relay(tmp_path: Path) -> None:
    admin = ProxyAdmin("https://127.0.0.1:9", None, tls_settings=tls.TlsSettings())
    assert admin.address == ("127.0.0.1", 9, True) and tls.client_context(admin.tls) is None
    asyncio.run(admin.aclose())


# -- settings and the plaintext warning ------------------------------------------------------
def test_tls_settings_come_from_the_environment_and_bad_ones_name_the_field(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.trainer.settings import Settings as TrainerSettings

    monkeypatch.setenv("HARNESSRL_TRAINER_TLS__CERT_FILE", str(pki.server_cert))
    monkeypatch.setenv("HARNESSRL_TRAINER_TLS__KEY_FILE", str(pki.server_key))
    monkeypatch.setenv("HARNESSRL_TRAINER_TLS__CLIENT_CA_FILE", str(pki.ca))
    settings = load_section(TrainerSettings, None, "trainer")
    assert settings.tls.serves_tls and settings.tls.client_ca_file == pki.ca

    monkeypatch.delenv("HARNESSRL_TRAINER_TLS__KEY_FILE")
    with pytest.raises(ConfigError, match=r"\[trainer\].*tls.*cert_file and key_file go together"):
        load_section(TrainerSettings, None, "trainer")
    monkeypatch.setenv("HARNESSRL_TRAINER_TLS__KEY_FILE", str(pki.dir / "missing.key"))
    with pytest.raises(ConfigError, match=r"key_file: .*missing.key is not a readable file"):
        load_section(TrainerSettings, None, "trainer")
    monkeypatch.delenv("HARNESSRL_TRAINER_TLS__CERT_FILE")
    monkeypatch.delenv("HARNESSRL_TRAINER_TLS__KEY_FILE")
    with pytest.raises(ConfigError, match=r"client_ca_file \(mTLS\) needs cert_file"):
        load_section(TrainerSettings, None, "trainer")
    monkeypatch.delenv("HARNESSRL_TRAINER_TLS__CLIENT_CA_FILE")
    monkeypatch.setenv("HARNESSRL_TRAINER_TLS__CA_FLE", str(pki.ca))
    with pytest.raises(ConfigError, match=r"unknown setting"):
        load_section(TrainerSettings, None, "trainer")


def test_a_process_that_is_no_service_dials_as_harnessrl_tls_says(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not tls.client().dials_tls
    tls.reset()
    monkeypatch.setenv("HARNESSRL_TLS_CA_FILE", str(pki.ca))
    assert tls.client().ca_file == pki.ca
    tls.use(tls.TlsSettings())  # a service table that names no CA leaves the environment's
    assert tls.client().ca_file == pki.ca
    tls.reset()
    monkeypatch.setenv("HARNESSRL_TLS_CA_FILE", str(pki.dir / "nope.pem"))
    with pytest.raises(ValueError, match=r"ca_file: .*nope.pem is not a readable file"):
        tls.client()


def test_plaintext_off_loopback_warns(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="harnessrl.tls")
    assert not tls.warn_if_plaintext("gateway", "127.0.0.1", tls.TlsSettings())
    assert not tls.warn_if_plaintext("gateway", "::1", tls.TlsSettings())
    assert not tls.warn_if_plaintext("gateway", "0.0.0.0", pki.server())
    assert caplog.records == []
    assert tls.warn_if_plaintext("gateway", "0.0.0.0", tls.TlsSettings())
    (record,) = caplog.records
    assert "gateway serves plaintext on 0.0.0.0, not a loopback address" in record.getMessage()
    assert "HARNESSRL_GATEWAY_TLS__CERT_FILE" in record.getMessage()


async def test_a_loopback_server_stays_plaintext_and_quiet(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="harnessrl.tls")
    store = await _store(tmp_path, tls.TlsSettings())
    try:
        assert await check_health(f"127.0.0.1:{store.port}") == "SERVING"
    finally:
        await store.stop(0)
    assert caplog.records == []


async def test_spans_reach_an_otlp_collector_over_tls(tmp_path: Path, pki: Pki) -> None:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    from harnessrl import telemetry
    from harnessrl.localservers import free_port
    from tests.compose.otlp_receiver import Receiver

    out = tmp_path / "spans.jsonl"
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(out), server)
    port = server.add_secure_port(f"127.0.0.1:{free_port()}", tls.server_credentials(pki.server()))
    await server.start()
    endpoint = f"https://127.0.0.1:{port}"
    tls.use(pki.client(cert=False))  # the exporter verifies the collector against the process's CA
    try:
        telemetry.configure("tls-test", endpoint)
        with telemetry.tracer(__name__, "tls-test").start_as_current_span("over-tls"):
            pass
        await asyncio.to_thread(telemetry.flush)
    finally:
        await asyncio.to_thread(telemetry.close_endpoint, endpoint)  # the collector answers on this loop
        await server.stop(0)
    names = [line for line in out.read_text().splitlines() if '"over-tls"' in line] if out.exists() else []
    assert names, "the span did not arrive over TLS"


async def test_servers_warn_when_bound_off_loopback_without_tls(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one seam: 127.0.0.1 taken for a non-loopback address (servers here bind loopback only)."""
    from services.proxy.server import start as start_proxy
    from services.proxy.settings import Settings as ProxySettings

    caplog.set_level(logging.WARNING, logger="harnessrl.tls")
    monkeypatch.setattr(tls, "is_loopback", lambda host: False)
    store = await _store(tmp_path, tls.TlsSettings())
    await store.stop(0)
    proxy = await start_proxy(ProxySettings.model_validate({"gateway_target": "127.0.0.1:1"}))
    await proxy.stop()
    warned = [r.getMessage() for r in caplog.records]
    assert [m.split(" ")[0] for m in warned] == ["capture_store", "proxy"], warned
    assert all("serves plaintext on 127.0.0.1, not a loopback address" in m for m in warned), warned


async def test_the_dashboard_of_a_run_serves_https(tmp_path: Path, pki: Pki) -> None:
    from services.dashboard.settings import Settings as DashboardSettings
    from stack.embedded import DashboardServer

    settings = DashboardSettings.model_validate({"port": 0, "runs_dir": tmp_path, "tls": pki.server(mtls=True)})
    dashboard = DashboardServer(settings)
    url = await dashboard.start("some-run")
    try:
        assert url.startswith("https://127.0.0.1:")
        base = url.split("/runs/")[0]
        async with httpx.AsyncClient(verify=tls.client_context(pki.client()) or False) as client:
            assert (await client.get(f"{base}/healthz")).status_code == 200
        async with httpx.AsyncClient(verify=tls.client_context(pki.client(cert=False)) or False) as client:
            with pytest.raises(httpx.HTTPError):  # mTLS: no client certificate, no answer
                await client.get(f"{base}/healthz")
    finally:
        await dashboard.stop()
