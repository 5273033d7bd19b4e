"""Transport security shared by every service: one ``TlsSettings`` table in each
service's settings (``[proxy.tls]``, env ``HARNESSRL_PROXY_TLS__CERT_FILE``...),
turned here into gRPC credentials, uvicorn options and ``ssl`` contexts.

- A server serves TLS when ``cert_file`` and ``key_file`` are set, and requires a
  client certificate signed by ``client_ca_file`` when that is set (mTLS).
- A client verifies the server against ``ca_file`` when it is set, and presents
  ``cert_file``/``key_file`` when they are set too (for servers that want mTLS).
  Without ``ca_file`` it dials in plaintext.

Clients are built deep inside services (the trainer's loop, the proxy's engine
pool, the dashboard's sources) from a target and a token; how they dial is the
process's: ``use(settings.tls)`` at a service's start-up (its CLI command) makes
its table the one every client of the process uses. A process that is no service
(``harnessrl run`` against a deployed stack, an export) reads the same fields
from ``HARNESSRL_TLS_CA_FILE``, ``HARNESSRL_TLS_CERT_FILE``...

Plaintext stays the default only on loopback: a server bound anywhere else
without TLS logs a warning (``warn_if_plaintext``).
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    import grpc

log = logging.getLogger(__name__)


class TlsSettings(BaseModel):
    """Certificates of one service: what it serves and whom it trusts (PEM files)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cert_file: Path | None = Field(
        None, description="Certificate chain this service serves (and presents to servers that verify clients)."
    )
    key_file: Path | None = Field(None, description="Private key of cert_file.")
    client_ca_file: Path | None = Field(
        None, description="Servers require a client certificate signed by this CA (mTLS); unset: any client."
    )
    ca_file: Path | None = Field(
        None, description="CA that verifies the servers this service dials; unset: its clients dial in plaintext."
    )

    @model_validator(mode="after")
    def _consistent(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: set both or neither")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("client_ca_file (mTLS) needs cert_file and key_file: a server without TLS cannot ask")
        for name in ("cert_file", "key_file", "client_ca_file", "ca_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: {path} is not a readable file")
        return self

    @property
    def serves_tls(self) -> bool:
        return self.cert_file is not None

    @property
    def dials_tls(self) -> bool:
        return self.ca_file is not None


class EnvTls(TlsSettings, BaseSettings):
    """The client side of a process that is no service: ``HARNESSRL_TLS_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="HARNESSRL_TLS_", extra="forbid", frozen=True)


_lock = threading.Lock()
_process: TlsSettings | None = None


def use(tls: TlsSettings) -> None:
    """Makes ``tls`` how every client of this process dials (a service's start-up).
    A table that says nothing of clients (no ``ca_file``) leaves the environment's."""
    global _process
    if tls.dials_tls:
        with _lock:
            _process = tls


def client() -> TlsSettings:
    """How this process's clients dial: ``use``'s table, else ``HARNESSRL_TLS_*``."""
    global _process
    with _lock:
        if _process is None:
            _process = EnvTls()  # type: ignore[call-arg]  # fields come from the environment
        return _process


def reset() -> None:
    """Forgets ``use`` (tests): the environment decides again."""
    global _process
    with _lock:
        _process = None


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None


# -- gRPC ----------------------------------------------------------------------
def server_credentials(tls: TlsSettings) -> grpc.ServerCredentials | None:
    """TLS (mTLS with ``client_ca_file``) credentials of a gRPC server; None: plaintext."""
    if not tls.serves_tls:
        return None
    import grpc

    pair = (_read(tls.key_file), _read(tls.cert_file))
    client_ca = _read(tls.client_ca_file)
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def channel_credentials(tls: TlsSettings) -> grpc.ChannelCredentials | None:
    """Credentials of a gRPC channel that verifies the server against ``ca_file``; None: plaintext."""
    if not tls.dials_tls:
        return None
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file), private_key=_read(tls.key_file), certificate_chain=_read(tls.cert_file)
    )


# -- HTTP ----------------------------------------------------------------------
def uvicorn_options(tls: TlsSettings) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments serving TLS (mTLS with ``client_ca_file``)."""
    if not tls.serves_tls:
        return {}
    options: dict[str, Any] = {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file)}
    if tls.client_ca_file is not None:
        options |= {"ssl_ca_certs": str(tls.client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options


def client_context(tls: TlsSettings) -> ssl.SSLContext | None:
    """An ``ssl`` client context verifying the server against ``ca_file`` (and
    presenting the client certificate when set); None: plaintext."""
    if not tls.dials_tls:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(tls.ca_file))
    if tls.cert_file is not None:
        ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    return ctx


def http_scheme(tls: TlsSettings) -> str:
    return "https" if tls.serves_tls else "http"


# -- plaintext off loopback ----------------------------------------------------
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_if_plaintext(service: str, host: str, tls: TlsSettings) -> bool:
    """Logs a warning (and returns True) for a server bound off loopback without TLS."""
    if tls.serves_tls or is_loopback(host):
        return False
    log.warning(
        "%s serves plaintext on %s, not a loopback address: tokens and data cross the network in clear; "
        "set its tls cert_file and key_file (env HARNESSRL_%s_TLS__CERT_FILE, HARNESSRL_%s_TLS__KEY_FILE)",
        service,
        host,
        service.upper(),
        service.upper(),
        extra={"kv": {"service": service, "host": host}},
    )
    return True


# -- why a TLS connection failed -----------------------------------------------
def probe(host: str, port: int, settings: TlsSettings, timeout_s: float = 2.0) -> str:
    """Why a TLS connection to ``host:port`` fails, in words ('' when it does not):
    a handshake the way ``settings`` dials, then a short read (a TLS 1.3 server
    refuses a missing client certificate only after the client's handshake ends)."""
    import socket

    ctx = client_context(settings)
    if ctx is None:
        return ""
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as conn:
                try:
                    if conn.recv(1) == b"" and settings.cert_file is None:
                        return (
                            "the server closed the connection after the TLS handshake: it requires a "
                            "client certificate (mTLS) and this client presents none"
                        )
                except TimeoutError:
                    pass
                return ""
    except ssl.SSLCertVerificationError as e:
        return f"the server's certificate does not verify against {settings.ca_file}: {e.verify_message}"
    except ssl.SSLError as e:
        reason = e.reason or str(e)
        if "CERTIFICATE_REQUIRED" in reason or "HANDSHAKE_FAILURE" in reason:
            if settings.cert_file is None:
                return f"the server requires a client certificate (mTLS) and this client presents none ({reason})"
            return f"the server refused the client certificate {settings.cert_file} ({reason})"
        if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER_FAILURE" in reason:
            return f"the server does not speak TLS ({reason})"
        return reason
    except OSError:
        return ""  # refused, unreachable: not a matter of TLS, the caller's own error says it


def explain(address: str, settings: TlsSettings) -> str:
    """``probe`` of a ``host:port`` (or ``[v6]:port``) address; '' when there is nothing to say."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not settings.dials_tls:
        return ""
    return probe(host.strip("[]"), int(port), settings)
