"""The address a verl AgentLoopWorker's in-process gateway is named to the proxy by.

The proxy (in-process with the sandbox service's workers, maybe on another node)
dials ``TrialSpec.gateway_target``. A loopback name there reaches nothing across
nodes: every call fails, every trial is a masked row, and the run trains on
nothing while looking busy (only ``harnessrl/masked_fraction`` says so). So a
loopback bind or address is refused whenever the cluster spans nodes, and with a
wildcard bind (0.0.0.0, ::) the address is derived from the routing table, never
from ``gethostbyname(gethostname())`` (127.0.1.1 on stock Debian and Ubuntu).

Settings (agent-loop keyword arguments, ``stack/verl/agent_loops.yaml``):
``gateway_bind`` (env ``HARNESSRL_VERL_GATEWAY_BIND``) and ``gateway_address``
(env ``HARNESSRL_VERL_GATEWAY_ADDRESS``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import socket
import struct
from collections.abc import Mapping
from typing import Any

from harnessrl.errors import ConfigError
from harnessrl.rpc import check_target

BIND = "gateway_bind (HARNESSRL_VERL_GATEWAY_BIND)"
ADDRESS = "gateway_address (HARNESSRL_VERL_GATEWAY_ADDRESS)"
NNODES = ("trainer.nnodes", "rollout.nnodes")  # verl's node counts: >1 spans nodes
WILDCARDS = frozenset({"0.0.0.0", "::"})
# Documentation ranges (RFC 5737, RFC 3849): never assigned, so the kernel's route to
# them is the default route. A UDP connect() only looks the route up; nothing is sent.
_DEFAULT_ROUTE_PROBES = {socket.AF_INET: "192.0.2.1", socket.AF_INET6: "2001:db8::1"}
_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def _bare(host: str) -> str:
    return host.strip().removeprefix("[").removesuffix("]").lower()


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also IPv4-mapped), ``localhost`` and ``*.localhost`` (RFC 6761)."""
    bare = _bare(host)
    if bare == "localhost" or bare.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def target_host(target: str | None) -> str | None:
    """The host of a gRPC ``host:port`` / ``[v6]:port`` target; None for a unix socket or none."""
    if not target or target.startswith("unix:") or "${" in target:
        return None
    host = target.rpartition(":")[0] if ":" in target else target
    return _bare(host) or None


def cluster_reason(nnodes: Mapping[str, object], sandbox_target: str | None) -> str | None:
    """Why the proxy may run on another node than this gateway, or None (one node):
    verl spread over nodes (``trainer.nnodes``, ``rollout.nnodes`` > 1), or a sandbox
    service (whose workers hold the proxy) named by a non-loopback host."""
    for key, value in nnodes.items():
        if value is None:  # unset (null) in verl's config: one node
            continue
        try:
            count = int(str(value))
        except ValueError as e:
            raise ConfigError(f"{key} must be an integer number of nodes, got {value!r}") from e
        if count > 1:
            return f"{key}={count}"
    host = target_host(sandbox_target)
    if host is not None and not is_loopback(host):
        return f"sandbox_target {sandbox_target} is another host"
    return None


def worker_host(config: Any, bind: str, address: str, sandbox_target: str) -> str:
    """``advertised_host`` for an agent loop built by verl: the cluster's shape from verl's
    config (``trainer.nnodes``, ``rollout.nnodes``) and the sandbox target, the route
    derived towards the sandbox's host. Any problem is a ConfigError naming the setting."""
    from omegaconf import OmegaConf

    nnodes = {key: OmegaConf.select(config, key, default=1) for key in NNODES}
    try:
        remote = cluster_reason(nnodes, sandbox_target)
        return advertised_host(bind, address, target_host(sandbox_target), remote)
    except ConfigError as e:
        raise ConfigError(f"harnessrl_agent: {e}") from e


def check_settings(bind: str, address: str, remote: str | None) -> None:
    """The checks that need no network lookup (``harnessrl verl prepare`` runs these on the
    head node; the worker runs them again, then ``advertised_host``'s)."""
    if address:
        bare = _bare(address)
        try:
            check_target(f"[{bare}]:1" if ":" in bare else f"{bare}:1")
        except ValueError as e:
            raise ConfigError(f"{ADDRESS}={address!r} is not a host name or IP address ({e})") from e
    if address and _bare(address) in WILDCARDS:
        raise ConfigError(f"{ADDRESS}={address} is a wildcard, not an address the proxy can dial; {_advice()}")
    if remote is None:
        return
    if is_loopback(bind):
        raise ConfigError(
            f"{BIND}={bind} is loopback but the proxy may run on another node ({remote}): only this node can "
            "reach the gateway, every trial would be masked; set HARNESSRL_VERL_GATEWAY_BIND=0.0.0.0 (the address "
            "named to the proxy is then derived from the route to the sandbox, or set HARNESSRL_VERL_GATEWAY_ADDRESS)"
        )
    if address and is_loopback(address):
        raise ConfigError(
            f"{ADDRESS}={address} is loopback but the proxy may run on another node ({remote}); {_advice()}"
        )


def _advice() -> str:
    return (
        "set HARNESSRL_VERL_GATEWAY_ADDRESS to this node's address on the network the proxy reaches it by, "
        "or leave it unset with HARNESSRL_VERL_GATEWAY_BIND=0.0.0.0 to derive it from the route to the sandbox"
    )


@functools.lru_cache(maxsize=64)
def advertised_host(bind: str, address: str = "", peer: str | None = None, remote: str | None = None) -> str:
    """The host the proxy is told to dial (``host:port``'s host; IPv6 without brackets).

    ``address`` wins when set; else a specific ``bind`` is the address; else (a wildcard
    bind) the source address of this node's route to ``peer`` (the sandbox service's
    host) when that is not loopback, else of its default route, else the first
    non-loopback interface address, else loopback. ``remote`` (``cluster_reason``) is
    why loopback would not do; with it, a loopback outcome is a ConfigError."""
    check_settings(bind, address, remote)
    if address:
        host = _bare(address)
        if remote is not None and _resolves_to_loopback(host):
            raise ConfigError(f"{ADDRESS}={address} resolves to loopback on this node ({remote}); {_advice()}")
        return host
    if _bare(bind) not in WILDCARDS:
        return _bare(bind)
    family = socket.AF_INET6 if ":" in _bare(bind) else socket.AF_INET
    host = derive_host(family, peer)
    if remote is not None and is_loopback(host):
        raise ConfigError(
            f"{BIND}={bind}: this node has no non-loopback address to name to the proxy ({remote}); {_advice()}"
        )
    return host


def derive_host(family: socket.AddressFamily, peer: str | None = None) -> str:
    """This node's address for ``family`` as the routing table picks it (see ``advertised_host``)."""
    if peer and not is_loopback(peer):
        found = route_source(peer, family)
        if found and not is_loopback(found):
            return found
    found = route_source(_DEFAULT_ROUTE_PROBES[family], family)
    if found and not is_loopback(found):
        return found
    if family == socket.AF_INET and (first := first_interface_ipv4()):
        return first
    return "::1" if family == socket.AF_INET6 else "127.0.0.1"


def route_source(peer: str, family: socket.AddressFamily) -> str | None:
    """The local address the kernel would send from to reach ``peer``; None without a route."""
    try:
        infos = socket.getaddrinfo(peer, 9, family, socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for fam, kind, proto, _, sockaddr in infos:
        with socket.socket(fam, kind, proto) as probe:
            with contextlib.suppress(OSError):
                probe.connect(sockaddr)
                return str(probe.getsockname()[0])
    return None


def first_interface_ipv4() -> str | None:
    """The IPv4 address of the first interface (by index) that has a non-loopback one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                reply = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            ip = socket.inet_ntoa(reply[20:24])
            if not is_loopback(ip) and ip != "0.0.0.0":
                return ip
    return None


def _resolves_to_loopback(host: str) -> bool:
    """A name whose every address here is loopback (``$(hostname)`` on stock Debian:
    127.0.1.1); a name that does not resolve here is left to the proxy's resolver."""
    if is_loopback(host):
        return True
    try:
        ipaddress.ip_address(host)
        return False
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(is_loopback(str(info[4][0])) for info in infos)
