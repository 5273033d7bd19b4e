"""``harnessrl proxy``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from harnessrl import logs
from harnessrl.config import load_section
from stack.cli.common import ConfigOption, HostOption, PortOption

app = typer.Typer(help="The token-faithful proxy (HTTP).", no_args_is_help=True)


@app.command()
def serve(
    config: ConfigOption = None,
    host: HostOption = None,
    port: PortOption = None,
    gateway: Annotated[str | None, typer.Option(help="Gateway host:port (gRPC).")] = None,
    capture: Annotated[str | None, typer.Option(help="Capture store host:port (gRPC).")] = None,
    model_dir: Annotated[Path | None, typer.Option(help="HF model folder (tokenizer, chat template).")] = None,
    chat_template: Annotated[str | None, typer.Option(help="auto | model | builtin name | .jinja path.")] = None,
    tool_parser: Annotated[str | None, typer.Option(help="hermes | qwen3_coder | json | module:Class.")] = None,
    uds: Annotated[Path | None, typer.Option(help="Also serve on this Unix socket.")] = None,
) -> None:
    """Serve the proxy over HTTP (and a Unix socket) until SIGTERM. Secrets (admin
    and capture tokens) come from the config file or HARNESSRL_PROXY_* variables."""
    from services.proxy.server import serve_until_signal
    from services.proxy.settings import Settings

    overrides = {
        "host": host,
        "port": port,
        "gateway_target": gateway,
        "capture_target": capture,
        "model_dir": model_dir,
        "chat_template": chat_template,
        "tool_parser": tool_parser,
        "uds_path": uds,
    }
    settings = load_section(Settings, config, "proxy", overrides)
    logs.configure(settings.log_level)
    asyncio.run(serve_until_signal(settings))


@app.command()
def preflight(
    config: ConfigOption = None,
    model_dir: Annotated[Path | None, typer.Option(help="HF model folder.")] = None,
    chat_template: Annotated[str | None, typer.Option()] = None,
    tool_parser: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Checks that the chat template renders tools and the parser reads back its tool calls."""
    from services.proxy.app import load_model
    from services.proxy.settings import Settings

    overrides = {"model_dir": model_dir, "chat_template": chat_template, "tool_parser": tool_parser}
    settings = load_section(Settings, config, "proxy", overrides)
    model = load_model(settings)
    typer.echo(
        f"ok: model={model.names[0]} template={model.template.name} sha256={model.template.sha256} "
        f"parser={model.parser.name}"
    )
