"""Not collected by the suite (no ``test_`` prefix): ``test_interrupted_run.py`` runs it
in a pytest of its own and interrupts that run once the fixtures' servers are up."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from harnessrl.localservers import DockerEngine, RedisServer, S3Server


def test_holds_the_servers_until_interrupted(
    redis_server: RedisServer, s3_server: S3Server, docker_daemon: DockerEngine
) -> None:
    servers = {"redis": redis_server.proc, "s3": s3_server.proc, "dockerd": docker_daemon.proc}
    pids = {name: proc.pid for name, proc in servers.items() if proc is not None}
    ready = Path(os.environ["HRL_INTERRUPT_READY"])
    ready.with_suffix(".tmp").write_text(json.dumps({"worker": os.getpid(), "servers": pids}))
    ready.with_suffix(".tmp").rename(ready)
    time.sleep(600)  # the run is interrupted here
