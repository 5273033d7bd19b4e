"""The ``harnessrl`` command: one sub-command group per noun."""

from __future__ import annotations

import sys

import typer

from harnessrl.errors import HarnessError
from stack.cli import (
    bench,
    capture,
    conformance,
    dashboard,
    gateway,
    proxy,
    report,
    run,
    sandbox,
    tasks,
    train,
    trial,
    verl,
)

app = typer.Typer(
    name="harnessrl",
    help="Reinforcement learning for coding agents through their own, unmodified harnesses.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(proxy.app, name="proxy")
app.add_typer(gateway.app, name="gateway")
app.add_typer(sandbox.app, name="sandbox")
app.add_typer(trial.app, name="trial")
app.add_typer(capture.app, name="capture")
app.add_typer(train.app, name="train")
app.add_typer(dashboard.app, name="dashboard")
app.add_typer(tasks.app, name="tasks")
app.add_typer(bench.app, name="bench")
app.add_typer(verl.app, name="verl")
app.command("run")(run.run)
app.command("preflight")(run.preflight)
app.command("eval")(run.evaluate)
app.command("conformance")(conformance.conformance)
app.command("report")(report.report)


def main() -> None:
    """Entry point: HarnessError (bad config, bad input) is one clear line and exit 2."""
    try:
        app()
    except HarnessError as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
