"""A throwaway PKI for TLS tests (the ``cryptography`` package): a CA, a service
certificate (server and client usages) for 127.0.0.1, localhost and the compose
service names, a client certificate, an expired service certificate and an
unrelated CA, written as PEM files under one folder (``ca.pem``, ``service.pem``
and ``service.key`` are the names deploy/compose.tls.yml mounts)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harnessrl.tls import TlsSettings

# What the service certificate is valid for: loopback, and the service names of
# docker-compose.yml (deploy/compose.tls.yml uses this one certificate for all).
HOSTS = ("127.0.0.1", "localhost")
SERVICE_NAMES = ("capture-store", "gateway", "proxy", "sandbox", "trainer", "dashboard")


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    expired_cert: Path
    expired_key: Path
    other_ca: Path

    def server(self, mtls: bool = False, *, expired: bool = False) -> TlsSettings:
        """A server's table: its certificate (expired: one past its notAfter), the client CA when ``mtls``."""
        cert, key = (self.expired_cert, self.expired_key) if expired else (self.server_cert, self.server_key)
        return TlsSettings(cert_file=cert, key_file=key, client_ca_file=self.ca if mtls else None)

    def client(self, *, cert: bool = True, ca: Path | None = None) -> TlsSettings:
        """A client's table: the CA it trusts (default: the right one) and, with ``cert``, its certificate."""
        if not cert:
            return TlsSettings(ca_file=ca or self.ca)
        return TlsSettings(ca_file=ca or self.ca, cert_file=self.client_cert, key_file=self.client_key)

    def service(self) -> TlsSettings:
        """One service's whole table (serves mTLS, dials with the CA and its certificate)."""
        return TlsSettings(
            cert_file=self.server_cert, key_file=self.server_key, client_ca_file=self.ca, ca_file=self.ca
        )


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    cn: str,
    *,
    server: bool,
    not_after: dt.datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(cn)]
    if server:
        names = [HOSTS[1], *SERVICE_NAMES]
        sans = [x509.IPAddress(ipaddress.ip_address(HOSTS[0])), *(x509.DNSName(n) for n in names)]
    usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_after - dt.timedelta(days=30))
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca[1], hashes.SHA256())
    )
    return cert, key


def make_pki(folder: Path) -> Pki:
    """Writes the CA, certificates and keys under ``folder`` (readable by any uid:
    containers of the compose test read them as another user)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca("harnessrl test CA")
    other = _ca("some other CA")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=10)
    server = _leaf(ca, "harnessrl-service", server=True, not_after=later)
    client = _leaf(ca, "harnessrl-client", server=False, not_after=later)
    expired = _leaf(ca, "harnessrl-expired", server=True, not_after=dt.datetime.now(dt.UTC) - dt.timedelta(days=1))
    pki = Pki(
        dir=folder,
        ca=_write_cert(ca[0], folder / "ca.pem"),
        server_cert=_write_cert(server[0], folder / "service.pem"),
        server_key=_write_key(server[1], folder / "service.key"),
        client_cert=_write_cert(client[0], folder / "client.pem"),
        client_key=_write_key(client[1], folder / "client.key"),
        expired_cert=_write_cert(expired[0], folder / "expired.pem"),
        expired_key=_write_key(expired[1], folder / "expired.key"),
        other_ca=_write_cert(other[0], folder / "other-ca.pem"),
    )
    for path in folder.iterdir():
        path.chmod(0o644)
    return pki
