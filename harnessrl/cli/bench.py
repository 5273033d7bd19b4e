"""``harnessrl bench``."""

from __future__ import annotations

import typer

app = typer.Typer(help="bench", no_args_is_help=True)


@app.command()
def proxy(quick: bool = typer.Option(False, help="Fewer turns: a smoke run, not a measurement.")) -> None:
    """Per-turn proxy overhead vs naive re-tokenization; throughput through the proxy vs straight to the engine."""
    from services.proxy.bench import print_tables, run

    print_tables(*run(quick))
