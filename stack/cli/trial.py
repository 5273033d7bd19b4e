"""``harnessrl trial run``: one trial end to end.

This is a composition root (services never import each other; the CLI may):
it starts (``stack.embedded.model_stack``), in this process and on 127.0.0.1
free ports, the capture store
(embedded) and, when the harness talks to a model, the rollout gateway with
the chosen engine and the proxy (TCP plus a Unix socket for the sandbox);
then runs the trial in the local sandbox through their public clients, and
prints the result. Everything it started is stopped before it exits.

What it captured is kept: the trial is a run directory of its own,
``$HARNESSRL_RUNS_DIR/<trial id>`` (default ``$HARNESSRL_HOME/runs``) with its
``run.json`` (``kind = "trial"``), the embedded capture store and the artifacts,
and the capture's run id is the trial id. ``harnessrl capture export --trial ID``
and the dashboard (``/trials/<id>``) find it with no store flags.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from harnessrl import paths
from stack.cli.common import ConfigOption

app = typer.Typer(help="Run single trials end to end.", no_args_is_help=True)


class TrialRunInfo:
    """``run.json`` of a single trial's run directory, in the shape the dashboard
    reads (``services/dashboard/rundir.py``); written atomically."""

    def __init__(self, run_dir: Path, trial_id: str, harness: str, engine: str | None, model: str | None) -> None:
        self.path = run_dir / "run.json"
        self.fields: dict[str, Any] = {
            "run_id": trial_id,
            "kind": "trial",
            "created_at": time.time(),
            "group_size": 1,
            "harness": harness,
            "engine": engine,
            "model": model,
            "capture": {"backend": "embedded", "dir": "capture"},
            "pid": os.getpid(),
        }

    def write(self, status: str, **extra: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fields |= {"status": status, "updated_at": time.time(), **extra}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: v for k, v in self.fields.items() if v is not None}, indent=1))
        os.replace(tmp, self.path)


async def run_trial(
    *,
    task: Path,
    harness: str,
    engine: str | None,
    agent_script: Path | None,
    config: Path | None,
    model: str | None,
    max_turns: int,
) -> dict[str, Any]:
    from harnessrl.config import load_section
    from services.sandbox.factory import build_runner
    from services.sandbox.harnesses import ModelAccess, get_harness
    from services.sandbox.lifecycle import TrialSpec
    from services.sandbox.settings import Settings
    from stack.embedded import model_stack

    adapter = get_harness(harness)
    if engine is None and adapter.model_access == ModelAccess.REQUIRED:
        engine = "local"
    options = {"script_path": str(agent_script)} if agent_script else {}
    trial_id = f"trial-{uuid.uuid4().hex[:12]}"
    run_dir = paths.runs_dir() / trial_id
    info = TrialRunInfo(run_dir, trial_id, harness, engine, model)
    spec = TrialSpec(
        trial_id=trial_id,
        run_id=trial_id,
        group_id=trial_id,
        task_path=str(task),
        harness=harness,
        group_size=1,
        harness_options=options,
        model=model or "",
        max_turns=max_turns,
    )
    info.write("running")
    # Sockets stay in a short temporary directory (a Unix socket path has 108 bytes at most).
    with tempfile.TemporaryDirectory(prefix="hrl-trial-") as tmp:
        try:
            async with model_stack(engine, Path(tmp), model, capture_dir=run_dir / "capture") as ends:
                overrides: dict[str, Any] = {"capture_target": ends.capture_target}
                overrides["artifacts_dir"] = run_dir / "artifacts"
                if ends.proxy_url:
                    overrides |= {"proxy_url": ends.proxy_url, "proxy_admin_token": ends.admin_token}
                    overrides["proxy_uds_path"] = ends.proxy_uds
                settings = load_section(Settings, config, "sandbox", overrides)
                runner = build_runner(settings)
                outcome = await runner.run(spec)
                await runner.finalize(spec, outcome)
        except BaseException as e:
            info.write("failed", error=f"{type(e).__name__}: {e}")
            raise
    info.write("done", termination_reason=outcome.termination_reason.value, reward=outcome.reward)
    return {
        "trial_id": spec.trial_id,
        "run_dir": str(run_dir),
        "task_id": outcome.task_id,
        "harness": harness,
        "engine": engine,
        "reward": outcome.reward,
        "termination_reason": outcome.termination_reason.value,
        "timings": outcome.timings.model_dump(),
        "num_segments": outcome.num_segments,
        "harness_exit_code": outcome.harness_exit_code,
        "tamper_events": outcome.tamper_events,
        "events": outcome.events,
        "error": outcome.error,
        "artifacts_dir": outcome.artifacts_dir,
    }


@app.command()
def run(
    task: Annotated[Path, typer.Option(help="Task directory (Harbor format).")],
    harness: Annotated[str, typer.Option(help="claude-code, opencode, codex, mini-swe-agent, openhands-sdk, shell...")],
    engine: Annotated[
        str | None,
        typer.Option(help="local | vllm | scripted:FILE | module:Class (default local for model harnesses)."),
    ] = None,
    agent_script: Annotated[Path | None, typer.Option(help="Script the 'shell' harness runs as the agent.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name the harness is told to use.")] = None,
    max_turns: Annotated[int, typer.Option(min=0, help="Turn limit (0: the harness's own).")] = 0,
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON only.")] = False,
) -> None:
    """Run one trial and print trial_id, reward, termination_reason, timings, captured segments."""
    from harnessrl.errors import InvalidArgument
    from services.sandbox.tasks import load_task

    load_task(task)  # a typo is an error here, not a trial that fails its setup
    if agent_script is not None and not agent_script.is_file():
        raise InvalidArgument(f"--agent-script {agent_script}: not a file")
    if harness == "shell" and agent_script is None:
        raise InvalidArgument("--harness shell needs --agent-script FILE")
    result = asyncio.run(
        run_trial(
            task=task.resolve(),
            harness=harness,
            engine=engine,
            agent_script=agent_script.resolve() if agent_script else None,
            config=config,
            model=model,
            max_turns=max_turns,
        )
    )
    if as_json:
        typer.echo(json.dumps(result))
        return
    for key in ("trial_id", "task_id", "harness", "reward", "termination_reason", "num_segments", "error"):
        typer.echo(f"{key:20} {result[key]}")
    for phase, seconds in result["timings"].items():
        typer.echo(f"{phase:20} {seconds:.3f}")
    typer.echo(f"{'run_dir':20} {result['run_dir']}")
    trial_id = result["trial_id"]
    typer.echo(f"export it:  harnessrl capture export --trial {trial_id} --out {trial_id}.jsonl")
    typer.echo(f"see it:     harnessrl dashboard serve, then /trials/{trial_id}")
