"""Typed errors of the sandbox service. Each maps to a gRPC/HTTP status through
``harnessrl.errors``; the runner maps the ones raised inside a trial to a
termination reason instead (see ``lifecycle.decide_termination``)."""

from __future__ import annotations

from harnessrl.errors import FailedPrecondition, HarnessError, InvalidArgument, NotFound


class TaskError(InvalidArgument):
    """A task directory is not a valid Harbor task; the message names the task and the field."""

    def __init__(self, task: str, message: str) -> None:
        super().__init__(f"task {task}: {message}")
        self.task = task


class UnknownName(InvalidArgument):
    """A registry lookup failed; the message lists the valid names."""


class TrialNotFound(NotFound):
    pass


class EnvSetupError(HarnessError):
    """The environment could not be built or started (termination reason env_setup_failed)."""


class SandboxLost(EnvSetupError):
    """The sandbox went away under a trial (its engine restarted, its container was
    removed): an infrastructure failure, env_setup_failed with weight 0."""


class ContainerEngineError(EnvSetupError):
    """The container engine (Docker) refused or did not answer a call that set up a trial,
    not through the task's fault (an engine that is down, an internal error): an
    infrastructure failure, env_setup_failed with weight 0. The message names the engine
    and its answer."""


class UnsupportedInstruction(EnvSetupError):
    """A Dockerfile instruction the local backend cannot replay."""


class BackendUnavailable(FailedPrecondition):
    """The backend's engine (bwrap, Docker, Kubernetes) is not usable on this machine."""


class CapabilityError(FailedPrecondition):
    """A backend lacks a capability its settings or the task require."""


class VerifierError(HarnessError):
    """The verifier crashed or wrote no valid reward (termination reason verifier_error)."""


class LeaseLost(HarnessError):
    """This worker no longer holds the trial's lease; its result must be discarded."""
