"""deploy/compose.tls.yml, validated statically (the live compose test runs it):
every harnessrl service of docker-compose.yml gets its certificate, key, client CA
and CA, each variable a field of that service's settings, and the settings load
from them into a table that serves mTLS and dials with the CA."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harnessrl.config import load_section
from tests.tls_support import make_pki
from tests.unit.test_compose import settings_classes

ROOT = Path(__file__).resolve().parents[2]
MOUNT = "/etc/harnessrl/tls"


def overlay() -> dict[str, dict[str, str]]:
    data = yaml.safe_load((ROOT / "deploy" / "compose.tls.yml").read_text())
    return {name: service.get("environment", {}) for name, service in data["services"].items()}


def test_every_harnessrl_service_of_the_compose_file_is_covered() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    ours = {name for name, service in compose.items() if "build" in service}
    assert ours == set(overlay()), "deploy/compose.tls.yml must cover exactly the harnessrl services"
    for name, service in yaml.safe_load((ROOT / "deploy" / "compose.tls.yml").read_text())["services"].items():
        assert set(service) == {"environment", "volumes"}, f"{name}: the overlay only adds TLS env and the mount"
        assert service["volumes"] == [f"${{HARNESSRL_TLS_DIR:-./certs}}:{MOUNT}:ro"], name


@pytest.mark.parametrize("service", sorted(overlay()))
def test_the_overlay_loads_into_a_table_that_serves_mtls_and_dials_with_the_ca(
    service: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = make_pki(tmp_path / "pki")
    classes = settings_classes()
    env = overlay()[service]
    prefixes = {key.split("_TLS__")[0] + "_" for key in env if "_TLS__" in key}
    assert len(prefixes) == 1, f"{service}: one service's variables, got {prefixes}"
    (prefix,) = prefixes
    section, cls = classes[prefix]
    for key, value in env.items():
        monkeypatch.setenv(key, value.replace(MOUNT, str(pki.dir)))
    settings = load_section(cls, None, section)
    assert settings.tls.serves_tls and settings.tls.client_ca_file == pki.ca and settings.tls.ca_file == pki.ca
    if section == "sandbox":
        assert str(getattr(settings, "proxy_url", "")).startswith("https://"), "the worker dials the proxy's https"
