"""``harnessrl train``: Trainer: serve status/metrics and run training."""

from __future__ import annotations

import typer

from harnessrl.cli.common import ConfigOption, HostOption, PortOption, serve_grpc

app = typer.Typer(help="Trainer: serve status/metrics and run training.", no_args_is_help=True)


@app.command()
def serve(config: ConfigOption = None, host: HostOption = None, port: PortOption = None) -> None:
    """Serve the trainer gRPC service until SIGTERM."""
    from services.trainer.server import create_server
    from services.trainer.settings import Settings

    serve_grpc(Settings, "trainer", config, {"host": host, "port": port}, create_server)
