"""``harnessrl proxy``."""

from __future__ import annotations

import typer

from harnessrl.cli.common import ConfigOption, HostOption, PortOption, serve_http

app = typer.Typer(help="The proxy (HTTP).", no_args_is_help=True)


@app.command()
def serve(config: ConfigOption = None, host: HostOption = None, port: PortOption = None) -> None:
    """Serve the proxy over HTTP until SIGTERM."""
    from services.proxy.app import create_app
    from services.proxy.settings import Settings

    serve_http(create_app, Settings, "proxy", config, {"host": host, "port": port})
