"""Who runs ``tests/test.sh`` and what it may reach, as Harbor 0.26 decides it from the
task (the guard that keeps the agent from gaining from those privileges is
``defences/path_guard.py``).

Harbor (``trial/trial.py``, ``trial/network_policy.py``) verifies a single-step task
in the agent's own container (``environment_mode = "shared"``):

- **user**: ``[verifier] user`` when set, else the environment's default user, which
  is the image's ``USER`` (root for nearly every task image: Terminal-Bench's
  ``tests/test.sh`` begins with ``apt-get install``);
- **network**: ``[verifier] network_mode`` when set, else the environment's
  (``[environment] network_mode``, or the deprecated ``allow_internet``), whose
  default is ``public``. ``allowlist`` needs an egress proxy, which no backend here
  has: refused by name at setup, never run looser or (silently) stricter.

The agent runs as the sandbox user (uid 1000) with no network but the proxy, as
before; only the verify phase gains the task's identity and network. What the agent
left behind must not ride on them: ``revert_path_dirs`` reverts every change of the
agent's in a workspace directory on the verifier's ``PATH`` (a planted ``python3``
or ``pytest`` the verifier's script would run as root); on docker, the agent's
changes outside the workspace on the routes root follows (its PATH directories,
``ROOT_ROUTES``) are reverted too (``route_changes``, ``clear_script``), and set-id
bits of the agent's files cleared.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.sandbox.common.errors import EnvSetupError
from services.sandbox.task import dockerfile
from services.sandbox.task.model import NetworkMode, Task

# ExecRequest.user for "the image's default USER" (Harbor's verifier when [verifier] user is unset).
IMAGE_USER = ""


@dataclass(frozen=True)
class VerifierRun:
    """How the verify phase runs: ``user`` as ``ExecRequest.user`` takes it (``IMAGE_USER``
    or Harbor's ``[verifier] user``, a name or uid[:gid]); ``public`` network or none."""

    user: str
    public: bool


def resolve(task: Task) -> VerifierRun:
    """Harbor's verifier user and network for ``task``; raises EnvSetupError for what no
    backend can do (an allowlist), naming the field."""
    cfg, env = task.config.verifier, task.config.environment
    field = "[verifier] network_mode"
    mode = cfg.network_mode
    if mode is None:
        field, mode = "[environment] network_mode", env.network_mode or NetworkMode.PUBLIC
    if mode == NetworkMode.ALLOWLIST:
        raise EnvSetupError(
            f"task {task.task_id}: {field} = 'allowlist' (the verifier's network) is not supported: no backend "
            "here has an egress proxy to enforce allowed_hosts; use 'public' or 'no-network'"
        )
    user = IMAGE_USER if cfg.user is None else str(cfg.user)
    return VerifierRun(user=user, public=mode == NetworkMode.PUBLIC)


def is_root(user: str, image_user: str) -> bool:
    """Whether ``user`` (an ``ExecRequest.user``) is root, given the image's USER."""
    name = (image_user if user == IMAGE_USER else user).split(":")[0]
    return name in ("", "root", "0")


def verifier_path(sandbox_env: dict[str, str], task: Task) -> str:
    """The PATH ``tests/test.sh`` starts with (the runner's env order: image/layer, then [verifier] env)."""
    return task.config.verifier.env.get("PATH") or sandbox_env.get("PATH") or dockerfile.DEFAULT_PATH


def check_local_user(task: Task, run: VerifierRun, field: str = "[verifier] user") -> None:
    """The local backend has two identities: root (uid 0 in its user namespace) and the
    sandbox user (uid 1000). Any other ``[verifier] user`` (or a step's) is refused by name."""
    if run.user in (IMAGE_USER, "root", "0", "0:0", "1000", "1000:1000", "agent"):
        return
    raise EnvSetupError(
        f"task {task.task_id}: {field} = {run.user!r} is not supported by the local backend (it has root "
        "and uid 1000 only); use the docker backend"
    )


def for_step(run: VerifierRun, step_user: str | int | None, step_network: str | None = None) -> VerifierRun:
    """A step's verifier ([[steps]]): its own ``verifier.user`` and ``network_mode`` where set, else the
    task's (``run``), as Harbor (an 'allowlist' is refused when the task loads, ``task_steps``)."""
    user = run.user if step_user is None else str(step_user)
    public = run.public if step_network is None else step_network == NetworkMode.PUBLIC
    return VerifierRun(user=user, public=public)
