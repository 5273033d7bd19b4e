"""Stands in for Jaeger in the live compose test: an OTLP/gRPC trace receiver
(opentelemetry-proto's TraceService) that appends every span it is sent, as one
JSON line, to a file the test reads. It runs in the capture store's image
(grpcio and opentelemetry-proto are there) with host networking on 127.0.0.1;
it serves the standard gRPC health service too."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "int_value", "bool_value", "double_value") else str(v)


def span_records(request: Any) -> list[dict[str, Any]]:
    """One flat record per span: its service, name, ids, kind and attributes."""
    out = []
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    {
                        "service": resource.get("service.name", ""),
                        "name": s.name,
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent": s.parent_span_id.hex(),
                        "kind": s.kind,
                        "attributes": {a.key: _value(a.value) for a in s.attributes},
                    }
                )
    return out


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, out: Path) -> None:
        self.out = out

    def append(self, records: list[dict[str, Any]]) -> None:
        with self.out.open("a") as f:  # a few lines per export: not worth a thread
            f.write("".join(json.dumps(r) + "\n" for r in records))

    async def Export(self, request: Any, context: Any) -> trace_service_pb2.ExportTraceServiceResponse:
        self.append(span_records(request))
        return trace_service_pb2.ExportTraceServiceResponse()


async def serve(host: str, port: int, out: Path) -> None:
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(out), server)
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    if server.add_insecure_port(f"{host}:{port}") != port:
        raise SystemExit(f"otlp receiver: cannot bind {host}:{port}")
    await server.start()
    await checker.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"otlp receiver on {host}:{port} -> {out}", flush=True)
    await stop.wait()
    await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the spans are appended to")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.touch()
    asyncio.run(serve(args.host, args.port, args.out))


if __name__ == "__main__":
    main()
