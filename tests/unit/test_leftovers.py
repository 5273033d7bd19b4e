"""The session's leftover check (tests/leftovers.py) finds what this session started,
including what a daemonised child started in turn, and nothing of anyone else's."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from tests import leftovers


def test_finds_the_sessions_processes_and_their_children_only() -> None:
    ours = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"],
        start_new_session=True,
    )
    foreign_env = {k: v for k, v in os.environ.items() if k != leftovers.SESSION_ENV}
    foreign = subprocess.Popen(["sleep", "60"], env=foreign_env, start_new_session=True)
    tree: list[psutil.Process] = []
    try:
        for _ in range(50):
            tree = [psutil.Process(ours.pid), *psutil.Process(ours.pid).children()]
            if len(tree) == 2:
                break
            time.sleep(0.1)
        found = {p.pid for p in leftovers.find()}  # the session's servers may be among them too
        assert {p.pid for p in tree} <= found and len(tree) == 2
        assert foreign.pid not in found
    finally:
        for proc in (*tree, psutil.Process(foreign.pid)):
            proc.kill()
        ours.wait(10)
        foreign.wait(10)
    assert not {p.pid for p in tree} & {p.pid for p in leftovers.find()}
