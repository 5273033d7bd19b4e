"""Chaos on the distributed setup (issue 8, reliability proof).

Real Redis (index + trial queue) and SeaweedFS S3 (segment blobs); every
service is its own process (``harnessrl <noun> serve``, ``harnessrl sandbox
worker``); trials run the ``shell`` harness in real bubblewrap sandboxes and
talk to the proxy like an unmodified harness would (retrying 5xx). The policy
is the scripted engine; the trainer is the real CPU trainer on a tiny random
Llama that shares SmolLM2's tokenizer (the policy's weights do not matter here).

While groups run, the test SIGKILLs and restarts, one at a time, the capture
store, a sandbox worker (while it holds trials), the gateway (mid-trial) and the
trainer. Then it checks:
- the trainer reaches ``max_steps`` exactly (the run completes, no step redone);
- every submitted trial is DONE in the queue with one termination reason, and
  finalized in the capture store with the same reason (none silently dropped);
- every turn the proxy acknowledged to a harness is captured exactly once: per
  trial, the captured turns equal the calls the harness saw succeed, and every
  captured response is one the engine really sampled for that trial (multiset
  inclusion against the engine's generation log: no duplicate, no invention).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from harnessrl import arrays
from harnessrl.localservers import RedisServer, S3Server, restartable_port
from harnessrl.paths import default_model_dir
from harnessrl.rpc import connect
from harnessrl.v1 import (
    capture_pb2,
    capture_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    records_pb2,
    sandbox_pb2,
    sandbox_pb2_grpc,
    trainer_pb2,
    trainer_pb2_grpc,
)
from stack.procs import ProcessStack
from tests.sandbox_support import make_task

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(not (default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared"),
]

RUN = "chaos"
G = 3  # trials per group
STEPS = 4  # trainer max_steps (one group per step)
CALLS = 3  # model calls per trial
MODEL = default_model_dir().name
TURNS = [
    {"content": "Listing.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]},
    {"content": "Reading.", "tool_calls": [{"name": "bash", "arguments": {"command": "cat README.md"}}]},
    {"content": "Done."},
]
# The harness: CALLS chat completions through the proxy, each retried on 5xx or a
# dropped connection (what real harnesses do), counting those that succeeded.
AGENT = f"""set -u
python3 - <<'PY'
import json, os, time, urllib.error, urllib.request

base, key, model = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["HARNESSRL_MODEL"]
tools = [{{"type": "function", "function": {{"name": "bash", "parameters": {{"type": "object"}}}}}}]
state = {{"ok": 0, "failures": []}}


def call(messages):
    deadline = time.time() + 120
    while True:
        body = json.dumps({{"model": model, "tools": tools, "messages": messages}}).encode()
        headers = {{"Authorization": f"Bearer {{key}}", "content-type": "application/json"}}
        request = urllib.request.Request(f"{{base}}/chat/completions", data=body, headers=headers)
        try:
            return json.load(urllib.request.urlopen(request, timeout=60))
        except urllib.error.HTTPError as e:
            state["failures"].append(e.code)
            if e.code < 500 and e.code != 429:
                raise
        except OSError as e:
            state["failures"].append(str(e)[:80])
        if time.time() > deadline:
            raise SystemExit("gave up")
        time.sleep(0.5)


messages = [{{"role": "user", "content": os.environ["HARNESSRL_INSTRUCTION"]}}]
for _ in range({CALLS}):
    message = call(messages)["choices"][0]["message"]
    state["ok"] += 1
    json.dump(state, open("/logs/agent/calls.json", "w"))
    messages.append(message)
    if message.get("tool_calls"):
        messages.append({{"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "a.txt"}})
    else:
        messages.append({{"role": "user", "content": "go on"}})
    time.sleep(1.0)  # a trial spends >= 3 s in its agent phase, so a kill can land inside it
PY
# Half the trials solve the task, so groups have reward variance.
if [ $(( $(printf %s "$HARNESSRL_TRIAL_ID" | cksum | cut -d' ' -f1) % 2 )) = 0 ]; then echo hello > hello.txt; fi
"""


def tiny_model(root: Path) -> Path:
    """A random 2-layer Llama with SmolLM2's tokenizer and chat template, in a
    folder named like SmolLM2's (so the proxy picks the same template)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = root / MODEL
    out.mkdir(parents=True)
    src = default_model_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    base = json.loads((src / "config.json").read_text())
    config = LlamaConfig(
        vocab_size=base["vocab_size"],
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=base["max_position_embeddings"],
        bos_token_id=base["bos_token_id"],
        eos_token_id=base["eos_token_id"],
        pad_token_id=base.get("pad_token_id"),
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def write_config(tmp: Path, ports: dict[str, int], redis: RedisServer, s3: S3Server, bucket: str, model: Path) -> Path:
    script = tmp / "script.json"
    script.write_text(json.dumps({"context_window": 8192, "threads": {"main": TURNS, "*": TURNS}}))
    redis_base = redis.url.rsplit("/", 1)[0]
    config = tmp / "chaos.toml"
    config.write_text(
        f"""
[gateway]
engine = "scripted:{script}"
model_path = "{model}"
scripted_log_path = "{tmp / "engine.jsonl"}"

[capture_store]
backend = "distributed"
redis_url = "{redis_base}/0"
s3_endpoint = "{s3.endpoint}"
s3_bucket = "{bucket}"
s3_access_key = "{s3.access_key}"
s3_secret_key = "{s3.secret_key}"
ready_lease_s = 5.0

[proxy]
gateway_target = "127.0.0.1:{ports["gateway"]}"
capture_target = "127.0.0.1:{ports["capture"]}"
admin_token = "chaos-admin"
model_dir = "{model}"

[sandbox]
queue_url = "{redis_base}/1"
concurrency = 3
proxy_url = "http://127.0.0.1:{ports["proxy"]}"
proxy_admin_token = "chaos-admin"
capture_target = "127.0.0.1:{ports["capture"]}"
work_dir = "{tmp / "trials"}"
cache_dir = "{tmp / "cache"}"
artifacts_dir = "{tmp / "artifacts"}"
lease_s = 6.0
heartbeat_s = 1.0
max_attempts = 3
default_agent_timeout_s = 180

[sandbox.local]
verify_network = "none"  # the chaos task's verifier needs no network (local's default refuses a public one)

[trainer]
run_id = "{RUN}"
model_path = "{model}"
output_dir = "{tmp / "trainer"}"
capture_target = "127.0.0.1:{ports["capture"]}"
gateway_target = "127.0.0.1:{ports["gateway"]}"

[trainer.optim]
lr = 1e-4
gradient_checkpointing = false

[trainer.rollout]
groups_per_step = 1
max_steps = {STEPS}
max_staleness = 1
"""
    )
    return config


def build_stack(tmp: Path, config: Path, ports: dict[str, int]) -> ProcessStack:
    env = {**os.environ, "HARNESSRL_SKIP_WARMUP": "1"}
    stack = ProcessStack(tmp / "logs", config, env)
    stack.root.mkdir(parents=True, exist_ok=True)
    stack.add_server("capture", "capture", ports["capture"])
    stack.add_server("gateway", "gateway", ports["gateway"])
    stack.add_server("proxy", "proxy", ports["proxy"])
    stack.add_server("sandbox", "sandbox", ports["sandbox"])
    for name in ("worker-1", "worker-2"):
        stack.add(name, ["sandbox", "worker", "-c", str(config), "--name", name])
    stack.add_server("trainer", "train", ports["trainer"])
    return stack


class Driver:
    """Submits groups through the sandbox service and watches trials and the trainer."""

    def __init__(self, ports: dict[str, int], task: Path) -> None:
        self.task = task
        self.sandbox = sandbox_pb2_grpc.SandboxStub(connect(f"127.0.0.1:{ports['sandbox']}"))
        self.trainer = trainer_pb2_grpc.TrainerStub(connect(f"127.0.0.1:{ports['trainer']}"))
        self.store = capture_pb2_grpc.CaptureStoreStub(connect(f"127.0.0.1:{ports['capture']}"))
        self.gateway = gateway_pb2_grpc.RolloutGatewayStub(connect(f"127.0.0.1:{ports['gateway']}"))
        self.trials: list[str] = []
        self.groups = 0

    async def submit_group(self) -> None:
        group = f"g{self.groups}"
        self.groups += 1
        for i in range(G):
            trial = f"{group}-{i}-{uuid.uuid4().hex[:6]}"
            spec = sandbox_pb2.TrialSpec(
                trial_id=trial,
                run_id=RUN,
                task_path=str(self.task),
                group_id=group,
                group_size=G,
                harness="shell",
                harness_options={"script": AGENT},
                model=MODEL,
            )
            await self.sandbox.SubmitTrial(sandbox_pb2.SubmitTrialRequest(spec=spec), timeout=30, wait_for_ready=True)
            self.trials.append(trial)

    async def status(self, trial: str) -> sandbox_pb2.TrialStatus:
        req = sandbox_pb2.GetTrialRequest(trial_id=trial)
        return await self.sandbox.GetTrial(req, timeout=30, wait_for_ready=True)

    async def wait_trial(self, predicate, what: str, timeout_s: float = 180) -> sandbox_pb2.TrialStatus:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for trial in self.trials:
                status = await self.status(trial)
                if predicate(status):
                    return status
            await asyncio.sleep(0.3)
        raise TimeoutError(f"no trial became {what}")

    async def trainer_status(self) -> trainer_pb2.TrainerStatus:
        return await self.trainer.Status(trainer_pb2.StatusRequest(), timeout=10, wait_for_ready=True)

    async def gateway_version(self) -> int:
        health = await self.gateway.Health(gateway_pb2.GatewayHealthRequest(), timeout=10, wait_for_ready=True)
        return int(health.policy_version)

    async def done_trials(self) -> int:
        return sum([(await self.status(t)).state == sandbox_pb2.TRIAL_STATE_DONE for t in self.trials])


def agent_calls(tmp: Path, trial: str) -> dict[str, object]:
    path = tmp / "artifacts" / RUN / trial / "agent" / "calls.json"
    return json.loads(path.read_text()) if path.exists() else {"ok": 0, "failures": []}


def sampled_runs(segment: records_pb2.Segment) -> list[tuple[int, ...]]:
    """The response's policy-sampled runs (mask 1), one per model call of the segment."""
    ids = arrays.unpack_i32(segment.response.ids, "ids")
    mask = np.frombuffer(segment.response.mask, dtype=np.uint8)
    runs, current = [], []
    for token, m in zip(ids.tolist(), mask.tolist(), strict=True):
        if m:
            current.append(token)
        elif current:
            runs.append(tuple(current))
            current = []
    if current:
        runs.append(tuple(current))
    return runs


def engine_generations(log: Path) -> dict[str, collections.Counter[tuple[int, ...]]]:
    """Per trial, the multiset of complete replies the engine sampled (across restarts)."""
    out: dict[str, collections.Counter[tuple[int, ...]]] = collections.defaultdict(collections.Counter)
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        if rec["finish_reason"] != "abort":
            out[rec["trial_id"]][tuple(rec["sampled_ids"])] += 1
    return out


AGENT_STATE = sandbox_pb2.TRIAL_STATE_AGENT
DONE_STATE = sandbox_pb2.TRIAL_STATE_DONE


async def in_agent_phase(d: Driver, worker: str = "") -> sandbox_pb2.TrialStatus:
    """A trial that is making model calls (past its first one), optionally on ``worker``."""
    return await d.wait_trial(
        lambda s: s.state == AGENT_STATE and (not worker or s.worker == worker), f"in the agent phase on {worker}"
    )


async def run_chaos(stack: ProcessStack, d: Driver, log: list[str]) -> None:
    """Kills and restarts each service in turn while groups run, then runs to max_steps."""
    await d.submit_group()
    await d.submit_group()
    await in_agent_phase(d)
    await asyncio.sleep(1.0)
    log.append(f"kill capture store ({await d.done_trials()} trials done)")
    stack["capture"].kill()
    await asyncio.sleep(2.0)
    await stack.start("capture")

    await d.submit_group()
    await in_agent_phase(d, "worker-1")  # killed at once: an idle machine runs a trial in ~3 s
    log.append(f"kill worker-1 ({await d.done_trials()} trials done)")
    stack["worker-1"].kill()
    await asyncio.sleep(1.0)
    await stack.start("worker-1")

    await d.submit_group()
    deadline = time.monotonic() + 300
    while (await d.trainer_status()).step < 1:  # the gateway then serves a trained version
        assert time.monotonic() < deadline, "the trainer never finished a step"
        if await d.done_trials() == len(d.trials):
            await d.submit_group()
        await asyncio.sleep(0.5)
    await d.submit_group()
    await in_agent_phase(d)
    await asyncio.sleep(0.8)
    log.append(f"kill gateway ({await d.done_trials()} trials done)")
    stack["gateway"].kill()
    await asyncio.sleep(1.0)
    await stack.start("gateway")

    trained = (await d.trainer_status()).policy_version
    while (await d.gateway_version()) < trained:  # the trainer republishes its weights
        assert time.monotonic() < deadline, f"the restarted gateway never got version {trained} back"
        await asyncio.sleep(0.5)
    log.append(f"restarted gateway serves version {await d.gateway_version()} again")
    log.append(f"kill trainer (step {(await d.trainer_status()).step})")
    stack["trainer"].kill()
    await stack.start("trainer")

    deadline = time.monotonic() + 600
    while True:
        status = await d.trainer_status()
        if status.state in ("done", "failed"):
            break
        assert time.monotonic() < deadline, f"the run did not complete: {status}"
        if await d.done_trials() == len(d.trials):  # every group consumed or stale: one more
            await d.submit_group()
        await asyncio.sleep(1.0)
    log.append(f"trainer {status.state} at step {status.step}")
    while await d.done_trials() < len(d.trials):
        assert time.monotonic() < deadline, "trials never finished"
        await asyncio.sleep(1.0)


@pytest.mark.slow
async def test_a_run_survives_kills_of_each_service(
    tmp_path: Path, redis_server: RedisServer, s3_server: S3Server, s3_bucket: str
) -> None:
    ports = {name: restartable_port() for name in ("capture", "gateway", "proxy", "sandbox", "trainer")}
    model = await asyncio.to_thread(tiny_model, tmp_path / "model")
    config = write_config(tmp_path, ports, redis_server, s3_server, s3_bucket, model)
    task = make_task(tmp_path / "tasks")
    stack = build_stack(tmp_path, config, ports)
    events: list[str] = []
    try:
        await stack.start(timeout_s=180)
        d = Driver(ports, task)
        await run_chaos(stack, d, events)
        status = await d.trainer_status()
        assert (status.state, status.step) == ("done", STEPS), (events, status, stack.logs())
        checkpoints = sorted(p.name for p in (tmp_path / "trainer" / "checkpoints").iterdir())
        assert checkpoints[-1] == f"step-{STEPS:08d}", checkpoints  # no step redone after the restart
        await check_every_trial(tmp_path, d, events)
    except BaseException:
        print("\n".join(events))
        print(stack.logs(6000))
        raise
    finally:
        stack.stop_all()


async def check_every_trial(tmp: Path, d: Driver, events: list[str]) -> None:
    generations = engine_generations(tmp / "engine.jsonl")
    reasons: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    retried: list[str] = []
    expected_ids: set[str] = set()
    for trial in d.trials:
        status = await d.status(trial)
        reason = records_pb2.TerminationReason.Name(status.termination_reason)
        reasons[reason] += 1
        if status.state != DONE_STATE or status.termination_reason == records_pb2.TERMINATION_REASON_UNSPECIFIED:
            problems.append(f"{trial}: not accounted for: {status}")
            continue
        # A retried attempt (its worker died) is its own trajectory; the dead one is never finalized.
        captured_id = trial if status.attempt <= 1 else f"{trial}.attempt-{status.attempt}"
        if captured_id != trial:
            retried.append(f"{trial} (attempt {status.attempt}, {reason})")
            problems += await dead_attempts_unfinalized(d, trial, status.attempt)
        req = capture_pb2.GetTrajectoryRequest(run_id=RUN, trial_id=captured_id, include_tokens=True)
        try:
            traj = await d.store.GetTrajectory(req, timeout=30)
        except Exception as e:  # noqa: BLE001 - reported below with the others
            problems.append(f"{trial}: not in the capture store ({reason}, attempt {status.attempt}): {e}")
            continue
        if not traj.finalized or traj.termination_reason != status.termination_reason:
            problems.append(f"{trial}: capture: finalized={traj.finalized} {traj.termination_reason}, queue: {reason}")
        main = [s for s in traj.segments if s.thread_kind == "main"]
        turns = sum(s.num_turns for s in main)
        calls = agent_calls(tmp, captured_id)
        if turns != calls["ok"]:
            problems.append(
                f"{trial}: {turns} turns captured, the harness saw {calls['ok']} succeed ({reason}); {calls}"
            )
        expected_ids.add(captured_id)
        captured = collections.Counter(run for s in main for run in sampled_runs(s))
        if sum(captured.values()) != turns:
            problems.append(f"{trial}: {sum(captured.values())} sampled runs for {turns} turns")
        extra = captured - generations[captured_id]
        if extra:
            problems.append(f"{trial}: {sum(extra.values())} captured replies the engine never sampled (or twice)")
    finalized = await finalized_ids(d)
    if finalized != expected_ids:
        problems.append(f"finalized trajectories {sorted(finalized ^ expected_ids)} differ from the submitted trials")
    events.append(f"reasons: {dict(reasons)}; retried: {retried}")
    assert not problems, "\n".join(problems + events)
    assert retried, f"the worker kill interrupted no trial: {events}"
    print("\n".join(events))


async def finalized_ids(d: Driver) -> set[str]:
    """Every finalized trajectory of the run: one per submitted trial, nothing else."""
    out, token = set(), ""
    while True:
        req = capture_pb2.ListTrajectoriesRequest(run_id=RUN, finalized_only=True, page_size=1000, page_token=token)
        page = await d.store.ListTrajectories(req, timeout=30)
        out |= {t.trial_id for t in page.trajectories}
        token = page.next_page_token
        if not token:
            return out


async def dead_attempts_unfinalized(d: Driver, trial: str, attempt: int) -> list[str]:
    """The captured turns of a dead attempt are kept (acknowledged data is never
    deleted) but never finalized, so they are never trained."""
    problems = []
    for n in range(1, attempt):
        dead = trial if n == 1 else f"{trial}.attempt-{n}"
        try:
            traj = await d.store.GetTrajectory(capture_pb2.GetTrajectoryRequest(run_id=RUN, trial_id=dead), timeout=30)
        except Exception:  # noqa: BLE001 - it died before its first model call
            continue
        if traj.finalized:
            problems.append(f"{dead}: a dead attempt was finalized")
    return problems
