"""``harnessrl conformance``: the installed real harnesses against a real proxy
(scripted engine as the policy), one table of passed / failed / n/a cells."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harnessrl.errors import ConfigError


def conformance(
    harness: Annotated[
        list[str] | None, typer.Option("--harness", help="Harness to run (repeatable; default: all known).")
    ] = None,
    scenario: Annotated[
        list[str] | None,
        typer.Option("--scenario", help="Scenario to run (repeatable): tools, sub-agent, compaction, side calls."),
    ] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the markdown table (docs/proxy.md).")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the full report as JSON here.")] = None,
) -> None:
    """Run the installed real harnesses against a real proxy: one table of passed / failed / n/a cells.

    Cells: harness × protocol × streaming × tool calls × sub-agent × compaction × chat template, with versions."""
    from stack.conformance.matrix import COLUMNS, Cell, render_markdown, render_text, resolve_harnesses, run_matrix

    names = harness or []
    resolve_harnesses(names)  # an unknown name fails before anything starts
    columns = scenario or list(COLUMNS)
    if json_out is not None and json_out.is_dir():
        raise ConfigError(f"--json {json_out}: is a directory")

    def progress(cell: Cell) -> None:
        typer.echo(f"{cell.harness:16} {cell.scenario:11} {cell.status:7} {cell.seconds:5.1f}s", err=True)

    report = run_matrix(names, columns, progress)
    if json_out is not None:
        json_out.write_text(report.to_json() + "\n")
    typer.echo(render_markdown(report) if markdown else render_text(report))
    if any(c["status"] == "failed" for row in report.rows for c in row["cells"].values()):
        raise typer.Exit(1)
