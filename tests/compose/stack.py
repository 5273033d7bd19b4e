"""The compose stack of the live test: free ports, the environment the override
reads, docker-compose invocations against a private engine, health checks of
every service and what the engine holds of a project."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harnessrl.localservers import S3_PORT_FLAGS, free_port, weed_volume_joined
from tests.tls_support import Pki

ROOT = Path(__file__).resolve().parents[2]
OVERRIDE = Path(__file__).with_name("override.yml")
# TLS between the containers: the overlay a user applies, with the fixture's throwaway CA.
TLS_OVERLAY = ROOT / "deploy" / "compose.tls.yml"
SERVICES = ("capture_store", "gateway", "proxy", "sandbox", "trainer", "dashboard", "otlp", "redis")
TOKEN = "compose-service-token"
S3_KEYS = ("compose-access", "compose-secret-key")


def compose_binary() -> str | None:
    return shutil.which("docker-compose")


@dataclass
class Stack:
    """One compose project on the engine at ``docker_host``, over ``dir`` (HRL_DIR)."""

    dir: Path
    docker_host: str
    project: str
    ports: dict[str, int] = field(default_factory=dict)
    weed: dict[str, int] = field(default_factory=dict)
    # The throwaway PKI (ca.pem, service.pem, service.key) the services serve and dial with.
    pki: Pki | None = None

    def __post_init__(self) -> None:
        self.ports = self.ports or {name: free_port() for name in SERVICES}
        self.weed = self.weed or {flag: free_port() for flag in S3_PORT_FLAGS}

    def target(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.weed['s3.port']}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HRL_", "HARNESSRL_", "COMPOSE_"))}
        socket = self.docker_host.removeprefix("unix://")
        env |= {
            "DOCKER_HOST": self.docker_host,
            # docker-compose v1 through the engine's API: the classic builder.
            "DOCKER_BUILDKIT": "0",
            "COMPOSE_DOCKER_CLI_BUILD": "0",
            "COMPOSE_PROJECT_NAME": self.project,
            "COMPOSE_PROFILES": "cpu",
            "HRL_DIR": str(self.dir),
            "HRL_DOCKER_SOCKET": socket,
            "HARNESSRL_SERVICE_TOKEN": TOKEN,
            "HARNESSRL_DASHBOARD_TOKEN": "compose-dashboard-token",
            "HARNESSRL_S3_ACCESS_KEY": S3_KEYS[0],
            "HARNESSRL_S3_SECRET_KEY": S3_KEYS[1],
        }
        env |= {f"HRL_PORT_{name.upper()}": str(port) for name, port in self.ports.items()}
        env |= {f"HRL_WEED_{flag.upper().replace('.', '_')}": str(port) for flag, port in self.weed.items()}
        env["HRL_PORT_CAPTURE"] = str(self.ports["capture_store"])
        if self.pki is not None:
            env["HARNESSRL_TLS_DIR"] = str(self.pki.dir)
        return env

    def client_env(self) -> dict[str, str]:
        """What a client on the host (``harnessrl run``) dials the stack with: the CA and a client certificate."""
        if self.pki is None:
            return {}
        return {
            "HARNESSRL_TLS_CA_FILE": str(self.pki.ca),
            "HARNESSRL_TLS_CERT_FILE": str(self.pki.client_cert),
            "HARNESSRL_TLS_KEY_FILE": str(self.pki.client_key),
        }

    def compose(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run([*self._files(), *args], timeout, check)

    def _run(self, args: list[str], timeout: float, check: bool) -> subprocess.CompletedProcess[str]:
        binary = compose_binary()
        assert binary, "docker-compose not found (Debian package docker-compose, scripts/setup)"
        proc = subprocess.run(
            [binary, *args], env=self.env(), cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
        return proc

    def _files(self) -> list[str]:
        """docker-compose.yml with the override, merged by docker-compose itself; then
        the one thing an override cannot do in compose v1: drop the published ports
        (host networking refuses port bindings, and the servers bind 127.0.0.1 anyway)."""
        merged = self.dir / "compose.merged.yml"
        if not merged.exists():
            files = ["-f", str(ROOT / "docker-compose.yml")]
            files += ["-f", str(TLS_OVERLAY)] if self.pki is not None else []
            files += ["-f", str(OVERRIDE)]
            config = yaml.safe_load(self._run([*files, "config"], 120, True).stdout)
            for service in config["services"].values():
                if service.get("network_mode") == "host":
                    service.pop("ports", None)
            merged.write_text(yaml.safe_dump(config, sort_keys=False))
        return ["-f", str(merged), "--project-directory", str(ROOT)]

    def docker(self, *args: str) -> str:
        proc = subprocess.run(
            ["docker", "--host", self.docker_host, *args], capture_output=True, text=True, check=True, timeout=120
        )
        return proc.stdout

    def inventory(self) -> dict[str, set[str]]:
        """Every container, network and volume the engine has (anonymous volumes,
        the images' VOLUME /data, carry no project label: so all of them)."""
        return {
            "containers": set(self.docker("ps", "-aq").split()),
            "networks": set(self.docker("network", "ls", "-q").split()),
            "volumes": set(self.docker("volume", "ls", "-q").split()),
        }

    def container_states(self) -> dict[str, str]:
        ids = self.docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}").split()
        if not ids:
            return {}
        out = json.loads(self.docker("inspect", *ids))
        return {c["Config"]["Labels"]["com.docker.compose.service"]: c["State"]["Status"] for c in out}

    def logs(self, *services: str) -> str:
        """The last lines of each service's log (of ``services`` only, when named)."""
        return self.compose("logs", "--no-color", "--tail", "60", *services, check=False).stdout[-12000:]

    # Health checks, one per service: what each one answers when it is ready.
    def checks(self) -> dict[str, Callable[[], bool]]:
        grpc_services = {"capture-store": "capture_store", "gateway": "gateway", "sandbox": "sandbox"}
        grpc_services |= {"trainer": "trainer", "jaeger": "otlp"}
        checks: dict[str, Callable[[], bool]] = {
            svc: functools.partial(grpc_serving, self.target(name), self.pki if name != "otlp" else None)
            for svc, name in grpc_services.items()
        }
        scheme = "https" if self.pki is not None else "http"
        checks["proxy"] = lambda: http_ok(f"{scheme}://{self.target('proxy')}/healthz", self.pki)
        checks["dashboard"] = lambda: http_ok(f"{scheme}://{self.target('dashboard')}/healthz", self.pki)
        checks["redis"] = lambda: redis_pings(self.ports["redis"])
        checks["minio"] = lambda: s3_answers(self.s3_endpoint) and weed_volume_joined(self.weed["master.port"])
        checks["sandbox-worker"] = lambda: self.container_states().get("sandbox-worker") == "running"
        return checks

    def wait_healthy(self, timeout: float) -> float:
        """Seconds until every service passes its check; fails naming those that did not."""
        started = time.monotonic()
        pending = self.checks()
        while pending and time.monotonic() - started < timeout:
            pending = {name: check for name, check in pending.items() if not _safe(check)}
            if pending:
                time.sleep(0.5)
        # The failing services' own logs and states (every service's would push theirs out).
        states = self.container_states()
        assert not pending, (
            f"not healthy after {timeout:.0f}s: {sorted(pending)}, states {states}\n{self.logs(*sorted(pending))}"
        )
        return time.monotonic() - started


def _safe(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except Exception:  # noqa: BLE001 - not up yet: refused, reset, not serving
        return False


def grpc_serving(target: str, pki: Pki | None = None) -> bool:
    """The standard health check; over mTLS (the CA, a client certificate) with ``pki``."""
    if pki is None:
        channel = grpc.insecure_channel(target)
    else:
        key, cert = pki.client_key.read_bytes(), pki.client_cert.read_bytes()
        credentials = grpc.ssl_channel_credentials(pki.ca.read_bytes(), key, cert)
        channel = grpc.secure_channel(target, credentials)
    with channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def http_ok(url: str, pki: Pki | None = None) -> bool:
    import httpx

    from harnessrl import tls

    verify = tls.client_context(pki.client()) if pki is not None else None
    return httpx.get(url, timeout=2, verify=verify or True).status_code == 200


def redis_pings(port: int) -> bool:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    try:
        return bool(client.ping())
    finally:
        client.close()


def s3_answers(endpoint: str) -> bool:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_KEYS[0],
        aws_secret_access_key=S3_KEYS[1],
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, connect_timeout=2, read_timeout=2, retries={"max_attempts": 1}),
    )
    client.list_buckets()
    return True
