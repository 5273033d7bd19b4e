"""The verl worker gateway's advertised address (``stack/verl/address.py``): loopback
forms, the cluster's shape, the derived address of a wildcard bind (this host's real
routing table and interfaces) and ``harnessrl verl prepare``'s check of the same."""

from __future__ import annotations

import ipaddress
import socket
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harnessrl.errors import ConfigError
from stack.verl import address as va

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.toml"
ACROSS = "trainer.nnodes=2"  # a cluster_reason: the proxy may be on another node


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.0.1.1", "127.255.255.254", "::1", "[::1]", "::ffff:127.0.0.1", "localhost", "LOCALHOST",
     "node.localhost", " 127.0.0.1 "],
)  # fmt: skip
def test_loopback_forms(host: str) -> None:
    assert va.is_loopback(host)


@pytest.mark.parametrize("host", ["10.0.0.2", "192.168.1.5", "fd00::2", "[fd00::2]", "node-1", "0.0.0.0", "::"])
def test_not_loopback(host: str) -> None:
    assert not va.is_loopback(host)


def test_target_host() -> None:
    assert va.target_host("10.0.0.2:50051") == "10.0.0.2"
    assert va.target_host("[fd00::2]:50051") == "fd00::2"
    assert va.target_host("sandbox.svc:1") == "sandbox.svc"
    assert va.target_host("unix:/run/sandbox.sock") is None and va.target_host(None) is None


def test_cluster_shape() -> None:
    one = {"trainer.nnodes": 1, "rollout.nnodes": "1"}
    assert va.cluster_reason(one, "127.0.0.1:50051") is None
    assert va.cluster_reason(one, "[::1]:50051") is None and va.cluster_reason(one, "localhost:1") is None
    assert va.cluster_reason(one, "unix:/run/s.sock") is None and va.cluster_reason(one, None) is None
    assert va.cluster_reason({"trainer.nnodes": None}, None) is None
    assert va.cluster_reason({"trainer.nnodes": 2}, "127.0.0.1:1") == "trainer.nnodes=2"
    assert va.cluster_reason({"rollout.nnodes": "4"}, None) == "rollout.nnodes=4"
    assert va.cluster_reason(one, "10.0.0.2:50051") == "sandbox_target 10.0.0.2:50051 is another host"
    assert va.cluster_reason(one, "sandbox:50051") == "sandbox_target sandbox:50051 is another host"
    with pytest.raises(ConfigError, match=r"trainer.nnodes must be an integer number of nodes, got 'many'"):
        va.cluster_reason({"trainer.nnodes": "many"}, None)


def test_one_node_allows_loopback() -> None:
    assert va.advertised_host("127.0.0.1", "", "127.0.0.1", None) == "127.0.0.1"
    assert va.advertised_host("::1", "", None, None) == "::1"
    assert va.advertised_host("0.0.0.0", "localhost", None, None) == "localhost"
    assert va.advertised_host("0.0.0.0", "127.0.1.1", None, None) == "127.0.1.1"


def test_an_explicit_address_wins() -> None:
    assert va.advertised_host("0.0.0.0", "10.9.8.7", "10.0.0.2", ACROSS) == "10.9.8.7"
    assert va.advertised_host("0.0.0.0", "node-7.cluster", None, ACROSS) == "node-7.cluster"
    assert va.advertised_host("::", "[fd00::7]", None, ACROSS) == "fd00::7", "IPv6, bracketed or not"
    assert va.advertised_host("10.1.1.1", "", None, ACROSS) == "10.1.1.1", "a specific bind is the address"


@pytest.mark.parametrize(
    ("bind", "address", "names"),
    [
        ("127.0.0.1", "", "gateway_bind (HARNESSRL_VERL_GATEWAY_BIND)=127.0.0.1 is loopback"),
        ("::1", "", "gateway_bind (HARNESSRL_VERL_GATEWAY_BIND)=::1 is loopback"),
        ("localhost", "", "gateway_bind (HARNESSRL_VERL_GATEWAY_BIND)=localhost is loopback"),
        ("127.0.0.1", "10.0.0.5", "gateway_bind (HARNESSRL_VERL_GATEWAY_BIND)=127.0.0.1 is loopback"),
        ("0.0.0.0", "127.0.1.1", "gateway_address (HARNESSRL_VERL_GATEWAY_ADDRESS)=127.0.1.1 is loopback"),
        ("0.0.0.0", "localhost", "gateway_address (HARNESSRL_VERL_GATEWAY_ADDRESS)=localhost is loopback"),
        ("::", "[::1]", "gateway_address (HARNESSRL_VERL_GATEWAY_ADDRESS)=[::1] is loopback"),
    ],
)
def test_loopback_across_nodes_is_refused_naming_the_setting(bind: str, address: str, names: str) -> None:
    with pytest.raises(
        ConfigError, match=r"HARNESSRL_VERL_GATEWAY_BIND=0\.0\.0\.0|HARNESSRL_VERL_GATEWAY_ADDRESS to"
    ) as e:
        va.advertised_host(bind, address, "10.0.0.2", ACROSS)
    assert names in str(e.value) and ACROSS in str(e.value)


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "not a host!", "10.0.0.1:80"])
def test_a_malformed_address_is_refused_on_one_node_too(address: str) -> None:
    with pytest.raises(ConfigError, match=r"gateway_address \(HARNESSRL_VERL_GATEWAY_ADDRESS\)="):
        va.advertised_host("0.0.0.0", address, None, None)


def test_a_name_that_resolves_to_loopback_here_is_refused_across_nodes() -> None:
    name = socket.gethostname()
    if not all(va.is_loopback(info[4][0]) for info in socket.getaddrinfo(name, None)):
        pytest.skip(f"this host's name {name} resolves to a real address here")
    assert va.advertised_host("0.0.0.0", name, None, None) == name.lower()
    with pytest.raises(ConfigError, match="resolves to loopback on this node"):
        va.advertised_host("0.0.0.0", name, None, ACROSS)


def test_a_wildcard_bind_derives_a_non_loopback_address_of_this_host() -> None:
    first = va.first_interface_ipv4()
    if first is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    derived = va.advertised_host("0.0.0.0", "", None, ACROSS)
    assert not va.is_loopback(derived)
    # What the code did before: gethostbyname(gethostname()), loopback on stock Debian/Ubuntu
    # (127.0.1.1) and on this host; the derived address is a real one of this host.
    assert derived != socket.gethostbyname(socket.gethostname()) or not va.is_loopback(derived)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((derived, 0))  # an address of this host (else EADDRNOTAVAIL)
    # Towards a peer, the source address of the route to it (here: the same interface).
    assert va.advertised_host("0.0.0.0", "", derived, ACROSS) == va.route_source(derived, socket.AF_INET) == derived
    # A loopback peer (the sandbox on this node) does not make the address loopback.
    assert not va.is_loopback(va.advertised_host("0.0.0.0", "", "127.0.0.1", None))


def test_an_ipv6_wildcard_derives_an_ipv6_address() -> None:
    derived = va.advertised_host("::", "", None, None)
    assert isinstance(ipaddress.ip_address(derived), ipaddress.IPv6Address)


def test_the_worker_reads_the_shape_from_verls_config() -> None:
    one = OmegaConf.create({"trainer": {"nnodes": 1}})
    assert va.worker_host(one, "127.0.0.1", "", "127.0.0.1:50051") == "127.0.0.1"
    assert va.worker_host(OmegaConf.create({}), "127.0.0.1", "", "unix:/run/s.sock") == "127.0.0.1"
    four = OmegaConf.create({"trainer": {"nnodes": 4}})
    with pytest.raises(ConfigError, match=r"^harnessrl_agent: gateway_bind .*\(trainer.nnodes=4\)"):
        va.worker_host(four, "127.0.0.1", "", "127.0.0.1:50051")
    with pytest.raises(ConfigError, match=r"sandbox_target 10.0.0.2:50051 is another host"):
        va.worker_host(one, "127.0.0.1", "", "10.0.0.2:50051")


# -- harnessrl verl prepare -------------------------------------------------------------------


def prepare_cli(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    from stack.cli.main import main

    monkeypatch.setattr(sys, "argv", ["harnessrl", "verl", "prepare", "--config", str(QUICKSTART), *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    out = capsys.readouterr()
    return int(exit_.value.code or 0), out.out + out.err


@pytest.mark.parametrize(
    ("env", "overrides", "says"),
    [
        ({"HARNESSRL_VERL_GATEWAY_BIND": "127.0.0.1"}, ["trainer.nnodes=4"], "is loopback but the proxy may run"),
        ({"HARNESSRL_VERL_GATEWAY_ADDRESS": "127.0.1.1"}, ["rollout.nnodes=2"], "ADDRESS)=127.0.1.1 is loopback"),
        (
            {"HARNESSRL_VERL_GATEWAY_BIND": "::1", "HARNESSRL_SANDBOX_TARGET": "10.0.0.2:50051"},
            [],
            "sandbox_target 10.0.0.2:50051 is another host",
        ),
        ({}, ["+trainer.nnodes=many"], "trainer.nnodes must be an integer"),
        ({"HARNESSRL_VERL_GATEWAY_ADDRESS": "not a host!"}, [], "is not a host name or IP address"),
    ],
)
def test_prepare_refuses_a_bad_combination_with_one_line_and_writes_nothing(
    env: dict[str, str],
    overrides: list[str],
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key in ("HARNESSRL_VERL_GATEWAY_BIND", "HARNESSRL_VERL_GATEWAY_ADDRESS", "HARNESSRL_SANDBOX_TARGET"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "verl"
    code, text = prepare_cli(["--out", str(out), *(f"--override={o}" for o in overrides)], monkeypatch, capsys)
    assert code == 2 and says in text, text
    assert len(text.strip().splitlines()) == 1 and text.startswith("error: "), text
    assert not out.exists(), "nothing written"


def test_prepare_writes_a_wildcard_bind_for_a_multi_node_cluster() -> None:
    from stack import runconfig
    from stack.verl import prepare as verl_prepare

    cfg = runconfig.load(QUICKSTART)
    assert verl_prepare.gateway_bind_for(cfg, [], {}) == "127.0.0.1"
    assert verl_prepare.gateway_bind_for(cfg, ["++rollout.nnodes=2"], {}) == "0.0.0.0"
    env = {"HARNESSRL_SANDBOX_TARGET": "10.0.0.2:50051", "HARNESSRL_VERL_GATEWAY_ADDRESS": "10.0.0.9"}
    assert verl_prepare.gateway_bind_for(cfg, ["trainer.nnodes=1"], env) == "0.0.0.0"
    entry = verl_prepare.agent_loop_entry(cfg, "0.0.0.0")
    assert entry["gateway_bind"] == "${oc.env:HARNESSRL_VERL_GATEWAY_BIND,0.0.0.0}"
    assert verl_prepare.agent_loop_entry(cfg)["gateway_bind"] == "${oc.env:HARNESSRL_VERL_GATEWAY_BIND,127.0.0.1}"
