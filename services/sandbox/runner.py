"""Runs one trial through its phases and decides its one termination reason.

setup    load the task, start the sandbox (layer cache + workspace copy), register
         the trial with the proxy, write the harness's config
agent    run the unmodified harness; every process dies with the phase; then the
         proxy's close makes every segment durable and refuses the token
verify   as Harbor verifies: tests/test.sh runs as the task's verifier user (the image's USER,
         root for most images) with the task's verifier network (``verifier_policy``); the
         agent keeps uid 1000 and the proxy alone. Before it: the backend's fresh verify
         sandbox (docker), protected files restored and the agent's plants on the
         verifier's routes reverted (tamper events), fresh tests; the reward is read
         strictly (missing or invalid is verifier_error, never 0)
teardown stop the sandbox, keep the artifacts, FinalizeTrajectory on the capture store

Errors inside a phase become termination reasons (``lifecycle.decide_termination``).
Whatever else a phase raises (a backend's upload, exec or download, a harness adapter's
bug) ends that phase, is logged with its traceback and becomes the phase's infrastructure
reason, its type and message in the outcome's error; teardown still runs and the outcome
(``result.json``) is still written, so a deterministic fault ends the trial instead of
crashing its worker into a retry. Which reason, per boundary:

setup     load, start, snapshot_pristine, (red-team) uploads  -> env_setup_failed
agent     harness uploads, the agent's exec                   -> env_setup_failed: the
          policy never got a fair run, so nothing afterwards is a reward
          the proxy's close                                   -> engine_error (segments
          may not be durable)
          downloading the agent's logs, collect_logs          -> an event only: logs are
          artifacts, not reward inputs, and the verifier decides the trial
verify    restore_protected, upload of tests, the verifier's exec, download of the reward
          files, reading them                                 -> verifier_error: a verifier
          that did not run cleanly is never a reward (and a failed restore stops the
          phase before test.sh can run against tampered files)
teardown  stop, closing the relay                             -> the reason stands: the
          reward was read before teardown and nothing there changes it; the error is
          recorded (a leaked sandbox is reaped by ``cleanup_orphans``)

A sandbox lost under an exec (``SandboxLost``) is env_setup_failed in either phase.
Only an exception of the caller's ``on_state`` escapes ``run`` (after teardown).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from harnessrl import telemetry, tls
from harnessrl.errors import HarnessError
from services.sandbox import dockerfile, integrity, runner_guard, verifier_policy
from services.sandbox.backends.base import (
    Backend,
    ExecRequest,
    ExecResult,
    Limits,
    Network,
    Phase,
    Sandbox,
    SandboxSpec,
)
from services.sandbox.endpoints import CaptureFinalizer, ProxyAdmin, ProxySummary, ProxyTrial, UnixRelay
from services.sandbox.errors import EnvSetupError, SandboxLost, VerifierError
from services.sandbox.harnesses import AgentContext, HarnessAdapter, ModelAccess, get_harness
from services.sandbox.harnesses.agent_extras import run_setup as run_harness_setup
from services.sandbox.lifecycle import (
    PhaseTimings,
    TerminationReason,
    TrialOutcome,
    TrialSpec,
    TrialState,
    decide_termination,
)
from services.sandbox.paths import TrialDirs
from services.sandbox.settings import Settings
from services.sandbox.tasks import Task, load_task

log = logging.getLogger(__name__)

StateCallback = Callable[[TrialState], Awaitable[None]]
_SUMMARY_BYTES = 4000
_TEARDOWN = "teardown"
# The flag an unexpected exception in each phase sets (None: the reason stands, the
# error is recorded). Why each: the module docstring.
_PHASE_FAILURE: dict[str, str | None] = {
    Phase.SETUP: "setup_failed",
    Phase.AGENT: "setup_failed",
    Phase.VERIFY: "verifier_failed",
    _TEARDOWN: None,
}


@dataclass
class _Trial:
    """Mutable state of one run of a trial (flags feed decide_termination)."""

    spec: TrialSpec
    dirs: TrialDirs
    artifacts: Path
    task: Task | None = None
    harness: HarnessAdapter | None = None
    sandbox: Sandbox | None = None
    relay: UnixRelay | None = None
    relay_dir: Path | None = None
    proxy_trial: ProxyTrial | None = None
    proxy_registered: bool = False
    summary: ProxySummary = field(default_factory=ProxySummary)
    timings: PhaseTimings = field(default_factory=PhaseTimings)
    flags: dict[str, bool] = field(default_factory=dict)
    reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    exit_code: int = 0
    tamper: list[str] = field(default_factory=list)
    verifier: verifier_policy.VerifierRun | None = None
    events: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    verifier_summary: str = ""
    # The trial's trace context when it started: the proxy parents model calls on it.
    trace_context: Context | None = None

    @property
    def task_id(self) -> str:
        return self.spec.task_id or (self.task.task_id if self.task else "")


class TrialRunner:
    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        proxy: ProxyAdmin | None = None,
        capture: CaptureFinalizer | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.proxy = proxy
        self.capture = capture

    async def run(
        self, spec: TrialSpec, *, cancel: asyncio.Event | None = None, on_state: StateCallback | None = None
    ) -> TrialOutcome:
        cancel = cancel or asyncio.Event()
        dirs = TrialDirs(self.settings.work_dir / f"{spec.trial_id}-{uuid.uuid4().hex[:8]}")
        artifacts = self.settings.artifacts_dir / (spec.run_id or "_") / spec.trial_id
        t = _Trial(spec=spec, dirs=dirs, artifacts=artifacts, trace_context=otel_context.get_current())

        async def enter(state: TrialState) -> None:
            if on_state is not None:
                await on_state(state)

        try:
            await enter(TrialState.SETUP)
            await self._phase(t, Phase.SETUP, self._setup(t))
            if self._go_on(t, cancel):
                await enter(TrialState.AGENT)
                await self._phase(t, Phase.AGENT, self._agent(t, cancel))
            if self._go_on(t, cancel):
                await enter(TrialState.VERIFY)
                await self._phase(t, Phase.VERIFY, self._verify(t, cancel))
        finally:
            try:
                await enter(TrialState.TEARDOWN)
            finally:
                await self._phase(t, _TEARDOWN, self._teardown(t))
        t.flags["cancelled"] = t.flags.get("cancelled", False) or cancel.is_set()
        return self._outcome(t)

    @classmethod
    async def _phase(cls, t: _Trial, phase: str, work: Awaitable[None]) -> None:
        """Runs a phase in its own span (``sandbox.setup``...) and adds up its wall time.
        An exception the phase did not map itself becomes its infrastructure reason
        (``_PHASE_FAILURE``, the table in the module docstring)."""
        started = time.monotonic()
        field_name = f"{phase}_s"
        with telemetry.tracer(__name__, "sandbox").start_as_current_span(
            f"sandbox.{phase}", attributes=telemetry.trial_attributes(t.spec)
        ) as span:
            try:
                await work
            except Exception as e:
                log.exception("trial phase raised", extra={"kv": {"trial": t.spec.trial_id, "phase": phase}})
                span.record_exception(e)
                message = f"{phase}: {type(e).__name__}: {e}"
                flag = _PHASE_FAILURE[phase]
                if flag is None:
                    t.errors.append(message)
                else:
                    cls._fail(t, flag, message)
            finally:
                setattr(t.timings, field_name, getattr(t.timings, field_name) + time.monotonic() - started)

    @staticmethod
    def _go_on(t: _Trial, cancel: asyncio.Event) -> bool:
        if cancel.is_set():
            t.flags["cancelled"] = True
        return not (t.flags.get("cancelled") or t.flags.get("setup_failed"))

    # -- setup -----------------------------------------------------------------
    async def _setup(self, t: _Trial) -> None:
        try:
            t.task = load_task(t.spec.task_path)
            # Refused before anything starts (an allowlist no backend can enforce).
            t.verifier = verifier_policy.resolve(t.task)
            t.harness = get_harness(t.spec.harness)
            t.harness.check_installed()
            proxy_socket = await self._open_proxy(t)
            sandbox_spec = SandboxSpec(
                trial_id=t.spec.trial_id,
                task=t.task,
                dirs=t.dirs,
                limits=self._limits(t.task),
                ro_mounts=tuple(t.harness.install_paths()),
                proxy_socket=proxy_socket,
            )
            t.sandbox = await self.backend.start(sandbox_spec)
            await self.backend.snapshot_pristine(t.sandbox)
            if not self.settings.integrity.hide_tests_and_solution:
                # Defence switched off (red-team only): the agent phase sees both.
                await self.backend.upload(t.sandbox, t.task.tests_dir, t.sandbox.paths.tests)
                if t.task.solution_dir.is_dir():
                    await self.backend.upload(t.sandbox, t.task.solution_dir, t.sandbox.paths.solution)
        except HarnessError as e:
            self._fail(t, "setup_failed", f"setup: {e}")

    async def _open_proxy(self, t: _Trial) -> Path | None:
        assert t.harness is not None and t.task is not None
        access = t.harness.model_access
        if access == ModelAccess.NONE or (access == ModelAccess.OPTIONAL and self.proxy is None):
            return None
        if self.proxy is None:
            raise EnvSetupError(f"harness {t.harness.name!r} needs a model but no proxy_url is configured")
        trial = await self.proxy.register(t.spec, t.task_id, t.trace_context)
        t.proxy_registered = True
        t.proxy_trial = trial
        if self.settings.proxy_uds_path is not None and self.settings.local.host_uid is None:
            # The proxy's own socket is bound into the sandbox as it is.
            return self.settings.proxy_uds_path
        # No socket of the proxy's (or a sandbox uid that may not connect to it): a
        # per-trial relay. Unix socket paths are limited to 108 bytes: a short private dir.
        t.relay_dir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="hrl-"))
        relay_path = t.relay_dir / "proxy.sock"
        if self.settings.proxy_uds_path is not None:
            t.relay = await UnixRelay(relay_path, uds=self.settings.proxy_uds_path).start()
        else:
            host, port, secure = self.proxy.address
            context = tls.client_context(self.proxy.tls) if secure else None
            if secure and context is None:
                raise EnvSetupError(f"proxy_url {self.proxy.url} is https but no tls ca_file verifies it")
            t.relay = await UnixRelay(relay_path, tcp=(host, port), tcp_tls=context).start()
        return relay_path

    def _limits(self, task: Task) -> Limits:
        s, env = self.settings, task.config.environment
        return Limits(
            memory_mb=min(env.memory_mb or s.default_memory_mb, s.max_memory_mb),
            storage_mb=min(env.storage_mb or s.default_storage_mb, s.max_storage_mb),
            pids=s.pids_limit,
            cpus=env.cpus,
            output_limit_bytes=s.output_limit_bytes,
        )

    # -- agent -----------------------------------------------------------------
    async def _agent(self, t: _Trial, cancel: asyncio.Event) -> None:
        assert t.task is not None and t.harness is not None and t.sandbox is not None
        sandbox, spec = t.sandbox, t.spec
        token = t.proxy_trial.token if t.proxy_trial else None
        base_url = None
        if t.proxy_trial is not None:
            base_url = f"http://127.0.0.1:{self.settings.proxy_port_in_sandbox}{t.proxy_trial.base_path}"
        ctx = AgentContext(
            trial_id=spec.trial_id,
            task=t.task,
            instruction=t.task.instruction,
            model=spec.model,
            max_turns=spec.max_turns,
            base_url=base_url,
            token=token,
            options=dict(spec.harness_options),
            paths=sandbox.paths,
            home=t.dirs.home(Phase.AGENT),
            runtime=t.dirs.runtime / Phase.AGENT,
        )
        try:
            ctx.home.mkdir(parents=True, exist_ok=True)
            ctx.runtime.mkdir(parents=True, exist_ok=True)
            command = t.harness.prepare(ctx)
            for src, dst in command.uploads:
                await self.backend.upload(sandbox, src, dst)
            await run_harness_setup(self.backend, sandbox, command)  # e.g. the task's skills
        except HarnessError as e:
            self._fail(t, "setup_failed", f"harness setup: {e}")
            return
        timeout = spec.agent_timeout_s or t.task.config.agent.timeout_sec or self.settings.default_agent_timeout_s
        request = ExecRequest(
            argv=command.argv,
            phase=Phase.AGENT,
            env=_agent_env(sandbox, command.env),
            timeout_s=timeout,
            network=Network.PROXY_ONLY if base_url else Network.NONE,
            proxy_port=self.settings.proxy_port_in_sandbox if base_url else None,
            stdin=command.stdin,
        )
        result = await self._exec(t, request, cancel)
        if result is None:
            return
        self._record_exec(t, "agent", result)
        t.exit_code = result.exit_code
        t.flags["agent_timed_out"] = result.timed_out
        await self._close_proxy(t)
        try:
            await self.backend.download(sandbox, sandbox.paths.agent_logs, t.artifacts / "agent")
            await asyncio.to_thread(t.harness.collect_logs, ctx, t.artifacts / "harness")
        except Exception as e:
            # Artifacts only: the verifier, not these logs, decides the trial.
            log.warning("collecting the agent's logs failed", exc_info=True, extra={"kv": {"trial": spec.trial_id}})
            t.events.append(f"collecting the agent's logs failed: {type(e).__name__}: {e}")

    async def _close_proxy(self, t: _Trial) -> None:
        if not t.proxy_registered or self.proxy is None:
            return
        t.proxy_registered = False
        try:
            t.summary = await self.proxy.close(t.spec.trial_id)
        except HarnessError as e:
            # Segments may not be durable: an infrastructure failure, never a reward.
            self._fail(t, "engine_error", f"proxy close: {e}")
            return
        except Exception as e:
            log.exception("proxy close raised", extra={"kv": {"trial": t.spec.trial_id}})
            self._fail(t, "engine_error", f"proxy close: {type(e).__name__}: {e}")
            return
        summary = t.summary
        t.flags["engine_error"] = t.flags.get("engine_error", False) or summary.engine_error
        t.flags["context_overflow"] = summary.context_overflow
        t.flags["max_turns_reached"] = summary.max_turns_reached
        if summary.refused_requests or summary.proxy_errors:
            # The harness was refused by the proxy, not answered by the policy: whatever
            # the verifier says afterwards measures the proxy, never a reward.
            detail = "; ".join(summary.refusals) or "no detail"
            self._fail(
                t,
                "proxy_error",
                f"the proxy refused {summary.refused_requests} request(s) and failed {summary.proxy_errors}: {detail}",
            )
        if summary.num_turns == 0 and t.harness is not None and t.harness.model_access == ModelAccess.REQUIRED:
            t.events.append("agent:no_model_call")

    # -- verify ----------------------------------------------------------------
    async def _verify(self, t: _Trial, cancel: asyncio.Event) -> None:
        assert t.task is not None and t.sandbox is not None and t.verifier is not None
        sandbox, cfg = t.sandbox, t.task.config.verifier
        policy = self.settings.integrity
        # Harbor's identity and network for the verifier, never the agent's (which kept uid
        # 1000 and the proxy alone); the backend readies its sandbox for them first.
        network = Network.PUBLIC if t.verifier.public else Network.NONE
        t.tamper = await self.backend.prepare_verify(sandbox, t.verifier.user, network)
        if policy.restore_pristine_files or policy.guard_runner_routes or policy.guard_verifier_path:
            t.tamper += await self.backend.restore_protected(sandbox)
        await self.backend.upload(sandbox, t.task.tests_dir, sandbox.paths.tests)
        env = {**_agent_env(sandbox, {}), **cfg.env}
        request = ExecRequest(
            argv=["/bin/bash", str(sandbox.paths.tests / "test.sh")],
            phase=Phase.VERIFY,
            env=runner_guard.verifier_env(env) if policy.harden_verifier_env else env,
            timeout_s=t.spec.verifier_timeout_s or cfg.timeout_sec or self.settings.default_verifier_timeout_s,
            network=network,
            user=t.verifier.user,
        )
        result = await self._exec(t, request, cancel)
        if result is None:
            return
        self._record_exec(t, "verifier", result)
        t.verifier_summary = result.output.decode(errors="replace")[-_SUMMARY_BYTES:]
        if cancel.is_set():
            t.flags["cancelled"] = True
            return
        if result.timed_out:
            self._fail(t, "verifier_timed_out", f"verifier ran past {request.timeout_s}s")
            return
        verifier_dir = t.artifacts / "verifier"
        try:
            await self.backend.download(sandbox, sandbox.paths.verifier_logs, verifier_dir)
            t.rewards = integrity.read_rewards(verifier_dir)
            t.reward = integrity.select_reward(t.rewards, t.spec.reward_key, t.spec.reward_weights)
        except (VerifierError, FileNotFoundError) as e:
            detail = f" (test.sh exited {result.exit_code})" if result.exit_code else ""
            self._fail(t, "verifier_failed", f"verifier: {e}{detail}")

    # -- teardown --------------------------------------------------------------
    async def _teardown(self, t: _Trial) -> None:
        if t.sandbox is not None:
            try:
                await self.backend.stop(t.sandbox)
            except Exception as e:
                log.exception("stop failed", extra={"kv": {"trial": t.spec.trial_id}})
                t.errors.append(f"teardown: {type(e).__name__}: {e}")
        elif not self.settings.keep_trial_dirs:
            await asyncio.to_thread(shutil.rmtree, t.dirs.root, True)
        await self._close_proxy(t)
        if t.relay is not None:
            await t.relay.stop()
        if t.relay_dir is not None:
            await asyncio.to_thread(shutil.rmtree, t.relay_dir, True)

    def _outcome(self, t: _Trial) -> TrialOutcome:
        f = t.flags
        reason = decide_termination(
            cancelled=f.get("cancelled", False),
            setup_failed=f.get("setup_failed", False),
            engine_error=f.get("engine_error", False),
            proxy_error=f.get("proxy_error", False),
            verifier_timed_out=f.get("verifier_timed_out", False),
            verifier_failed=f.get("verifier_failed", False),
            context_overflow=f.get("context_overflow", False),
            max_turns_reached=f.get("max_turns_reached", False),
            agent_timed_out=f.get("agent_timed_out", False),
        )
        no_reward = reason in (TerminationReason.CANCELLED, TerminationReason.ENV_SETUP_FAILED)
        outcome = TrialOutcome(
            termination_reason=reason,
            reward=None if no_reward else t.reward,
            rewards={} if no_reward else t.rewards,
            timings=t.timings,
            num_segments=t.summary.num_segments,
            harness_exit_code=t.exit_code,
            tamper_events=t.tamper,
            error="; ".join(t.errors),
            events=t.events,
            verifier_summary=t.verifier_summary,
            artifacts_dir=str(t.artifacts),
            task_id=t.task_id,
            requested_models=sorted(t.summary.requested_models),
        )
        try:
            t.artifacts.mkdir(parents=True, exist_ok=True)
            (t.artifacts / "result.json").write_text(outcome.model_dump_json(indent=1))
        except OSError as e:
            # The worker still reports and finalizes the outcome; only the local copy is missing.
            log.exception("writing result.json failed", extra={"kv": {"trial": t.spec.trial_id}})
            outcome.error = "; ".join([*t.errors, f"result.json: {e}"])
        return outcome

    async def abandon(self, spec: TrialSpec) -> None:
        """Closes, best effort, the proxy trial of a dead attempt (its worker died
        mid-trial): its captured parts become durable and its token is refused."""
        if self.proxy is None:
            return
        try:
            await self.proxy.close(spec.trial_id)
        except HarnessError as e:
            log.info("closing a dead attempt failed", extra={"kv": {"trial": spec.trial_id, "error": str(e)}})

    async def finalized_outcome(self, spec: TrialSpec) -> TrialOutcome | None:
        """The outcome already finalized in the capture store under ``spec.trial_id``, if any."""
        return None if self.capture is None else await self.capture.finalized_outcome(spec.run_id, spec.trial_id)

    async def finalize(self, spec: TrialSpec, outcome: TrialOutcome) -> None:
        """FinalizeTrajectory on the capture store (after the proxy's close, which
        ``run`` already did). Called by whoever reports the trial done, and only
        while it still owns the trial. Raises if the capture store refuses.
        A trial with no model call (oracle, nop, a crashed harness) is finalized
        too, with no segments, so that its group completes."""
        if self.capture is None:
            return
        task_id = outcome.task_id or spec.task_id or Path(spec.task_path).name or "unknown"
        await self.capture.finalize(spec, task_id, outcome)

    # -- helpers ---------------------------------------------------------------
    @staticmethod
    def _fail(t: _Trial, flag: str, message: str) -> None:
        t.flags[flag] = True
        t.errors.append(message)
        log.info("trial phase failed", extra={"kv": {"trial": t.spec.trial_id, "flag": flag, "error": message}})

    async def _exec(self, t: _Trial, request: ExecRequest, cancel: asyncio.Event) -> ExecResult | None:
        """One phase's exec; a sandbox lost under it (its engine restarted, its
        container removed) ends the trial as an infrastructure failure."""
        assert t.sandbox is not None
        try:
            return await self.backend.exec(t.sandbox, request, cancel)
        except SandboxLost as e:
            self._fail(t, "setup_failed", f"{request.phase}: sandbox lost: {e}")
            return None

    @staticmethod
    def _record_exec(t: _Trial, name: str, result: ExecResult) -> None:
        t.artifacts.mkdir(parents=True, exist_ok=True)
        (t.artifacts / f"{name}.log").write_bytes(result.output)
        t.events += [f"{name}:{event}" for event in result.events()]
        meta = result.model_dump(exclude={"output"})
        (t.artifacts / f"{name}.json").write_text(json.dumps(meta, indent=1))


def _agent_env(sandbox: Sandbox, extra: dict[str, str]) -> dict[str, str]:
    """The env of the agent and verify phases: the task's (the image's, or the local layer's, whose
    PATH already starts from Docker's default) over Docker's default PATH, which applies alone only
    where a sandbox reports no PATH; then the harness's or verifier's own."""
    base = {"PATH": dockerfile.DEFAULT_PATH, "LANG": "C.UTF-8", "TERM": "dumb"}
    return {**base, **sandbox.env, "TMPDIR": "/tmp", **extra}
