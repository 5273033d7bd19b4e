"""``harnessrl verl``: the verl cluster path (stack/verl/prepare.py, stack/verl/README.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="Train with verl's trainer on a Ray cluster: generate what a verl run needs.", no_args_is_help=True
)


@app.command()
def prepare(
    config: Annotated[Path, typer.Option("--config", "-c", help="harnessrl run config (TOML with [run]).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the parquet, yaml, overrides and launch.sh.")],
    override: Annotated[
        list[str] | None,
        typer.Option("--override", help="Extra Hydra override KEY=VALUE for verl (repeatable; wins)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Compose verl's config with the overrides and check its schema (CPU).")
    ] = False,
    segments: Annotated[
        str,
        typer.Option(
            "--segments",
            help="last: one row per trial, verl's fully-async trainer; all: every trainable segment a row, "
            "verl's v1 trainer (main_ppo).",
        ),
    ] = "last",
) -> None:
    """Write tasks.parquet, agent_loops.yaml, overrides.txt and launch.sh for verl's fully-async
    trainer (or, with --segments all, its v1 trainer).

    Exit 0 when written (and, with --dry-run, accepted by verl's config schema),
    2 for a bad config, a bad override or one verl rejects."""
    from stack.verl import prepare as verl_prepare

    prepared = verl_prepare.prepare(config, out, list(override or []), segments)
    for name, path in prepared.files.items():
        typer.echo(f"{name}: {path}")
    typer.echo(f"{prepared.tasks} task(s); launch: {prepared.files['launch']}")
    if dry_run:
        cfg = verl_prepare.dry_run(prepared)
        rollout, trainer = cfg.actor_rollout_ref.rollout, verl_prepare.TRAINERS[prepared.segments][0]
        typer.echo(
            f"dry run ok: verl's {trainer} accepts {len(prepared.overrides)} override(s) "
            f"(agent loop {rollout.agent.default_agent_loop}, n={rollout.n}, temperature={rollout.temperature}, "
            f"adv_estimator={cfg.algorithm.adv_estimator})"
        )
