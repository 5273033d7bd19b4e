"""Runs one trial through its phases and decides its one termination reason.

setup    load the task, start the sandbox (layer cache + workspace copy), register
         the trial with the proxy, write the harness's config
agent    run the unmodified harness; every process dies with the phase; then the
         proxy's close makes every segment durable and refuses the token
verify   as Harbor verifies, with every defence of invariant 6 (``runner_verify``)
         then /logs/artifacts (Harbor's publish folder) is collected, per step too
teardown stop the sandbox, keep the artifacts, FinalizeTrajectory on the capture store

A multi-step task ([[steps]], ``task_steps``) runs agent then verify once per step, in
order, in the same sandbox (the backend's ``next_step`` between them); the proxy's close
waits for the last step. The steps after one whose verifier gave no result, or whose
min_reward is not met, are skipped, as Harbor skips them; a step's verifier that failed
is the trial's verifier_error (invariant 5). The trial's rewards combine the steps'
(multi_step_reward_strategy), each step's kept in the outcome's ``steps``.

Errors inside a phase become termination reasons (``lifecycle.decide_termination``).
Whatever else a phase raises (a backend's upload, exec or download, a harness adapter's
bug) ends that phase, is logged with its traceback and becomes the phase's infrastructure
reason, its type and message in the outcome's error; teardown still runs and the outcome
(``result.json``) is still written, so a deterministic fault ends the trial instead of
crashing its worker into a retry. Which reason, per boundary:

setup     load, start, snapshot_pristine, (red-team) uploads  -> env_setup_failed
agent     (a later step's) next_step, harness uploads, the agent's exec -> env_setup_failed:
          the policy never got a fair run, so nothing afterwards is a reward
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
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from opentelemetry import context as otel_context

from harnessrl import telemetry, tls
from harnessrl.errors import HarnessError
from services.sandbox.backends.base import Backend, ExecRequest, Limits, Network, Phase, SandboxSpec
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.common.paths import TrialDirs
from services.sandbox.common.relay import UnixRelay
from services.sandbox.common.settings import Settings
from services.sandbox.harnesses import AgentContext, ModelAccess, get_harness
from services.sandbox.harnesses.agent_extras import run_setup as run_harness_setup
from services.sandbox.task import steps as task_steps
from services.sandbox.task import verifier_policy
from services.sandbox.task.model import Task, load_task
from services.sandbox.task.steps import Step, StepOutcome
from services.sandbox.trial import step_setup
from services.sandbox.trial import verify as runner_verify
from services.sandbox.trial.artifacts import collect as collect_artifacts
from services.sandbox.trial.artifacts import collect_published
from services.sandbox.trial.endpoints import CaptureFinalizer, ProxyAdmin
from services.sandbox.trial.healthcheck import wait_until_healthy
from services.sandbox.trial.lifecycle import TrialOutcome, TrialSpec, TrialState
from services.sandbox.trial.state import Trial, build_outcome, fallback_outcome, phase_env
from services.sandbox.trial.verify import run_exec

log = logging.getLogger(__name__)

StateCallback = Callable[[TrialState], Awaitable[None]]
_T = TypeVar("_T")
_TEARDOWN = "teardown"
# The flag an unexpected exception in each phase sets (None: the reason stands, the
# error is recorded). Why each: the module docstring.
_PHASE_FAILURE: dict[str, str | None] = {
    Phase.SETUP: "setup_failed",
    Phase.AGENT: "setup_failed",
    Phase.VERIFY: "verifier_failed",
    _TEARDOWN: None,
}


def _bookkeeping(t: Trial, what: str, fn: Callable[..., _T], *args: object) -> _T | None:
    """A multi-step trial's bookkeeping between its phases (``_phase`` guards those): a
    fault there (a bug, a value no step wrote) makes the trial's result unknowable, so it
    ends the trial once as verifier_error naming it, instead of escaping ``run`` into the
    worker's crash-retry path, where a deterministic fault would fail again."""
    try:
        return fn(*args)
    except Exception as e:  # broad: any fault here is one, see the docstring
        log.exception("trial bookkeeping raised", extra={"kv": {"trial": t.spec.trial_id, "what": what}})
        t.fail("verifier_failed", f"{what}: {type(e).__name__}: {e}")
        return None


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
        artifacts = self.settings.artifacts_dir
        if not self.settings.artifacts_flat:
            artifacts = artifacts / (spec.run_id or "_") / spec.trial_id
        t = Trial(spec=spec, dirs=dirs, artifacts=artifacts, trace_context=otel_context.get_current())

        async def enter(state: TrialState) -> None:
            if on_state is not None:
                await on_state(state)

        try:
            await enter(TrialState.SETUP)
            await self._phase(t, Phase.SETUP, self._setup(t))
            if t.task is not None and t.task.steps:
                await self._steps(t, t.task.steps, cancel, enter)
            else:
                if self._go_on(t, cancel):
                    await enter(TrialState.AGENT)
                    await self._phase(t, Phase.AGENT, self._agent(t, cancel))
                if self._go_on(t, cancel):
                    await enter(TrialState.VERIFY)
                    await self._phase(t, Phase.VERIFY, self._verify(t, cancel))
                await self._collect_published(t, "")
        finally:
            try:
                await enter(TrialState.TEARDOWN)
            finally:
                await self._phase(t, _TEARDOWN, self._teardown(t))
        t.flags["cancelled"] = t.flags.get("cancelled", False) or cancel.is_set()
        try:
            return build_outcome(t)
        except Exception as e:  # broad: any bug here must end the trial once, not crash-retry it
            log.exception("building the outcome raised", extra={"kv": {"trial": t.spec.trial_id}})
            return fallback_outcome(t, f"outcome: {type(e).__name__}: {e}")

    @classmethod
    async def _phase(cls, t: Trial, phase: str, work: Awaitable[None]) -> None:
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
            except Exception as e:  # broad: the module docstring's table (any fault ends the phase, once)
                log.exception("trial phase raised", extra={"kv": {"trial": t.spec.trial_id, "phase": phase}})
                span.record_exception(e)
                message = f"{phase}: {type(e).__name__}: {e}"
                flag = _PHASE_FAILURE[phase]
                if flag is None:
                    t.errors.append(message)
                else:
                    t.fail(flag, message)
            finally:
                setattr(t.timings, field_name, getattr(t.timings, field_name) + time.monotonic() - started)

    @staticmethod
    def _go_on(t: Trial, cancel: asyncio.Event) -> bool:
        if cancel.is_set():
            t.flags["cancelled"] = True
        return not (t.flags.get("cancelled") or t.flags.get("setup_failed"))

    # -- setup -----------------------------------------------------------------
    def _refuse_unreachable_verifier(self, task: Task, run: verifier_policy.VerifierRun) -> None:
        """A verifier that asks for a public network the backend cannot give would fail its
        apt-get or download and score 0: an infrastructure failure as a reward (invariant 5).
        Refused before anything starts, naming the setting to change."""
        missing = self.backend.public_verify_network_missing
        steps = (verifier_policy.for_step(run, None, s.config.verifier.network_mode) for s in task.steps)
        if missing and (run.public or any(step.public for step in steps)):
            raise EnvSetupError(
                f"task {task.task_id}: {missing}; its verifier asks for a public network ([verifier] network_mode, "
                "'public' unless the task says otherwise, as in Harbor), which this backend cannot give; or set "
                "the task's [verifier] network_mode = 'no-network' if its tests need none"
            )

    async def _setup(self, t: Trial) -> None:
        try:
            t.task = load_task(t.spec.task_path)
            if t.task.steps and not self.backend.runs_steps:
                raise EnvSetupError(
                    f"task {t.task.task_id}: [[steps]] (a multi-step task) does not run on the {self.backend.name} "
                    "backend (it has no next_step)"
                )
            # Refused before anything starts (an allowlist no backend can enforce).
            t.verifier = verifier_policy.resolve(t.task)
            self._refuse_unreachable_verifier(t.task, t.verifier)
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
            t.events += await wait_until_healthy(self.backend, t.sandbox, t.task)  # Harbor's, pre-agent
            await self.backend.snapshot_pristine(t.sandbox)
            if not self.settings.integrity.hide_tests_and_solution:
                # Defence switched off (red-team only): the agent phase sees both.
                await self.backend.upload(t.sandbox, t.task.tests_dir, t.sandbox.paths.tests)
                if t.task.solution_dir.is_dir():
                    await self.backend.upload(t.sandbox, t.task.solution_dir, t.sandbox.paths.solution)
        except HarnessError as e:
            t.fail("setup_failed", f"setup: {e}")

    async def _open_proxy(self, t: Trial) -> Path | None:
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
    async def _agent(self, t: Trial, cancel: asyncio.Event, step: Step | None = None, resume: bool = False) -> None:
        """The harness's run; for a step of a multi-step task, on the step's instruction and
        solution (``resume``: after an earlier step, in the sandbox it left, ``next_step``)."""
        assert t.task is not None and t.harness is not None and t.sandbox is not None
        sandbox, spec = t.sandbox, t.spec
        if resume:
            await self.backend.next_step(sandbox)
        task = t.task if step is None else t.task.for_step(step)
        if step is not None:  # the step's workdir/, its setup.sh, its healthcheck, as Harbor
            t.events += await step_setup.prepare(self.backend, sandbox, t.task, step)
        token = t.proxy_trial.token if t.proxy_trial else None
        base_url = None
        if t.proxy_trial is not None:
            base_url = f"http://127.0.0.1:{self.settings.proxy_port_in_sandbox}{t.proxy_trial.base_path}"
        ctx = AgentContext(
            trial_id=spec.trial_id,
            task=task,
            instruction=task.instruction,
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
            t.fail("setup_failed", f"harness setup: {e}")
            return
        task_timeout = (step.config.agent.timeout_sec if step else None) or t.task.config.agent.timeout_sec
        timeout = spec.agent_timeout_s or task_timeout or self.settings.default_agent_timeout_s
        request = ExecRequest(
            argv=command.argv,
            phase=Phase.AGENT,
            env=phase_env(sandbox, command.env),
            timeout_s=timeout,
            network=Network.PROXY_ONLY if base_url else Network.NONE,
            proxy_port=self.settings.proxy_port_in_sandbox if base_url else None,
            stdin=command.stdin,
        )
        result = await run_exec(self.backend, t, request, cancel)
        if result is None:
            return
        prefix = f"steps/{step.name}/" if step else ""
        t.record_exec(f"{prefix}agent", result)
        t.exit_code = result.exit_code
        t.flags["agent_timed_out"] = t.flags.get("agent_timed_out", False) or result.timed_out
        if step is not None:
            t.steps[-1].harness_exit_code, t.steps[-1].agent_timed_out = result.exit_code, result.timed_out
        else:
            await self._close_proxy(t)  # a multi-step trial's, after its last step
        try:
            await self.backend.download(sandbox, sandbox.paths.agent_logs, t.artifacts / f"{prefix}agent")
            await asyncio.to_thread(t.harness.collect_logs, ctx, t.artifacts / f"{prefix}harness")
        except Exception as e:
            # Artifacts only: the verifier, not these logs, decides the trial.
            log.warning("collecting the agent's logs failed", exc_info=True, extra={"kv": {"trial": spec.trial_id}})
            t.events.append(f"collecting the agent's logs failed: {type(e).__name__}: {e}")
        t.events += await collect_artifacts(self.backend, sandbox, task, t.artifacts / prefix)  # before verify

    async def _close_proxy(self, t: Trial) -> None:
        if not t.proxy_registered or self.proxy is None:
            return
        t.proxy_registered = False
        try:
            t.summary = await self.proxy.close(t.spec.trial_id)
        except HarnessError as e:
            # Segments may not be durable: an infrastructure failure, never a reward.
            t.fail("engine_error", f"proxy close: {e}")
            return
        except Exception as e:  # broad: whatever the close raised, segments may not be durable
            log.exception("proxy close raised", extra={"kv": {"trial": t.spec.trial_id}})
            t.fail("engine_error", f"proxy close: {type(e).__name__}: {e}")
            return
        summary = t.summary
        t.flags["engine_error"] = t.flags.get("engine_error", False) or summary.engine_error
        t.flags["context_overflow"] = summary.context_overflow
        t.flags["max_turns_reached"] = summary.max_turns_reached
        if summary.refused_requests or summary.proxy_errors:
            # The harness was refused by the proxy, not answered by the policy: whatever
            # the verifier says afterwards measures the proxy, never a reward.
            detail = "; ".join(summary.refusals) or "no detail"
            t.fail(
                "proxy_error",
                f"the proxy refused {summary.refused_requests} request(s) and failed {summary.proxy_errors}: {detail}",
            )
        if summary.num_turns == 0 and t.harness is not None and t.harness.model_access == ModelAccess.REQUIRED:
            t.events.append("agent:no_model_call")

    # -- verify ----------------------------------------------------------------
    async def _verify(self, t: Trial, cancel: asyncio.Event, step: Step | None = None) -> None:
        rewards = await runner_verify.verify(self.backend, self.settings, t, cancel, step)
        if step is not None:
            t.steps[-1].rewards, t.steps[-1].verified = rewards or {}, rewards is not None

    async def _collect_published(self, t: Trial, prefix: str) -> None:
        """/logs/artifacts after the verifier (its mount is live then in Harbor too): artifacts only."""
        if t.sandbox is None or t.task is None:
            return
        try:
            t.events += await collect_published(self.backend, t.sandbox, t.task, t.artifacts / prefix)
        except Exception as e:  # broad: artifacts only, never a reason (as the agent's logs)
            log.warning("collecting /logs/artifacts failed", exc_info=True, extra={"kv": {"trial": t.spec.trial_id}})
            t.events.append(f"collecting /logs/artifacts failed: {type(e).__name__}: {e}")

    # -- steps -----------------------------------------------------------------
    async def _steps(
        self, t: Trial, steps: tuple[Step, ...], cancel: asyncio.Event, enter: Callable[[TrialState], Awaitable[None]]
    ) -> None:
        """A multi-step task's agent and verify phases, step after step, as Harbor runs them."""
        assert t.task is not None
        for index, step in enumerate(steps):
            if not self._go_on(t, cancel):
                break
            record = StepOutcome(name=step.name)
            t.steps.append(record)
            started = (t.timings.agent_s, t.timings.verify_s)
            await enter(TrialState.AGENT)
            await self._phase(t, Phase.AGENT, self._agent(t, cancel, step, resume=index > 0))
            if self._go_on(t, cancel):
                await enter(TrialState.VERIFY)
                await self._phase(t, Phase.VERIFY, self._verify(t, cancel, step))
            record.agent_s, record.verify_s = t.timings.agent_s - started[0], t.timings.verify_s - started[1]
            await self._collect_published(t, f"steps/{step.name}/")
            if not record.verified:
                break  # as Harbor: no result, the rest is skipped (here the trial is an infra failure)
            failure = _bookkeeping(t, "steps", task_steps.min_reward_failure, record.rewards, step.config.min_reward)
            if t.flags.get("verifier_failed"):
                break
            if failure is not None and index + 1 < len(steps):
                t.events.append(f"step {step.name!r}: {failure}: the remaining steps are skipped (min_reward)")
                break
        await self._close_proxy(t)
        if t.steps and all(s.verified for s in t.steps) and not t.flags.get("verifier_failed"):
            _bookkeeping(t, "steps", self._combine_steps, t)

    def _combine_steps(self, t: Trial) -> None:
        assert t.task is not None
        combined = task_steps.combine(t.task.config.multi_step_reward_strategy, [s.rewards for s in t.steps])
        runner_verify.settle(t, combined, zero_if_suspicious=self.settings.integrity.suspicious == "zero")

    # -- teardown --------------------------------------------------------------
    async def _teardown(self, t: Trial) -> None:
        if t.sandbox is not None:
            try:
                await self.backend.stop(t.sandbox)
            except Exception as e:  # broad: the reward stands; a leaked sandbox is reaped by cleanup_orphans
                log.exception("stop failed", extra={"kv": {"trial": t.spec.trial_id}})
                t.errors.append(f"teardown: {type(e).__name__}: {e}")
        elif not self.settings.keep_trial_dirs:
            await asyncio.to_thread(shutil.rmtree, t.dirs.root, True)
        await self._close_proxy(t)
        if t.relay is not None:
            await t.relay.stop()
        if t.relay_dir is not None:
            await asyncio.to_thread(shutil.rmtree, t.relay_dir, True)

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
