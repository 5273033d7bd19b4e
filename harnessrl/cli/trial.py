"""``harnessrl trial``."""

from __future__ import annotations

import typer

app = typer.Typer(help="trial", no_args_is_help=True)
