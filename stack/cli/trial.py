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
and the dashboard (``/trials/<id>``) find it with no store flags; ``run.json``
names the model and the tokenizer folder, so the dashboard decodes the transcript.

What it runs with is resolved by ``stack.trialconfig``: flags, then ``--config``'s
``[run]`` (trial fields only) and ``[sandbox] [proxy] [gateway]``, then, for
mini-swe-agent with the default model, the quickstart's settings.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from stack.trialconfig import TrialConfig

app = typer.Typer(help="Run single trials end to end.", no_args_is_help=True)


class TrialRunInfo:
    """``run.json`` of a single trial's run directory, in the shape the dashboard
    reads (``services/dashboard/rundir.py``); written atomically. ``model`` and
    ``tokenizer`` (the folder the proxy rendered and tokenized with) let the
    dashboard decode the captured tokens."""

    def __init__(self, run_dir: Path, trial_id: str, cfg: TrialConfig) -> None:
        self.path = run_dir / "run.json"
        served = cfg.engine is not None
        self.fields: dict[str, Any] = {
            "run_id": trial_id,
            "kind": "trial",
            "created_at": time.time(),
            "group_size": 1,
            "harness": cfg.harness,
            "engine": cfg.engine,
            "model": (cfg.model or cfg.model_dir.name) if served else None,
            "tokenizer": str(cfg.model_dir) if served else None,
            "temperature": cfg.temperature if served else None,
            "harness_options": cfg.harness_options or None,
            "capture": {"backend": "embedded", "dir": "capture"},
            "pid": os.getpid(),
        }

    def write(self, status: str, **extra: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fields |= {"status": status, "updated_at": time.time(), **extra}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: v for k, v in self.fields.items() if v is not None}, indent=1))
        os.replace(tmp, self.path)


async def run_trial(*, task: Path, cfg: TrialConfig, agent_script: Path | None) -> dict[str, Any]:
    from pydantic import SecretStr

    from services.sandbox.factory import build_runner
    from services.sandbox.harnesses import ModelAccess, get_harness
    from services.sandbox.trial.lifecycle import TrialSpec
    from stack.embedded import model_stack

    if cfg.engine is None and get_harness(cfg.harness).model_access == ModelAccess.REQUIRED:
        cfg.engine = "local"
    options = dict(cfg.harness_options)
    if agent_script:
        options["script_path"] = str(agent_script)
    trial_id = f"trial-{uuid.uuid4().hex[:12]}"
    run_dir = cfg.runs_dir / trial_id
    info = TrialRunInfo(run_dir, trial_id, cfg)
    spec = TrialSpec(
        trial_id=trial_id,
        run_id=trial_id,
        group_id=trial_id,
        task_path=str(task),
        harness=cfg.harness,
        group_size=1,
        harness_options=options,
        model=cfg.model or "",
        max_turns=cfg.max_turns,
        agent_timeout_s=cfg.agent_timeout_s,
        verifier_timeout_s=cfg.verifier_timeout_s,
        reward_key=cfg.reward_key or "",
        reward_weights=cfg.reward_weights or {},
    )
    info.write("running")
    # Sockets stay in a short temporary directory (a Unix socket path has 108 bytes at most).
    with tempfile.TemporaryDirectory(prefix="hrl-trial-") as tmp:
        try:
            async with model_stack(
                cfg.engine,
                Path(tmp),
                cfg.model,
                capture_dir=run_dir / "capture",
                proxy_fields=cfg.proxy_fields,
                gateway_fields=cfg.gateway_fields,
            ) as ends:
                update: dict[str, Any] = {
                    "capture_target": ends.capture_target,
                    "artifacts_dir": run_dir / "artifacts",  # this trial's own folder, not a root of runs
                    "artifacts_flat": True,
                }
                if ends.proxy_url:
                    update |= {"proxy_url": ends.proxy_url, "proxy_admin_token": SecretStr(ends.admin_token or "")}
                    update["proxy_uds_path"] = ends.proxy_uds
                runner = build_runner(cfg.sandbox.model_copy(update=update))
                try:
                    outcome = await runner.run(spec)
                    await runner.finalize(spec, outcome)
                finally:
                    await runner.backend.close()  # a warm pool's containers (docker) go with the process
        except BaseException as e:
            info.write("failed", error=f"{type(e).__name__}: {e}")
            raise
    info.write("done", termination_reason=outcome.termination_reason.value, reward=outcome.reward)
    return {
        "trial_id": spec.trial_id,
        "run_dir": str(run_dir),
        "task_id": outcome.task_id,
        "harness": cfg.harness,
        "engine": cfg.engine,
        "harness_options": cfg.harness_options,
        "temperature": cfg.temperature,
        "max_turns": cfg.max_turns,
        "reward": outcome.reward,
        # Every value the verifier wrote (each key of reward.json), and a multi-step task's steps.
        "rewards": outcome.rewards,
        "steps": [step.model_dump(mode="json") for step in outcome.steps],
        "termination_reason": outcome.termination_reason.value,
        "timings": outcome.timings.model_dump(),
        "num_segments": outcome.num_segments,
        "harness_exit_code": outcome.harness_exit_code,
        "tamper_events": outcome.tamper_events,
        "suspicious_events": outcome.suspicious_events,
        "events": outcome.events,
        "error": outcome.error,
        "artifacts_dir": outcome.artifacts_dir,
    }


@app.command()
def run(
    task: Annotated[Path, typer.Option(help="Task directory (Harbor format).")],
    harness: Annotated[
        str | None,
        typer.Option(
            help="claude-code, opencode, codex, mini-swe-agent, openhands-sdk, shell... (default mini-swe-agent)."
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="local | vllm | scripted:FILE | module:Class (default local for model harnesses)."),
    ] = None,
    agent_script: Annotated[Path | None, typer.Option(help="Script the 'shell' harness runs as the agent.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name the harness is told to use.")] = None,
    harness_option: Annotated[
        list[str] | None, typer.Option("--harness-option", "-o", help="KEY=VALUE passed to the harness (repeatable).")
    ] = None,
    temperature: Annotated[
        float | None, typer.Option(min=0.0, max=5.0, help="Policy sampling temperature (a run's [run] temperature).")
    ] = None,
    max_turns: Annotated[
        int | None,
        typer.Option(min=0, help="Turn limit (0: the harness's own; default 3 with the quickstart's settings)."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="TOML file: [run] fields that apply to one trial (harness, harness_options, engine, model_path, "
            "model, temperature, max_turns, agent_timeout_s, verifier_timeout_s, runs_dir, reward_key, "
            "reward_weights), [sandbox], [proxy], [gateway]; anything else is refused.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON only.")] = False,
) -> None:
    """Run one trial and print trial_id, reward, termination_reason, timings, captured segments.

    With the default model and mini-swe-agent it runs as the quickstart does (compact config,
    temperature 0.7, 3 turns) unless -o config=... says otherwise."""
    from harnessrl.errors import InvalidArgument
    from services.sandbox.task.model import load_task
    from stack.trialconfig import TrialFlags, describe, parse_options, resolve

    if not task.exists():
        raise InvalidArgument(f"--task {task}: not a directory")
    load_task(task)  # a typo is an error here, not a trial that fails its setup
    flags = TrialFlags(
        harness=harness,
        engine=engine,
        model=model,
        harness_options=parse_options(harness_option),
        temperature=temperature,
        max_turns=max_turns,
    )
    cfg = resolve(flags, config)
    if agent_script is not None and not agent_script.is_file():
        raise InvalidArgument(f"--agent-script {agent_script}: not a file")
    if cfg.harness == "shell" and agent_script is None:
        raise InvalidArgument("--harness shell needs --agent-script FILE")
    if not as_json and (note := describe(cfg)):
        typer.echo(note, err=True)
    result = asyncio.run(
        run_trial(task=task.resolve(), cfg=cfg, agent_script=agent_script.resolve() if agent_script else None)
    )
    if as_json:
        typer.echo(json.dumps(result))
        return
    for key in ("trial_id", "task_id", "harness", "reward", "termination_reason", "num_segments", "error"):
        typer.echo(f"{key:20} {result[key]}")
    if set(result["rewards"]) - {"reward"}:  # reward.json's keys, when they are more than 'reward'
        typer.echo(f"{'rewards':20} {json.dumps(result['rewards'], sort_keys=True)}")
        if result["reward"] is None and result["termination_reason"] == "completed":
            typer.echo(f"{'':20} several rewards, none named 'reward': set [run] reward_key or reward_weights to train")
    for step in result["steps"]:
        typer.echo(f"{'step ' + str(step.get('name', '')):20} {json.dumps(step.get('rewards', {}), sort_keys=True)}")
    for phase, seconds in result["timings"].items():
        typer.echo(f"{phase:20} {seconds:.3f}")
    typer.echo(f"{'run_dir':20} {result['run_dir']}")
    trial_id = result["trial_id"]
    typer.echo(f"export it:  harnessrl capture export --trial {trial_id} --out {trial_id}.jsonl")
    typer.echo(f"see it:     harnessrl dashboard serve, then /trials/{trial_id}")
