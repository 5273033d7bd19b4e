"""The RPC contract: every RPC declared in proto/harnessrl/v1 must be served to
at least one test (servers record what they serve, see ``harnessrl.rpc``)."""

from __future__ import annotations

from pathlib import Path

from harnessrl.v1 import capture_pb2, gateway_pb2, sandbox_pb2, trainer_pb2

PROTO_MODULES = (capture_pb2, gateway_pb2, sandbox_pb2, trainer_pb2)


def all_rpcs() -> set[str]:
    """Full method paths, e.g. ``/harnessrl.v1.CaptureStore/AppendSegment``."""
    return {
        f"/{service.full_name}/{method.name}"
        for module in PROTO_MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


# Servers that count: the services themselves (by the name they pass to
# harnessrl.rpc.start_server), not probes that tests build on the same stubs.
SERVICE_NAMES = {"gateway", "capture_store", "sandbox", "trainer"}


def check_rpc_coverage(record: Path) -> list[str]:
    lines = record.read_text().splitlines() if record.exists() else []
    served = {method for name, method in (line.split(" ", 1) for line in lines) if name in SERVICE_NAMES}
    return sorted(all_rpcs() - served)
