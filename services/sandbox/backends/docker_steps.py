"""Between the steps of a multi-step task ([[steps]]) on docker: the next agent phase in a
new agent container made from the filesystem the last verifier left.

Harbor verifies each step in the agent's own container (a shared verifier), so the next
step continues on what the verifier left there, less its tests and outputs (Harbor empties
/tests and /logs/verifier before the next agent phase). Here each verify runs in a fresh
container made from a commit of the agent's (``DockerBackend.prepare_verify``: no agent
process lives on into a root verifier, and only that container may have a network); so the
next step commits the verifier's container in turn, after root removed the verify phase's
own files, and starts the agent's container again from it: the agent's user, ``--network
none`` (or the compose services' namespace), the harness's read-only mounts, its HOME and
/logs/agent, exactly as at start. Every commit is labelled as a verifier's, so a dead
worker's are reaped with them; the trial's are removed at stop, newest first."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from docker.errors import APIError
from requests.exceptions import RequestException

from services.sandbox.backends.base import empty_dir
from services.sandbox.backends.docker_exec import ContainerExec, worker_identity
from services.sandbox.backends.docker_specs import (
    LABEL_MANAGED,
    LABEL_TRIAL,
    LABEL_VERIFY,
    LABEL_WORKER,
    container_spec,
    setup_script,
)
from services.sandbox.common.errors import EnvSetupError

if TYPE_CHECKING:
    from services.sandbox.backends.base import Sandbox
    from services.sandbox.backends.docker import DockerBackend

# What the verify phase put in the sandbox, none of it the next agent's to see.
VERIFY_LEFTOVERS = "rm -rf /tests /solution /logs/verifier /run/harnessrl-verify"


async def next_agent_container(backend: DockerBackend, sandbox: Sandbox) -> None:
    handle, spec = sandbox.handle, sandbox.spec
    assert isinstance(handle, ContainerExec)
    await handle.root(VERIFY_LEFTOVERS)
    for bound in (spec.dirs.agent_logs, spec.dirs.published):  # bind-mounted: as Harbor moves them away
        await asyncio.to_thread(empty_dir, bound)
    if not backend.integrity.kill_agent_processes:
        return  # red-team only: the verifier ran in the agent's own container, which goes on
    labels = {LABEL_MANAGED: "true", LABEL_TRIAL: spec.trial_id, LABEL_WORKER: worker_identity(), LABEL_VERIFY: "true"}
    image = await backend._api(handle.container.commit, conf={"Labels": labels})
    # Each verify's commit is this one's parent: both go at stop, the newest first.
    handle.step_images += [c for c in (handle.verify_image, image.id) if c]
    handle.verify_image = ""
    await backend._api(handle.container.remove, force=True, v=True)
    network_mode = handle.services.network_mode if handle.services is not None else None
    kwargs = container_spec(
        spec,
        image.id,
        str(sandbox.paths.workdir),
        isolate_network=backend.integrity.isolate_network,
        disk_quota=backend.disk_quota,
        network_mode=network_mode,
    )
    try:
        container = await asyncio.to_thread(backend.client.containers.create, **kwargs)
    except (APIError, RequestException) as e:
        raise EnvSetupError(f"sandbox {spec.trial_id}: the next step's agent container create failed: {e}") from e
    handle.container, handle.events = container, None
    await backend._api(container.start)
    await backend._api(container.reload)
    script = setup_script(spec.ro_mounts, [], protect_reward_files=backend.integrity.protect_reward_files)
    if script:
        await handle.root(script)
