"""``harnessrl bench``."""

from __future__ import annotations

import typer

app = typer.Typer(help="bench", no_args_is_help=True)
