"""``harnessrl bench e2e --sandbox``: the same load through real bubblewrap
sandboxes. Trials are submitted to the sandbox service (Redis queue) and run by
``harnessrl sandbox worker`` processes (at most 256 trials each); inside every
sandbox the ``shell`` harness runs a small Python agent that makes ``turns``
chat completions through the proxy (via the worker's relay, the sandbox's only
way out) and records each call's latency in its agent logs. The worker then
verifies, closes the trial at the proxy and finalizes it in the capture store,
exactly as in a training run.

Lost records are counted the same way as in ``loadtest``: per trial, turns the
proxy answered (the agent's own count) versus turns in the capture store, and
trials not finalized.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path

import services.sandbox
from harnessrl.rpc import connect
from harnessrl.v1 import capture_pb2_grpc, records_pb2, sandbox_pb2, sandbox_pb2_grpc
from services.sandbox.common.settings import Settings as SandboxSettings
from stack.bench.loadtest import RUN, LoadConfig, LoadResult, bench_stack, phases, tally

TASK = Path(services.sandbox.__file__).parent / "examples" / "hello"
PER_WORKER = 256  # the sandbox service's bound on one worker's concurrency

AGENT = """set -u
python3 - <<'PY'
import json, os, time, urllib.request

base, key, model = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["HARNESSRL_MODEL"]
tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix it."}]
latencies = []
for _ in range(int(os.environ.get("LOAD_TURNS", "TURNS"))):
    body = json.dumps({"model": model, "tools": tools, "messages": messages}).encode()
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    request = urllib.request.Request(f"{base}/chat/completions", data=body, headers=headers)
    started = time.perf_counter()
    message = json.load(urllib.request.urlopen(request, timeout=600))["choices"][0]["message"]
    latencies.append(time.perf_counter() - started)
    json.dump(latencies, open("/logs/agent/latency.json", "w"))
    messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "a.txt"}]
PY
echo hello > hello.txt
"""


async def _start(root: Path, cfg: LoadConfig, exits: AsyncExitStack) -> tuple[dict[str, int], int]:
    """Gateway, capture store, proxy, sandbox service and its workers; returns the ports and worker count."""
    in_flight = cfg.concurrency or cfg.trials
    workers = math.ceil(in_flight / PER_WORKER)
    dirs = {"work_dir": root / "trials", "cache_dir": root / "cache", "artifacts_dir": root / "artifacts"}
    sandbox = SandboxSettings.model_validate(
        {"concurrency": math.ceil(in_flight / workers), "default_agent_timeout_s": 1800, "lease_s": 120} | dirs
    )
    up = await bench_stack(root, cfg, sandbox=sandbox, workers=workers).start()
    exits.callback(up.stop)
    return up.ports, workers


async def measure_sandboxed(ports: dict[str, int], root: Path, cfg: LoadConfig, label: str, tag: str) -> LoadResult:
    """Submits ``cfg.trials`` trials (at most ``cfg.concurrency`` unfinished at once) and waits for all."""
    async with (
        connect(f"127.0.0.1:{ports['sandbox']}", tracing=False) as sch,
        connect(f"127.0.0.1:{ports['capture']}", tracing=False) as cch,
    ):
        stub = sandbox_pb2_grpc.SandboxStub(sch)
        ids = [f"{tag}-{i}-{uuid.uuid4().hex[:6]}" for i in range(cfg.trials)]
        limit = asyncio.Semaphore(cfg.concurrency or cfg.trials)
        watch = stub.WatchTrials(sandbox_pb2.WatchTrialsRequest(run_id=RUN))
        watcher = asyncio.ensure_future(_collect_done(watch, set(ids), limit))
        started = time.perf_counter()
        for i, trial in enumerate(ids):
            await limit.acquire()
            await stub.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=_spec(cfg, tag, i, trial)), timeout=60)
        statuses = await watcher
        seconds = time.perf_counter() - started
        watch.cancel()
        answered = {t: _latencies(root, t) for t in ids}
        errors = [f"{s.trial_id}: {s.termination_reason} {s.error[:200]}" for s in statuses.values() if s.error]
        errors += [
            f"{t}: {len(lat)} of {cfg.turns} turns answered" for t, lat in answered.items() if len(lat) != cfg.turns
        ]
        completed = records_pb2.TERMINATION_REASON_COMPLETED
        failed = sum(s.termination_reason != completed for s in statuses.values())
        store = capture_pb2_grpc.CaptureStoreStub(cch)
        return await tally(store, cfg, (label, tag), seconds, answered, errors, failed)


def _spec(cfg: LoadConfig, tag: str, index: int, trial: str) -> sandbox_pb2.TrialSpec:
    return sandbox_pb2.TrialSpec(
        trial_id=trial,
        run_id=RUN,
        task_path=str(TASK),
        group_id=f"{tag}-g{index // cfg.group_size}",
        group_size=cfg.group_size,
        harness="shell",
        harness_options={"script": AGENT.replace("TURNS", str(cfg.turns))},
        model=cfg.model_dir.name,
    )


async def _collect_done(
    watch: AsyncIterator[sandbox_pb2.TrialStatus], pending: set[str], limit: asyncio.Semaphore
) -> dict[str, sandbox_pb2.TrialStatus]:
    """Follows the run's trial events; each trial that ends frees a slot."""
    done: dict[str, sandbox_pb2.TrialStatus] = {}
    async for status in watch:
        if status.trial_id in pending and status.state == sandbox_pb2.TRIAL_STATE_DONE:
            pending.discard(status.trial_id)
            done[status.trial_id] = status
            limit.release()
            if not pending:
                return done
    raise RuntimeError(f"WatchTrials ended with {len(pending)} trials not done")


def _latencies(root: Path, trial: str) -> list[float]:
    path = root / "artifacts" / RUN / trial / "agent" / "latency.json"
    return [float(x) for x in json.loads(path.read_text())] if path.exists() else []


async def run_sandboxed(root: Path, cfg: LoadConfig, exits: AsyncExitStack, progress) -> list[LoadResult]:  # type: ignore[no-untyped-def]
    ports, workers = await _start(root, cfg, exits)
    flight = f"{cfg.trials} sandboxed trials, {cfg.concurrency or cfg.trials} in flight on {workers} worker(s)"
    lines = ("baseline: one sandboxed trial at a time", flight, f"{cfg.trials} in sandboxes")
    return await phases(partial(measure_sandboxed, ports, root), cfg, progress, lines)
