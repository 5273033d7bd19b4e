"""The ``harnessrl`` command: one sub-command group per noun."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Iterator
from typing import Any

import typer

from harnessrl.errors import HarnessError
from stack.cli import (
    bench,
    capture,
    conformance,
    dashboard,
    gateway,
    harness,
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
    help="Reinforcement learning for coding agents through their own, unmodified harnesses.\n\n"
    "Start here: 'harnessrl trial run --task tasks/builtin/train/echo-00 --harness mini-swe-agent' runs one "
    "trial of the default model (a few minutes on CPU); 'harnessrl run examples/quickstart.toml' trains "
    "(the quickstart, ~6 minutes on 2 cores); 'harnessrl tasks list' shows the built-in task pools.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Plain help (click's): rich markup would eat every "[run]" and "[sandbox]" in the help texts.
    # Every sub-group and command inherits this mode from the app they are added to.
    rich_markup_mode=None,
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
app.add_typer(harness.app, name="harness")
app.command("run")(run.run)
app.command("preflight")(run.preflight)
app.command("eval")(run.evaluate)
app.command("conformance")(conformance.conformance)
app.command("report")(report.report)


def command() -> Any:
    """The click command of ``app``; each sub-command listed by its whole first sentence
    (click would cut it at ~45 characters with '...')."""
    root = typer.main.get_command(app)
    for cmd in walk(root):
        if cmd.short_help is None and cmd.help:
            cmd.short_help = first_sentence(cmd.help)
    return root


def walk(cmd: Any) -> Iterator[Any]:
    """The command and every sub-command (typer's own click commands: groups have ``commands``)."""
    yield cmd
    for sub in getattr(cmd, "commands", {}).values():
        yield from walk(sub)


def first_sentence(text: str) -> str:
    paragraph = " ".join(inspect.cleandoc(text).split("\n\n", 1)[0].split())
    return re.split(r"(?<=[.!?])\s", paragraph, maxsplit=1)[0]


def main() -> None:
    """Entry point: HarnessError (bad config, bad input) is one clear line and exit 2."""
    try:
        command()()
    except HarnessError as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
