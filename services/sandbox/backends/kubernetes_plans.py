"""The shell plans the Kubernetes backend runs in a trial pod's containers
(POSIX sh, coreutils or busybox: what any image with a shell has), and the
worker-side half of its file copies. Pure functions, unit-tested."""

from __future__ import annotations

import io
import math
import os
import re
import shlex
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from services.sandbox.backends.base import ExecRequest
from services.sandbox.backends.kubernetes_manifests import HELPER_ROOT, Volume
from services.sandbox.common import tarsafe

# $1 cwd, $2 stdin file ("" for none), then the command.
_RUN = 'cd "$1" || exit 127; in="$2"; shift 2; if [ -n "$in" ]; then exec "$@" < "$in"; fi; exec "$@" < /dev/null'


def exec_argv(request: ExecRequest, *, cwd: str, env: dict[str, str], stdin_path: str | None) -> list[str]:
    """The argv of a phase's command in its container: the worker's environment
    exactly (``env -i``), its cwd and stdin, a hard kill at the timeout."""
    timeout = str(max(1, math.ceil(request.timeout_s)))
    assignments = [f"{k}={v}" for k, v in sorted(env.items())]
    plan = ["sh", "-c", _RUN, "sh", cwd, stdin_path or "", "timeout", "-s", "KILL", timeout]
    return [*plan, "env", "-i", *assignments, *request.argv]


def sweep_script(kill: bool) -> str:
    """Run in a phase's container after its command: kills every process of the
    container's uid but pid 1 (until none is left; zombies of pid 1 do not count),
    then prints ``leftovers=N oom=M`` (M: the container cgroup's OOM kills)."""
    count = (
        'n=0; for p in /proc/[0-9]*; do p=${p#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] || {'
        ' read -r s 2>/dev/null < /proc/$p/stat || continue; s=${s##*) }; [ "${s%% *}" = Z ] || n=$((n+1)); }; done'
    )
    lines = [count, "first=$n"]
    if kill:
        lines.append(
            f"i=0; while [ $n -gt 0 ] && [ $i -lt 50 ]; do kill -9 -1 2>/dev/null; sleep 0.1; {count}; i=$((i+1)); done"
        )
    lines.append(
        "oom=$( (grep -s '^oom_kill ' /sys/fs/cgroup/memory.events || grep -s '^oom_kill ' "
        "/sys/fs/cgroup/memory/memory.oom_control) | { read -r _ v; echo ${v:-0}; })"
    )
    lines.append('echo "leftovers=$first left=$n oom=$oom"')
    return "; ".join(lines)


def parse_sweep(out: str) -> dict[str, int]:
    found = dict(re.findall(r"(leftovers|left|oom)=(\d+)", out))
    return {k: int(v) for k, v in found.items()}


def upload_script(target: PurePosixPath, volume_root: bool, size: int, owner: int) -> str:
    """Reads exactly ``size`` bytes of tar from stdin (no EOF needed, so it works
    on every exec protocol) into ``target``; a volume's root is emptied, not removed."""
    t = shlex.quote(str(target))
    if volume_root:
        prepare, into = f"find {t} -mindepth 1 -delete", t
    else:
        parent = shlex.quote(str(target.parent))
        prepare, into = f"mkdir -p {parent} && rm -rf {t}", parent
    return f"set -e; {prepare}; head -c {size} | tar xf - -C {into}; chown -R {owner}:{owner} {t}"


def download_script(source: PurePosixPath) -> str:
    """A one-byte kind (``d`` directory, ``f`` anything else) then a tar: a
    directory's contents, or the single entry named like ``source``."""
    s, parent = shlex.quote(str(source)), shlex.quote(str(source.parent))
    return (
        f"if [ -d {s} ] && [ ! -L {s} ]; then printf d; exec tar cf - -C {s} .; "
        f"elif [ -e {s} ] || [ -L {s} ]; then printf f; exec tar cf - -C {parent} {shlex.quote(source.name)}; "
        f"else echo 'no such file' >&2; exit 44; fi"
    )


def unpack_download(data: bytes, dst: Path) -> None:
    """Unpacks what ``download_script`` wrote so that it lands at ``dst``. The
    ``tar`` filter keeps symlinks (repos have absolute ones) and refuses any
    member that would land outside ``dst``."""
    kind, body = data[:1], data[1:]
    dst.parent.mkdir(parents=True, exist_ok=True)
    if kind == b"d":
        dst.mkdir(exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            tarsafe.extractall(tar, dst, "tar")
        return
    if kind != b"f":
        raise tarfile.TarError(f"unexpected download header {kind!r}")
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp, tarfile.open(fileobj=io.BytesIO(body)) as tar:
        tops = [m for m in tar.getmembers() if "/" not in m.name.strip("/")]
        if len(tops) != 1:
            raise tarfile.TarError(f"expected one entry, got {len(tops)}")
        member = tops[0]
        tarsafe.extractall(tar, Path(tmp), "tar")
        os.replace(Path(tmp) / member.name, dst)


def verify_prep_script(table: list[Volume], verifier_uid: int, fresh_reward_dir: bool) -> str:
    """Before verify: the workspace and the tests belong to the verifier, and
    /logs/verifier is emptied (the agent never mounted it) and owned by it alone."""
    owned = " ".join(str(HELPER_ROOT / v.name) for v in table if v.name in ("workspace", "tests", "verifier-home"))
    logs = HELPER_ROOT / "verifier-logs"
    steps = [f"chown -R {verifier_uid}:{verifier_uid} {owned}"]
    if fresh_reward_dir:
        steps.insert(0, f"find {logs} -mindepth 1 -delete")
    steps.append(f"chown {verifier_uid}:{verifier_uid} {logs} && chmod 0755 {logs}")
    return "set -e; " + "; ".join(steps)


# Emptied between the steps of a multi-step task: the verify phase's tests and reward files,
# the last agent's logs (kept per step on the worker) and its published files (collected).
STEP_EMPTIED = ("tests", "verifier-logs", "agent-logs", "artifacts")


def next_step_script(agent_uid: int) -> str:
    """Between the steps of a multi-step task ([[steps]]), before the next agent phase: what
    the verify phase had (its tests, its reward dir) and the last agent's logs and published
    files are emptied, and the workspace (the verifier's since ``verify_prep_script``) is the
    agent's again; the verifier's HOME and every other volume stay as the last step left them."""
    emptied = " ".join(str(HELPER_ROOT / name) for name in STEP_EMPTIED)
    return f"set -e; find {emptied} -mindepth 1 -delete; chown -R {agent_uid}:{agent_uid} {HELPER_ROOT / 'workspace'}"
