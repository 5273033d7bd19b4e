"""Conformance checks of the Sandbox gRPC contract (services/sandbox/CONTRACT.md),
run against any address: this project's sandbox service, the remote front in
``services/sandbox_remote``, or a managed provider's endpoint.

The checks use only the public contract (``harnessrl.v1.Sandbox`` and the standard
health service) and trials of two small tasks that ``write_tasks`` creates; the
workers behind the target must be able to read them (``tasks_dir`` is their path as
the workers see it) and run the built-in harnesses ``oracle``, ``nop`` and ``shell``.
``harnessrl sandbox conformance --target HOST:PORT`` runs them from the command line.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harnessrl.errors import FailedPrecondition, InvalidArgument
from harnessrl.rpc import check_target, connect
from harnessrl.v1 import records_pb2, sandbox_pb2, sandbox_pb2_grpc

SERVICE = sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"].full_name
S, R = sandbox_pb2, records_pb2
ORDER = [S.TRIAL_STATE_QUEUED, S.TRIAL_STATE_SETUP, S.TRIAL_STATE_AGENT, S.TRIAL_STATE_VERIFY]
ORDER += [S.TRIAL_STATE_TEARDOWN, S.TRIAL_STATE_DONE]

# -- the tasks the trials run ---------------------------------------------------------
_TASK_TOML = """schema_version = "1.4"
[task]
name = "conformance/{name}"
[agent]
timeout_sec = 60
[verifier]
timeout_sec = 60
network_mode = "no-network"  # its tests need none: runs on every backend's verify_network
[environment]
memory_mb = 512
storage_mb = 64
"""
_REWARD_IF_HELLO = """#!/bin/bash
if [ "$(cat /app/hello.txt 2>/dev/null)" = "hello" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
TASKS: dict[str, dict[str, str]] = {
    # The oracle scores 1, anything that leaves no hello.txt scores 0.
    "hello": {"tests/test.sh": _REWARD_IF_HELLO, "solution/solve.sh": "#!/bin/bash\necho hello > hello.txt\n"},
    # A verifier that crashes without writing a reward: verifier_error, never a 0 reward.
    "broken-verifier": {"tests/test.sh": "#!/bin/bash\necho 'grader crashed' >&2\nexit 3\n"},
    # A verifier that never finishes: verifier_timeout under verifier_timeout_s.
    "slow-verifier": {"tests/test.sh": "#!/bin/bash\nsleep 300\necho 1 > /logs/verifier/reward.txt\n"},
}


def write_tasks(root: Path) -> Path:
    """Writes the conformance tasks (Harbor format) under ``root``; returns ``root``."""
    for name, files in TASKS.items():
        task = root / name
        contents = {
            "task.toml": _TASK_TOML.format(name=name),
            "instruction.md": "Write hello to hello.txt.\n",
            "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY README.md /app/README.md\n",
            "environment/README.md": "# conformance\n",
            **files,
        }
        for rel, text in contents.items():
            (task / rel).parent.mkdir(parents=True, exist_ok=True)
            (task / rel).write_text(text)
    return root


# -- results and errors ---------------------------------------------------------------
class TargetError(FailedPrecondition):
    """The target is unreachable, not a Sandbox service, or refuses the token."""


class Violation(Exception):
    """A check saw the target break the contract; the message says how."""


def expect(condition: object, message: str) -> None:
    if not condition:
        raise Violation(message)


@dataclass
class Result:
    name: str
    ok: bool
    detail: str
    seconds: float


@dataclass
class Ctx:
    stub: sandbox_pb2_grpc.SandboxStub
    run_id: str
    tasks_dir: str
    timeout_s: float
    seen: dict[str, list[sandbox_pb2.TrialStatus]] = field(default_factory=dict)

    def spec(self, name: str, *, task: str = "hello", harness: str = "oracle", **kw: object) -> sandbox_pb2.TrialSpec:
        return S.TrialSpec(
            trial_id=f"{self.run_id}-{name}",
            run_id=self.run_id,
            task_path=f"{self.tasks_dir}/{task}",
            harness=harness,
            **kw,  # type: ignore[arg-type]
        )

    async def submit(self, spec: sandbox_pb2.TrialSpec) -> sandbox_pb2.SubmitTrialResponse:
        return await self.stub.SubmitTrial(S.SubmitTrialRequest(spec=spec), timeout=30)

    async def follow(self, trial_id: str, until: int = S.TRIAL_STATE_DONE) -> sandbox_pb2.TrialStatus:
        """Watches one trial until it reaches ``until`` (or DONE); checks every status on the way."""
        history = self.seen.setdefault(trial_id, [])
        call = self.stub.WatchTrials(S.WatchTrialsRequest(trial_ids=[trial_id]), timeout=self.timeout_s)
        try:
            async for status in call:
                expect(status.trial_id == trial_id, f"a watch of {trial_id} streamed {status.trial_id}")
                check_status(status, history[-1] if history else None)
                history.append(status)
                if status.state in (until, S.TRIAL_STATE_DONE):
                    return status
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Violation(f"{trial_id}: not {S.TrialState.Name(until)} within {self.timeout_s:.0f}s") from e
            raise
        finally:
            call.cancel()
        raise Violation(f"the watch of {trial_id} ended before the trial reached {S.TrialState.Name(until)}")


def check_status(status: sandbox_pb2.TrialStatus, previous: sandbox_pb2.TrialStatus | None) -> None:
    """Invariants of every status: one termination reason exactly when DONE; states move forward
    (QUEUED again only with a new attempt); DONE never changes."""
    name = S.TrialState.Name(status.state)
    expect(status.state in ORDER, f"{status.trial_id}: state {name}")
    done = status.state == S.TRIAL_STATE_DONE
    has_reason = status.termination_reason != R.TERMINATION_REASON_UNSPECIFIED
    expect(done == has_reason, f"{status.trial_id}: state {name} with termination_reason {reason(status)}")
    if previous is None:
        return
    if previous.state == S.TRIAL_STATE_DONE:
        same = (status.state, status.termination_reason, status.has_reward, status.reward)
        expect(same == (previous.state, previous.termination_reason, previous.has_reward, previous.reward),
               f"{status.trial_id}: changed after DONE ({reason(previous)} -> {name} {reason(status)})")  # fmt: skip
    back = ORDER.index(status.state) < ORDER.index(previous.state)
    requeued = status.state == S.TRIAL_STATE_QUEUED and status.attempt > previous.attempt
    expect(not back or requeued, f"{status.trial_id}: moved back {S.TrialState.Name(previous.state)} -> {name}")


def reason(status: sandbox_pb2.TrialStatus) -> str:
    return R.TerminationReason.Name(status.termination_reason).removeprefix("TERMINATION_REASON_").lower()


async def expect_code(call: Awaitable[object], code: grpc.StatusCode, what: str) -> str:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        expect(e.code() == code, f"{what}: {e.code().name} ({e.details()}), expected {code.name}")
        expect(e.details(), f"{what}: {code.name} without a message")
        return e.details() or ""
    raise Violation(f"{what}: accepted, expected {code.name}")


# -- the checks -----------------------------------------------------------------------
async def check_rejects_malformed_specs(ctx: Ctx) -> str:
    cases: list[tuple[str, dict[str, object]]] = [
        ("no trial_id", {"trial_id": ""}),
        ("a path as trial_id", {"trial_id": "../../etc"}),
        ("no task_path", {"task_path": ""}),
        ("no harness", {"harness": ""}),
        ("an unknown harness", {"harness": "no-such-harness"}),
        ("a missing task", {"task_path": f"/no/such/task-{secrets.token_hex(4)}"}),
        ("a malformed gateway_target", {"gateway_target": "not a target"}),
    ]
    for what, change in cases:
        spec = ctx.spec(f"bad-{len(what)}")
        for key, value in change.items():
            setattr(spec, key, value)
        await expect_code(ctx.submit(spec), grpc.StatusCode.INVALID_ARGUMENT, f"a spec with {what}")
    return f"{len(cases)} malformed specs: INVALID_ARGUMENT"


async def check_unknown_and_empty_ids(ctx: Ctx) -> str:
    unknown = f"{ctx.run_id}-never-submitted"
    not_found, invalid = grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT
    await expect_code(
        ctx.stub.GetTrial(S.GetTrialRequest(trial_id=unknown), timeout=10), not_found, "GetTrial(unknown)"
    )
    await expect_code(ctx.stub.GetTrial(S.GetTrialRequest(), timeout=10), invalid, "GetTrial('')")
    await expect_code(
        ctx.stub.CancelTrial(S.CancelTrialRequest(trial_id=unknown), timeout=10), not_found, "CancelTrial"
    )

    async def watch_nothing() -> None:
        async for _ in ctx.stub.WatchTrials(S.WatchTrialsRequest(), timeout=10):
            pass

    await expect_code(watch_nothing(), invalid, "WatchTrials without run_id or trial_ids")
    return "NOT_FOUND for unknown ids, INVALID_ARGUMENT for empty ones"


async def check_idempotent_submit(ctx: Ctx) -> str:
    spec = ctx.spec("idem", harness="nop")
    answers = await asyncio.gather(*(ctx.submit(spec) for _ in range(3)))  # racing retries
    created = [a.created for a in answers]
    expect(sum(created) == 1, f"3 concurrent submits of one spec: created {created}, expected once")
    expect(all(a.trial_id == spec.trial_id for a in answers), f"submit answered ids {[a.trial_id for a in answers]}")
    again = await ctx.submit(spec)
    expect(not again.created and again.trial_id == spec.trial_id, f"another submit of the same spec: {again}")
    other = ctx.spec("idem", harness="nop", harness_options={"changed": "1"})
    await expect_code(ctx.submit(other), grpc.StatusCode.ALREADY_EXISTS, "another spec under a taken trial id")
    done = await ctx.follow(spec.trial_id)
    expect(not (await ctx.submit(spec)).created, "a resubmission after DONE created a new trial")
    return f"same spec: created once; other spec: ALREADY_EXISTS; ended {reason(done)}"


async def check_completes_with_reward(ctx: Ctx) -> str:
    spec = ctx.spec("oracle")
    await ctx.submit(spec)
    done = await ctx.follow(spec.trial_id)
    expect(done.termination_reason == R.TERMINATION_REASON_COMPLETED, f"oracle ended {reason(done)}: {done.error}")
    expect(done.has_reward and done.reward == 1.0, f"oracle: has_reward={done.has_reward} reward={done.reward}")
    expect(done.attempt >= 1, f"a trial that ran reports attempt {done.attempt}")
    t = done.timings
    expect(min(t.setup_s, t.agent_s, t.verify_s, t.teardown_s) >= 0, f"negative phase timings {t}")
    expect(t.setup_s + t.agent_s + t.verify_s + t.teardown_s > 0, "no phase timings")
    got = await ctx.stub.GetTrial(S.GetTrialRequest(trial_id=spec.trial_id), timeout=10)
    check_status(got, done)
    return f"oracle: completed, reward 1.0, attempt {done.attempt}"


async def check_verifier_failure_is_not_a_reward(ctx: Ctx) -> str:
    spec = ctx.spec("broken", task="broken-verifier", harness="nop")
    await ctx.submit(spec)
    done = await ctx.follow(spec.trial_id)
    expect(done.termination_reason == R.TERMINATION_REASON_VERIFIER_ERROR, f"ended {reason(done)}, not verifier_error")
    expect(not done.has_reward, f"a verifier that wrote no reward reported reward {done.reward}")
    expect(done.error, "an infrastructure failure without an error message")
    return "verifier_error, no reward, error says why"


async def check_agent_deadline(ctx: Ctx) -> str:
    limit = 2.0
    spec = ctx.spec("deadline", harness="shell", harness_options={"script": "sleep 300"}, agent_timeout_s=limit)
    await ctx.submit(spec)
    await ctx.follow(spec.trial_id, until=S.TRIAL_STATE_AGENT)
    started = time.monotonic()
    done = await ctx.follow(spec.trial_id)
    took = time.monotonic() - started
    expect(done.termination_reason == R.TERMINATION_REASON_AGENT_TIMEOUT, f"ended {reason(done)}, not agent_timeout")
    expect(took < limit + 60, f"agent_timeout_s={limit}: the trial took {took:.0f}s after its agent phase began")
    return f"agent_timeout_s={limit:.0f}: agent_timeout {took:.1f}s after the agent phase began"


async def check_verifier_deadline(ctx: Ctx) -> str:
    limit = 2.0
    spec = ctx.spec("vdeadline", task="slow-verifier", harness="nop", verifier_timeout_s=limit)
    await ctx.submit(spec)
    done = await ctx.follow(spec.trial_id)
    timed_out = done.termination_reason == R.TERMINATION_REASON_VERIFIER_TIMEOUT
    expect(timed_out, f"ended {reason(done)}, not verifier_timeout: {done.error}")
    expect(not done.has_reward, f"a verifier that timed out reported reward {done.reward}")
    expect(done.timings.verify_s < limit + 60, f"verifier_timeout_s={limit}: verify took {done.timings.verify_s:.0f}s")
    return f"verifier_timeout_s={limit:.0f}: verifier_timeout, no reward, verify {done.timings.verify_s:.1f}s"


async def check_cancel_running(ctx: Ctx) -> str:
    spec = ctx.spec("cancel", harness="shell", harness_options={"script": "sleep 300"})
    await ctx.submit(spec)
    await ctx.follow(spec.trial_id, until=S.TRIAL_STATE_AGENT)
    cancel = S.CancelTrialRequest(trial_id=spec.trial_id)
    expect((await ctx.stub.CancelTrial(cancel, timeout=10)).cancelled, "CancelTrial of a running trial: False")
    done = await ctx.follow(spec.trial_id)
    expect(done.termination_reason == R.TERMINATION_REASON_CANCELLED, f"a cancelled trial ended {reason(done)}")
    expect(not done.has_reward, "a cancelled trial has a reward")
    expect(not (await ctx.stub.CancelTrial(cancel, timeout=10)).cancelled, "CancelTrial after DONE: True")
    return "running trial cancelled, no reward; a second cancel: False"


async def check_watch_run(ctx: Ctx) -> str:
    run_id = f"{ctx.run_id}-w"
    specs = [ctx.spec(f"w{i}", harness="nop") for i in range(2)]
    for spec in specs:
        spec.run_id = run_id
        spec.trial_id = f"{run_id}{spec.trial_id[len(ctx.run_id) :]}"
    await ctx.submit(specs[0])
    last: dict[str, sandbox_pb2.TrialStatus] = {}
    call = ctx.stub.WatchTrials(S.WatchTrialsRequest(run_id=run_id), timeout=ctx.timeout_s)
    try:
        async for status in call:
            expect(status.run_id == run_id, f"a watch of run {run_id} streamed a trial of run {status.run_id!r}")
            expect(status.trial_id in {s.trial_id for s in specs}, f"unexpected trial {status.trial_id}")
            check_status(status, last.get(status.trial_id))
            if not last:  # the current state comes first; then a trial submitted while watching
                await ctx.submit(specs[1])
            last[status.trial_id] = status
            if len(last) == 2 and all(s.state == S.TRIAL_STATE_DONE for s in last.values()):
                break
    except grpc.aio.AioRpcError as e:
        raise Violation(f"watch of run {run_id}: {e.code().name}: {e.details()} (saw {sorted(last)})") from e
    finally:
        call.cancel()
    for status in last.values():
        expect(status.termination_reason == R.TERMINATION_REASON_COMPLETED, f"nop ended {reason(status)}")
        expect(status.has_reward and status.reward == 0.0, f"nop: has_reward={status.has_reward} {status.reward}")
    return "run watch: current state first, a later submission, both DONE; nop's 0 is a reward"


CHECKS: dict[str, Callable[[Ctx], Awaitable[str]]] = {
    "rejects_malformed_specs": check_rejects_malformed_specs,
    "unknown_and_empty_ids": check_unknown_and_empty_ids,
    "idempotent_submit": check_idempotent_submit,
    "completes_with_reward": check_completes_with_reward,
    "verifier_failure_is_not_a_reward": check_verifier_failure_is_not_a_reward,
    "agent_deadline": check_agent_deadline,
    "verifier_deadline": check_verifier_deadline,
    "cancel_running": check_cancel_running,
    "watch_run": check_watch_run,
}


# -- running them ---------------------------------------------------------------------
async def probe(channel: grpc.aio.Channel, target: str, wait_s: float = 5.0) -> str:
    """Raises TargetError unless ``target`` serves the Sandbox and accepts the caller's token."""
    health = health_pb2_grpc.HealthStub(channel)
    try:
        resp = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=wait_s, wait_for_ready=True)
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            raise TargetError(
                f"{target} is a gRPC server but does not serve {SERVICE} (its health service does not know it)"
            ) from e
        if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise TargetError(
                f"no gRPC server answers at {target} within {wait_s:.0f}s: {e.code().name}: {e.details()}"
            ) from e
        if e.code() != grpc.StatusCode.UNIMPLEMENTED:  # no health service: the Sandbox itself must answer
            raise TargetError(f"{target}: health check failed: {e.code().name}: {e.details()}") from e
    else:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        if status != "SERVING":
            raise TargetError(f"{target}: {SERVICE} is {status}, not SERVING")
    try:
        await sandbox_pb2_grpc.SandboxStub(channel).GetTrial(S.GetTrialRequest(), timeout=wait_s)
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise TargetError(f"{target} does not implement {SERVICE} (GetTrial: UNIMPLEMENTED)") from e
        if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            raise TargetError(f"{target} refused the token: {e.details()} (pass --token)") from e
        if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
            raise TargetError(f"{target}: GetTrial('') answered {e.code().name}: {e.details()}") from e
        return "SERVING"
    raise TargetError(f"{target}: GetTrial with an empty trial_id was accepted (expected INVALID_ARGUMENT)")


async def run_conformance(
    target: str,
    token: str | None = None,
    *,
    tasks_dir: Path | str | None = None,
    only: list[str] | None = None,
    timeout_s: float = 180.0,
    connect_timeout_s: float = 5.0,
) -> list[Result]:
    """Runs the checks (all, or ``only``) concurrently; the first result is the probe's
    (``connect_timeout_s``: how long the target may take to answer at all).
    ``tasks_dir``: where the workers find the tasks ``write_tasks`` writes; None writes
    them to a temporary folder here (a target whose workers share this filesystem)."""
    try:
        check_target(target)
    except ValueError as e:
        raise InvalidArgument(f"--target: {e}") from e
    unknown = sorted(set(only or []) - set(CHECKS))
    if unknown:
        raise InvalidArgument(f"unknown check(s) {unknown}; valid: {sorted(CHECKS)}")
    with tempfile.TemporaryDirectory(prefix="hrl-conformance-") as tmp:
        root = str(tasks_dir) if tasks_dir is not None else str(write_tasks(Path(tmp)))
        async with connect(target, token, tracing=False) as channel:
            started = time.monotonic()
            detail = await probe(channel, target, connect_timeout_s)
            results = [Result("health", True, f"{SERVICE} {detail}", time.monotonic() - started)]
            ctx = Ctx(sandbox_pb2_grpc.SandboxStub(channel), f"conf-{secrets.token_hex(4)}", root, timeout_s)
            names = only or list(CHECKS)
            results += await asyncio.gather(*(_one(name, ctx) for name in names))
    return results


async def _one(name: str, ctx: Ctx) -> Result:
    started = time.monotonic()
    try:
        detail = await asyncio.wait_for(CHECKS[name](ctx), ctx.timeout_s + 30)
        return Result(name, True, detail, time.monotonic() - started)
    except Violation as e:
        return Result(name, False, str(e), time.monotonic() - started)
    except TimeoutError:
        return Result(name, False, f"no result within {ctx.timeout_s + 30:.0f}s", time.monotonic() - started)
    except grpc.aio.AioRpcError as e:
        return Result(name, False, f"{e.code().name}: {e.details()}", time.monotonic() - started)
