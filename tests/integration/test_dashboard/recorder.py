"""Records a real run directory for the dashboard's tests.

Real trials: the sandbox's TrialRunner (local bubblewrap backend) runs a small
agent (a shell harness speaking OpenAI chat with a bash tool) against the real
proxy; the proxy renders with the real tokenizer and asks the real gateway,
whose scripted engine plays one of several policies ("behaviours"); the real
verifier writes the reward; the real embedded capture store (in the run's
``capture/``) receives every segment over gRPC and the finalization. One
gateway + proxy per behaviour, all writing into the same capture store.

The trainer is not run (it takes ~30 s/step on CPU): ``metrics.jsonl`` is
written in the trainer's format (the names of its ``StepResult.metrics``) from
the recorded trajectories (reward, termination counts, group outcomes, tokens)
plus agreement/loss values a trainer would report. Replace by a run of
``harnessrl run`` once it exists.

Design of the recorded run (G = 3, two tasks, three enqueue steps):
step 0: hello [explore, malformed, solve]  greet [explore, explore, malformed]
step 1: hello [solve, solve, explore]      greet [solve, explore, malformed]
step 2: hello [solve, broken, broken]      greet [solve, solve, broken]
so step 2 has an infrastructure spike (engine errors) and a turn collapse, and
train/inference agreement drops at the last trainer step. The greet solver also plants
a ``conftest.py`` (the sandbox's runner guard reverts it: a tamper event) and a module
that reaches for ``gc.get_objects`` (the detector flags it: a suspicious event), so the
integrity panel has real counts (steps 0, 1, 2: 0, 1, 2 trials).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from harnessrl import telemetry
from harnessrl.localservers import free_port
from harnessrl.paths import default_model_dir
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2, capture_pb2_grpc, records_pb2, sandbox_pb2, sandbox_pb2_grpc
from tests.sandbox_support import make_task, settings_for

RUN_ID = "rec-1"
EVAL_RUN_ID = f"{RUN_ID}-eval"
G = 3

AGENT = r"""set -e
python3 - <<'PY'
import json, os, subprocess, urllib.request

base, key, model = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["HARNESSRL_MODEL"]
tools = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command in /app.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
         {"type": "function", "function": {"name": "write_file", "description": "Write a file under /app.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}}]


def chat(messages, tools=None):
    body = json.dumps({"model": model, "messages": messages, **({"tools": tools} if tools else {})}).encode()
    req = urllib.request.Request(f"{base}/chat/completions", data=body,
                                 headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]


# A side call first, as harnesses do (a session title): its own thread, no tools.
chat([{"role": "system", "content": "Write a three-word title for this task."},
      {"role": "user", "content": os.environ["HARNESSRL_INSTRUCTION"]}])
messages = [{"role": "system", "content": "You are a careful coding agent. Use the bash tool."},
            {"role": "user", "content": os.environ["HARNESSRL_INSTRUCTION"]}]
for turn in range(8):
    message = chat(messages, tools)
    messages.append(message)
    calls = message.get("tool_calls") or []
    if not calls:
        break
    for call in calls:
        args = json.loads(call["function"]["arguments"])
        if call["function"]["name"] == "write_file":
            with open(os.path.join("/app", args["path"]), "w") as f:
                f.write(args["content"])
            output = f"wrote {len(args['content'])} bytes to {args['path']}"
        else:
            run = subprocess.run(["bash", "-c", args["command"]], capture_output=True, text=True, cwd="/app")
            output = (run.stdout + run.stderr)[-2000:]
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
PY
"""


def bash(command: str) -> dict[str, Any]:
    return {"name": "bash", "arguments": {"command": command}}


def write_file(path: str, content: str) -> dict[str, Any]:
    return {"name": "write_file", "arguments": {"path": path, "content": content}}


BEHAVIOURS: dict[str, list[dict[str, Any]]] = {
    "solve_hello": [
        {"content": "I will create the file.", "tool_calls": [bash("echo hello > hello.txt")]},
        {"content": "Done: hello.txt holds hello."},
    ],
    "solve_greet": [
        {
            "content": "Writing greet.txt.",
            "tool_calls": [
                write_file("greet.txt", "hi\n"),
                write_file("conftest.py", "collect_ignore = []\n"),
                write_file("speedup.py", "import gc\n\nLIVE = len(gc.get_objects())\n"),
            ],
        },
        {"content": "Done."},
    ],
    "explore": [
        {"content": "Let me look around.", "tool_calls": [bash("ls -la")]},
        {"content": "Reading the readme.", "tool_calls": [bash("cat README.md")]},
        {"content": "Where am I?", "tool_calls": [bash("pwd")]},
        {"content": "I am not sure what to do. Stopping."},
    ],
    "malformed": [{"content": '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>'}],
}
PLAN: dict[int, dict[str, list[str]]] = {
    0: {"hello": ["explore", "malformed", "solve_hello"], "greet": ["explore", "explore", "malformed"]},
    1: {"hello": ["solve_hello", "solve_hello", "explore"], "greet": ["solve_greet", "explore", "malformed"]},
    2: {"hello": ["solve_hello", "broken", "broken"], "greet": ["solve_greet", "solve_greet", "broken"]},
}
# Held-out evaluations (run "rec-1-eval", as stack/evaluate.py writes them): k = 2 per
# task before training (step 0) and after its last step (3), and their eval.jsonl rows.
EVAL_PLAN: dict[int, dict[str, list[str]]] = {
    0: {"hello": ["explore", "malformed"], "greet": ["explore", "malformed"]},
    3: {"hello": ["solve_hello", "solve_hello"], "greet": ["solve_greet", "explore"]},
}
TITLE = [{"content": "Create the file"}]  # the side thread's reply (every other thread than main)
GREET_TEST = """#!/bin/bash
if [ "$(cat /app/greet.txt 2>/dev/null)" = "hi" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
AGREEMENT = {1: 0.99985, 2: 0.99979, 3: 0.962}  # the last step's drop is the planted anomaly


@dataclass
class Recorded:
    run_dir: Path
    trials: list[str]
    engine_logs: dict[str, Path]


@contextlib.asynccontextmanager
async def _stack(tmp: Path, store: Path) -> AsyncIterator[tuple[Any, dict[str, tuple[Any, Any | None]]]]:
    """One capture store; per behaviour a gateway (scripted) and a proxy; "broken" has a dead gateway."""
    from services.capture_store.server import create_server as create_capture
    from services.capture_store.settings import Settings as CaptureSettings
    from services.gateway.server import create_server as create_gateway
    from services.gateway.settings import Settings as GatewaySettings
    from services.proxy.server import start as start_proxy
    from services.proxy.settings import Settings as ProxySettings

    capture = await create_capture(CaptureSettings.model_validate({"store_dir": store, "fsync": False}))
    stacks: dict[str, tuple[Any, Any | None]] = {}
    try:
        for name, turns in [*BEHAVIOURS.items(), ("broken", None)]:
            gateway = None
            target = f"127.0.0.1:{free_port()}"  # nothing listens there: the engine fails
            if turns is not None:
                script = tmp / f"{name}.json"
                script.write_text(json.dumps({"context_window": 8192, "threads": {"main": turns, "*": TITLE}}))
                gateway = await create_gateway(
                    GatewaySettings.model_validate(
                        {"engine": f"scripted:{script}", "scripted_log_path": tmp / f"{name}.engine.jsonl"}
                    )
                )
                target = f"127.0.0.1:{gateway.port}"
            proxy = await start_proxy(
                ProxySettings.model_validate(
                    {
                        "gateway_target": target,
                        "capture_target": f"127.0.0.1:{capture.port}",
                        "admin_token": "admin-secret",
                        "uds_path": tmp / f"{name}.sock",
                        "context_window": 8192,
                    }
                )
            )
            stacks[name] = (proxy, gateway)
        yield capture, stacks
    finally:
        for proxy, gateway in stacks.values():
            await proxy.stop()
            if gateway is not None:
                await gateway.stop(0)
        await capture.stop(0)


async def record(root: Path) -> Recorded:
    """Runs the planned trials and writes ``root/rec-1`` (run.json, config.toml, metrics.jsonl, capture/).

    As the trainer does: per step a ``trainer.step`` span, the trials submitted over the
    Sandbox gRPC API (one sandbox server with its in-process queue and worker per
    behaviour, each pointed at that behaviour's proxy), then wait until they are done."""
    from services.sandbox.server import create_sandbox_server

    _trace()
    run_dir = root / RUN_ID
    work = root / "work"
    tasks = {
        "hello": make_task(work / "tasks", "hello"),
        "greet": make_task(work / "tasks", "greet", instruction="Write hi to greet.txt.", test_sh=GREET_TEST),
    }
    run_dir.mkdir(parents=True)
    started = time.time()
    trials: list[str] = []
    metrics: list[dict[str, Any]] = []
    async with _stack(work, run_dir / "capture") as (capture, stacks):
        target = f"127.0.0.1:{capture.port}"
        sandboxes = {}
        for name, (proxy, _) in stacks.items():
            settings = settings_for(
                work / name,
                proxy_url=proxy.url,
                proxy_admin_token="admin-secret",
                proxy_uds_path=proxy.settings.uds_path,
                capture_target=target,
                queue_url="memory://",
                concurrency=6,
            )
            sandboxes[name] = await create_sandbox_server(settings)

        def plan(run_id: str, prefix: str, step: int, groups: dict[str, list[str]]) -> list[tuple[int, Any]]:
            specs = []
            for task, behaviours in groups.items():
                group_id = f"{prefix}{step}-{task}"
                for i, behaviour in enumerate(behaviours):
                    spec = sandbox_pb2.TrialSpec(
                        trial_id=f"{group_id}-{i}",
                        run_id=run_id,
                        task_path=str(tasks[task]),
                        task_id=task,
                        group_id=group_id,
                        group_size=len(behaviours),
                        step=step,
                        harness="shell",
                        harness_options={"script": AGENT},
                        model=default_model_dir().name,
                        policy_version=step,
                    )
                    specs.append((sandboxes[behaviour].port, spec))
            return specs

        try:
            for step, groups in PLAN.items():
                specs = plan(RUN_ID, "s", step, groups)
                trials += [spec.trial_id for _, spec in specs]
                await _submit_step(step, specs)
                metrics.append(await _step_metrics(target, step))
            eval_rows = []
            for step, groups in EVAL_PLAN.items():
                await _submit_step(step, plan(EVAL_RUN_ID, "eval-s", step, groups))
                eval_rows += await _eval_rows(target, step)
        finally:
            for sandbox in sandboxes.values():
                await sandbox.stop(0)
    _write_run_files(run_dir, started, metrics)
    (run_dir / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eval_rows))
    return Recorded(run_dir, trials, {n: work / f"{n}.engine.jsonl" for n in BEHAVIOURS})


class _Discard(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


_tracing: list[_Discard] = []


def _trace() -> None:
    """Spans are recorded only while something exports them (harnessrl.telemetry), and a
    trajectory carries its trace id only then: as a traced deployment, export them (nowhere)."""
    if not _tracing:
        _tracing.append(_Discard())
        telemetry.add_exporter(_tracing[0])


async def _submit_step(step: int, specs: list[tuple[int, Any]]) -> None:
    """One trainer step: each trial submitted in its own trace (linked to the step's span), then wait."""
    tracer = telemetry.tracer(__name__, "trainer")
    with tracer.start_as_current_span("trainer.step", attributes={"harnessrl.run_id": RUN_ID, "harnessrl.step": step}):
        for port, spec in specs:
            with telemetry.trial_trace("trainer.enqueue", "trainer", telemetry.trial_attributes(spec)):
                async with connect(f"127.0.0.1:{port}", service="trainer") as channel:
                    stub = sandbox_pb2_grpc.SandboxStub(channel)
                    await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec))

    async def wait(port: int, trial_id: str) -> None:
        async with connect(f"127.0.0.1:{port}") as channel:
            watch = sandbox_pb2_grpc.SandboxStub(channel).WatchTrials(
                sandbox_pb2.WatchTrialsRequest(trial_ids=[trial_id]), timeout=300
            )
            async for status in watch:
                if status.state == sandbox_pb2.TRIAL_STATE_DONE:
                    return

    await asyncio.gather(*(wait(port, spec.trial_id) for port, spec in specs))


async def _eval_rows(target: str, step: int) -> list[dict[str, Any]]:
    """eval.jsonl's rows of one evaluation, from the captured rewards (stack/evaluate.py's estimators)."""
    from stack.evaluate import overall_row, pass_at, pass_hat

    async with connect(target) as channel:
        store = capture_pb2_grpc.CaptureStoreStub(channel)
        listed = await store.ListTrajectories(capture_pb2.ListTrajectoriesRequest(run_id=EVAL_RUN_ID, step=step))
    rows = []
    for task in sorted({t.task_id for t in listed.trajectories}):
        mine = [t for t in listed.trajectories if t.task_id == task]
        valid = [t for t in mine if t.termination_reason == records_pb2.TERMINATION_REASON_COMPLETED]
        n, c = len(valid), sum(t.has_reward and t.reward >= 1 for t in valid)
        row: dict[str, Any] = {"step": step, "task_id": task, "k": 2, "n": n, "successes": c}
        row |= {"infra_failures": len(mine) - n, "pass@1": pass_at(n, c, 1), "pass^1": pass_hat(n, c, 1)}
        rows.append(row | {"pass@2": pass_at(n, c, 2), "pass^2": pass_hat(n, c, 2)})
    return [*rows, overall_row(step, 2, rows)]


async def _step_metrics(target: str, step: int) -> dict[str, Any]:
    """The trainer step that consumes the groups enqueued at ``step``: counts from the store."""
    async with connect(target) as channel:
        store = capture_pb2_grpc.CaptureStoreStub(channel)
        listed = await store.ListTrajectories(capture_pb2.ListTrajectoriesRequest(run_id=RUN_ID, step=step))
        full = [
            await store.GetTrajectory(
                capture_pb2.GetTrajectoryRequest(run_id=RUN_ID, trial_id=t.trial_id, include_tokens=True)
            )
            for t in listed.trajectories
        ]
    counts: Counter[str] = Counter()
    rewards, tokens = [], 0
    for traj in full:
        reason = records_pb2.TerminationReason.Name(traj.termination_reason).removeprefix("TERMINATION_REASON_")
        counts[f"termination/{reason.lower()}"] += 1
        if traj.termination_reason in (records_pb2.TERMINATION_REASON_COMPLETED,):
            rewards.append(traj.reward)
            tokens += sum(int(sum(seg.response.mask)) for seg in traj.segments)
        else:
            counts["trajectories/invalid"] += 1
    for task in {t.task_id for t in full}:
        wins = sum(t.reward >= 1 for t in full if t.task_id == task and t.termination_reason == 1)
        valid = sum(t.task_id == task and t.termination_reason == 1 for t in full)
        counts[f"groups/successes_{wins}_of_{valid}"] += 1
        counts["groups/zero_variance"] += wins in (0, valid)
    trainer_step = step + 1
    values = {k: float(v) for k, v in counts.items()} | {
        "reward/mean": sum(rewards) / max(1, len(rewards)),
        "batch/trajectories": float(len(rewards)),
        "batch/policy_tokens": float(tokens),
        "agreement/pearson": AGREEMENT[trainer_step],
        # Tiny, as on a real CPU run: an axis whose labels Chart.js writes as 4.50000000E-6.
        "agreement/mean_abs_diff": {1: 4.5e-6, 2: 6.1e-6, 3: 9.3e-6}[trainer_step],
        "agreement/max_abs_diff": round(1 - AGREEMENT[trainer_step], 5) * 40,
        "agreement/log_ratio_q01": -(1 - AGREEMENT[trainer_step]) * 20,
        "agreement/log_ratio_q99": (1 - AGREEMENT[trainer_step]) * 25,
        "agreement/ess": AGREEMENT[trainer_step] ** 4,
        "loss/pg_clipfrac": 0.02 * trainer_step,
        "loss/ppo_kl": 0.001 * trainer_step,
        "loss/entropy": 1.9 - 0.2 * trainer_step,
        "optim/grad_norm": 0.8 + 0.3 * trainer_step,
        "step/seconds": 30.0 + trainer_step,
        "step/policy_version": float(trainer_step),
        "staleness/mean": 0.0,
        "staleness/max": 0.0,
        "trainer/idle_fraction": 0.4,
    }
    return {"step": trainer_step, "wall_time": time.time(), "values": values}


def _write_run_files(run_dir: Path, started: float, metrics: list[dict[str, Any]]) -> None:
    info = {
        "run_id": RUN_ID,
        "created_at": started,
        "status": "done",
        "group_size": G,
        "batch_groups": 2,
        "model": default_model_dir().name,
        "harness": "shell",
        "engine": "scripted",
        "steps_planned": len(PLAN),
        "capture": {"backend": "embedded", "dir": "capture"},
    }
    (run_dir / "run.json").write_text(json.dumps(info, indent=1))
    (run_dir / "config.toml").write_text(
        f'[run]\nrun_id = "{RUN_ID}"\ngroup_size = {G}\nbatch_groups = 2\nharness = "shell"\n\n'
        '[proxy]\ntool_parser = "hermes"\n\n[trainer.algo]\nadv_estimator = "grpo"\nsuccess_threshold = 1.0\n'
    )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))


# -- the other kinds of run directory the runs list shows --------------------------
EVAL_ONLY_ID = "ev-1"


@dataclass
class Extras:
    """A single trial's run directory and an evaluation-only one, beside the training run."""

    trial_dir: Path
    eval_dir: Path


async def record_extras(root: Path, recorded: Recorded) -> Extras:
    """``harnessrl trial run`` itself (the real CLI, scripted engine) makes the trial's
    directory; the evaluation's is written as ``harnessrl eval`` writes one for a config
    that never trained (run.json ``steps_planned = 0``, eval.jsonl, an embedded store)."""
    work = root / "extras-work"
    trial_dir = await asyncio.to_thread(_trial_run, root / "runs", work)
    return Extras(trial_dir, await _eval_only_run(root / "runs", recorded))


def _trial_run(runs: Path, work: Path) -> Path:
    import os
    import subprocess
    import sys

    from harnessrl.paths import PROJECT_ROOT

    task = make_task(work / "tasks", "hello")
    script = work / "solve.json"
    script.write_text(json.dumps({"context_window": 8192, "threads": {"main": BEHAVIOURS["solve_hello"], "*": TITLE}}))
    (work / "agent.sh").write_text(AGENT)
    env = {
        **os.environ,
        "HARNESSRL_RUNS_DIR": str(runs),
        "HARNESSRL_SANDBOX_WORK_DIR": str(work / "trials"),
        "HARNESSRL_SANDBOX_CACHE_DIR": str(work / "cache"),
        "HARNESSRL_SANDBOX_LOCAL__VERIFY_NETWORK": "none",  # the task's verifier needs no network
    }
    args = ["--task", str(task), "--harness", "shell", "--agent-script", str(work / "agent.sh")]
    args += ["--engine", f"scripted:{script}", "--model", default_model_dir().name, "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "stack.cli", "trial", "run", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out.returncode != 0:
        raise RuntimeError(f"harnessrl trial run failed ({out.returncode}): {out.stderr[-3000:]}")
    return Path(json.loads(out.stdout)["run_dir"])


async def _eval_only_run(runs: Path, recorded: Recorded) -> Path:
    from services.capture_store.server import create_server as create_capture
    from services.capture_store.settings import Settings as CaptureSettings

    run_dir = runs / EVAL_ONLY_ID
    run_dir.mkdir(parents=True)
    # The store holds no trajectory here: the runs list reads only run.json and eval.jsonl.
    capture = await create_capture(CaptureSettings.model_validate({"store_dir": run_dir / "capture", "fsync": False}))
    await capture.stop(0)
    rows = [json.loads(line) for line in (recorded.run_dir / "eval.jsonl").read_text().splitlines()]
    base = [r | {"checkpoint": "base"} for r in rows if r["step"] == 0]
    (run_dir / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in base))
    info = {
        "run_id": EVAL_ONLY_ID,
        "created_at": time.time(),
        "status": "done",
        "group_size": G,
        "model": default_model_dir().name,
        "harness": "shell",
        "engine": "scripted",
        "steps_planned": 0,
        "capture": {"backend": "embedded", "dir": "capture"},
    }
    (run_dir / "run.json").write_text(json.dumps(info, indent=1))
    (run_dir / "config.toml").write_text(f'[run]\nrun_id = "{EVAL_ONLY_ID}"\nsteps = 0\nharness = "shell"\n')
    return run_dir
