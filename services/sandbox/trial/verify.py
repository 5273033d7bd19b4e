"""The verify phase, as Harbor verifies, with every defence of invariant 6, once per trial
or once per step of a multi-step task (``task_steps``).

tests/test.sh runs as the task's verifier user (the image's USER, root for most images)
with the task's verifier network (``verifier_policy``); the agent kept uid 1000 and the
proxy alone. Before it: the backend's fresh verify sandbox (docker), protected files
restored and the agent's plants on the verifier's routes reverted (tamper events), fresh
pristine tests (a step's: tests/ overlaid with steps/NAME/tests/, as Harbor uploads them);
the reward is read strictly (missing or invalid is verifier_error, never 0).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from services.sandbox.backends.base import Backend, ExecRequest, ExecResult, Network, Phase, SandboxSpec
from services.sandbox.common.errors import SandboxLost, VerifierError
from services.sandbox.common.settings import Settings
from services.sandbox.defences import integrity, module_shadow, runner_guard, suspicious
from services.sandbox.task import verifier_policy
from services.sandbox.task.steps import Step
from services.sandbox.trial import artifacts
from services.sandbox.trial.state import Trial, phase_env

SUMMARY_BYTES = 4000


async def run_exec(backend: Backend, t: Trial, request: ExecRequest, cancel: asyncio.Event) -> ExecResult | None:
    """One phase's exec; a sandbox lost under it (its engine restarted, its container
    removed) ends the trial as an infrastructure failure."""
    assert t.sandbox is not None
    try:
        return await backend.exec(t.sandbox, request, cancel)
    except SandboxLost as e:
        t.fail("setup_failed", f"{request.phase}: sandbox lost: {e}")
        return None


async def verify(
    backend: Backend, settings: Settings, t: Trial, cancel: asyncio.Event, step: Step | None = None
) -> dict[str, float] | None:
    """Runs the verifier of the trial (or of ``step``) and returns every reward it wrote;
    None when it gave none (the failure is flagged on ``t``). A single-step trial's
    rewards and trained reward are set on ``t`` here; a step's, by the caller."""
    assert t.task is not None and t.sandbox is not None and t.verifier is not None
    sandbox, cfg = t.sandbox, t.task.config.verifier
    policy = settings.integrity
    # Harbor's identity and network for the verifier, never the agent's (which kept uid
    # 1000 and the proxy alone); the backend readies its sandbox for them first.
    # A step's own verifier user and network where it sets them, as Harbor.
    own = step.config.verifier if step else None
    run = verifier_policy.for_step(t.verifier, own.user, own.network_mode) if own else t.verifier
    network = Network.PUBLIC if run.public else Network.NONE
    t.tamper += await backend.prepare_verify(sandbox, run.user, network)
    t.tamper += await asyncio.to_thread(artifacts.drop_planted, sandbox.spec.dirs.published)
    # Harbor's order: [verifier] env, then the step's.
    env = {**phase_env(sandbox, {}), **cfg.env, **(step.config.verifier.env if step else {})}
    imports = module_shadow.VerifierImports()
    if policy.guard_runner_routes:
        probed = await _verifier_imports(backend, t, env, run.user, cancel)
        if probed is None:
            return None
        imports = probed
    if policy.restore_pristine_files or policy.guard_runner_routes or policy.guard_verifier_path:
        events = await backend.restore_protected(sandbox, imports)
        t.tamper += [e for e in events if not suspicious.is_event(e)]
        # A multi-step trial's later steps see the earlier steps' change again: counted once.
        t.suspicious += [e for e in events if suspicious.is_event(e) and e not in t.suspicious]
    tests = t.task.tests_dir if step is None else await asyncio.to_thread(_step_tests, sandbox.spec, step)
    await backend.upload(sandbox, tests, sandbox.paths.tests)
    # A step's own timeout (Harbor's default 600 s when unset), never the task's [verifier] one.
    timeout = step.config.verifier.timeout_sec if step else cfg.timeout_sec
    request = ExecRequest(
        argv=["/bin/bash", str(sandbox.paths.tests / "test.sh")],
        phase=Phase.VERIFY,
        env=runner_guard.verifier_env(env) if policy.harden_verifier_env else env,
        timeout_s=t.spec.verifier_timeout_s or timeout or settings.default_verifier_timeout_s,
        network=network,
        user=run.user,
    )
    result = await run_exec(backend, t, request, cancel)
    if result is None:
        return None
    prefix = f"steps/{step.name}/" if step else ""
    t.record_exec(f"{prefix}verifier", result)
    t.verifier_summary = result.output.decode(errors="replace")[-SUMMARY_BYTES:]
    if cancel.is_set():
        t.flags["cancelled"] = True
        return None
    where = f"step {step.name!r}: " if step else ""
    if result.timed_out:
        t.fail("verifier_timed_out", f"{where}verifier ran past {request.timeout_s}s")
        return None
    detail = f" (test.sh exited {result.exit_code})" if result.exit_code else ""
    try:
        verifier_dir = t.artifacts / f"{prefix}verifier"
        await backend.download(sandbox, sandbox.paths.verifier_logs, verifier_dir)
        rewards = integrity.read_rewards(verifier_dir)
    except (VerifierError, FileNotFoundError) as e:
        t.fail("verifier_failed", f"{where}verifier: {e}{detail}")
        return None
    if step is None:
        settle(t, rewards, detail, zero_if_suspicious=policy.suspicious == "zero")
    return rewards


async def _verifier_imports(
    backend: Backend, t: Trial, env: dict[str, str], user: str, cancel: asyncio.Event
) -> module_shadow.VerifierImports | None:
    """What the verifier's Python imports from outside the workspace, asked of the sandbox
    itself as the verifier, before it runs (``module_shadow``); None when the sandbox was
    lost. A probe that answers nothing (no Python in the image) leaves the worker's stdlib
    names to ``runner_guard``, and says so in an event."""
    assert t.sandbox is not None
    workdir = t.sandbox.paths.workdir
    probe_env = {**env, "PATH": module_shadow.path_outside(env.get("PATH", "/usr/bin:/bin"), workdir)}
    request = ExecRequest(
        argv=module_shadow.probe_command(workdir),
        phase=Phase.VERIFY,
        env=probe_env,
        timeout_s=module_shadow.PROBE_TIMEOUT_S,
        network=Network.NONE,
        user=user,
    )
    result = await run_exec(backend, t, request, cancel)
    if result is None:
        return None
    imports = module_shadow.parse(result.output)
    if not imports.pythons:
        why = "it timed out" if result.timed_out else f"exit {result.exit_code}"
        t.events.append(
            f"verifier imports probe: no Python interpreter answered in the sandbox ({why}); no name is guarded "
            "from module shadowing (a Python that test.sh installs later is not probed)"
        )
    return imports


def settle(t: Trial, rewards: dict[str, float], detail: str = "", zero_if_suspicious: bool = False) -> None:
    """The trial's rewards, and the one of them (or the weighted sum) the run trains on;
    0 when the detector flagged the agent's change and the policy says "zero" (``rewards``
    keep what the verifier wrote)."""
    t.rewards = rewards
    try:
        t.reward = integrity.select_reward(rewards, t.spec.reward_key, t.spec.reward_weights)
    except VerifierError as e:
        t.fail("verifier_failed", f"verifier: {e}{detail}")
        return
    if zero_if_suspicious and t.suspicious and t.reward:
        t.events.append(f"reward {t.reward} zeroed: {len(t.suspicious)} suspicious event(s) (suspicious = zero)")
        t.reward = 0.0


def _step_tests(spec: SandboxSpec, step: Step) -> Path:
    """The step's /tests on the worker: the task's tests/, then the step's own over them."""
    merged = spec.dirs.root / "step-tests" / step.name
    shutil.rmtree(merged, ignore_errors=True)
    merged.mkdir(parents=True)
    for source in step.tests_dirs:
        shutil.copytree(source, merged, symlinks=True, dirs_exist_ok=True)
    return merged
