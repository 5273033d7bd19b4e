"""``harnessrl gateway``: Rollout gateway: serve token-id generation over engines."""

from __future__ import annotations

from typing import Annotated

import typer

from stack.cli.common import ConfigOption, HostOption, PortOption, serve_grpc

app = typer.Typer(help="Rollout gateway: serve token-id generation over engines.", no_args_is_help=True)

EngineOption = Annotated[
    str | None,
    typer.Option(
        "--engine",
        help="Engine: 'local' (transformers CPU, default), 'vllm', 'scripted:PATH' or 'module.path:ClassName'.",
    ),
]


@app.command()
def serve(
    config: ConfigOption = None,
    host: HostOption = None,
    port: PortOption = None,
    engine: EngineOption = None,
) -> None:
    """Serve the gateway gRPC service until SIGTERM."""
    from services.gateway.server import create_server
    from services.gateway.settings import Settings

    serve_grpc(Settings, "gateway", config, {"host": host, "port": port, "engine": engine}, create_server)
