"""Helpers of the sandbox tests: write Harbor tasks into a temporary directory
and settings whose trial dirs, layer cache and artifacts live under it."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

from services.sandbox.lifecycle import TrialRecord, TrialState
from services.sandbox.queue.base import TrialQueue
from services.sandbox.settings import IntegrityPolicy, Settings

DEFAULT_TOML = """\
schema_version = "1.4"

[task]
name = "test/{name}"

[agent]
timeout_sec = 30

[verifier]
timeout_sec = 30

[environment]
memory_mb = 512
storage_mb = 64
"""

PASS_IF_HELLO = """\
#!/bin/bash
if [ "$(cat /app/hello.txt 2>/dev/null)" = "hello" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def make_task(
    root: Path,
    name: str = "t",
    *,
    toml: str | None = None,
    instruction: str = "Write hello to hello.txt.",
    dockerfile: str = "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY README.md /app/README.md\n",
    context: dict[str, str] | None = None,
    test_sh: str = PASS_IF_HELLO,
    tests: dict[str, str] | None = None,
    solve_sh: str | None = "#!/bin/bash\necho hello > hello.txt\n",
) -> Path:
    """A task directory; ``context`` files go into environment/, ``tests`` into tests/."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text((toml if toml is not None else DEFAULT_TOML).format(name=name))
    (task / "instruction.md").write_text(instruction)
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    for rel, text in {"README.md": "# repo\n", **(context or {})}.items():
        path = task / "environment" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (task / "tests" / "test.sh").write_text(test_sh)
    for rel, text in (tests or {}).items():
        (task / "tests" / rel).write_text(text)
    if solve_sh is not None:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(solve_sh)
    return task


def settings_for(tmp: Path, integrity: IntegrityPolicy | None = None, **overrides: Any) -> Settings:
    fields: dict[str, Any] = {
        "work_dir": tmp / "trials",
        "cache_dir": tmp / "cache",
        "artifacts_dir": tmp / "artifacts",
        "default_agent_timeout_s": 30,
        "default_verifier_timeout_s": 30,
        **overrides,
    }
    if integrity is not None:
        fields["integrity"] = integrity
    return Settings(**fields)


async def wait_for_state(queue: TrialQueue, trial_id: str, state: TrialState, timeout_s: float = 120) -> TrialRecord:
    """Follows the queue's watch stream until the trial reaches ``state`` (or DONE)."""

    async def follow() -> TrialRecord:
        async for record in queue.watch("", [trial_id]):
            if record.state == state or record.state == TrialState.DONE:
                return record
        raise AssertionError("watch ended")

    return await asyncio.wait_for(follow(), timeout_s)
