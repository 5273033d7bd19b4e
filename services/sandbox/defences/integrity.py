"""Reward integrity (invariant 6) on the worker's side of the sandbox wall:
one-commit git history, restoring the files that decide a verifier's outcome,
and reading the reward files strictly.

The other defences (no tests/solution/reward dir in the agent phase, no
network but the proxy, no agent process alive at verify) are how the backend
mounts and kills; see ``backends/local.py``.
"""

from __future__ import annotations

import asyncio
import filecmp
import fnmatch
import json
import math
import os
import shutil
import stat
from pathlib import Path

from services.sandbox.common.errors import VerifierError

_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "harnessrl",
    "GIT_AUTHOR_EMAIL": "harnessrl@localhost",
    "GIT_COMMITTER_NAME": "harnessrl",
    "GIT_COMMITTER_EMAIL": "harnessrl@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}
_LEFTOVER_SUFFIXES = (".orig", ".rej")
MAX_REWARD_FILE_BYTES = 64 * 1024
MAX_REWARD_KEYS = 64
MAX_REWARD_KEY_CHARS = 128


async def _git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(repo), **_GIT_ENV}
    proc = await asyncio.create_subprocess_exec(
        "git",
        # The worker may be root squashing a tree owned by the image's user.
        "-c",
        "safe.directory=*",
        "-C",
        str(repo),
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await proc.communicate(stdin)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {err.decode(errors='replace').strip()}")
    return out


async def squash_all_git(root: Path) -> int:
    """Squashes every repository under ``root`` (nested ones first, so a vendored
    repo's history does not survive inside the top one). Returns how many."""
    repos = await asyncio.to_thread(_git_roots, root)
    for repo in sorted(repos, key=lambda p: len(p.parts), reverse=True):
        await squash_git_history(repo)
    return len(repos)


def _git_roots(root: Path) -> list[Path]:
    found = []
    for current, dirs, files in os.walk(root):
        if ".git" in dirs or ".git" in files:
            found.append(Path(current))
        dirs[:] = [d for d in dirs if d != ".git"]
    return found


async def squash_git_history(repo: Path) -> bool:
    """Replaces ``repo/.git`` with a fresh repository whose only commit holds the
    files the original index tracked. Nothing of the old history survives: no
    packs, reflog, ORIG_HEAD, stash, tags, remotes, hooks or config; leftover
    ``*.orig``/``*.rej`` files are deleted. Returns False when ``repo`` has no git."""
    git_dir = repo / ".git"
    if not git_dir.exists() and not git_dir.is_symlink():
        return False
    try:
        tracked = (await _git(repo, "ls-files", "-z")).split(b"\0")
        branch = (await _git(repo, "symbolic-ref", "--short", "-q", "HEAD")).decode().strip() or "main"
    except RuntimeError:
        tracked, branch = [], "main"
    existing = await asyncio.to_thread(_drop_history, repo, tracked)
    await _git(repo, "init", "-q", "-b", branch)
    if existing:
        await _git(repo, "add", "-f", "--pathspec-from-file=-", "--pathspec-file-nul", stdin=b"\0".join(existing))
    else:
        await _git(repo, "add", "-A")
    await _git(repo, "commit", "-q", "--allow-empty", "--no-verify", "-m", "base")
    await _git(repo, "config", "user.name", "agent")
    await _git(repo, "config", "user.email", "agent@localhost")
    await asyncio.to_thread(_chown_like, git_dir, repo)
    return True


def _chown_like(tree: Path, owner_of: Path) -> None:
    """Gives ``tree`` the owner of ``owner_of`` (a root worker squashing a repo
    that the sandbox's user owns must not leave it a .git it cannot write)."""
    st = owner_of.stat()
    if os.geteuid() != 0 or (tree.stat().st_uid, tree.stat().st_gid) == (st.st_uid, st.st_gid):
        return
    for path in (tree, *tree.rglob("*")):
        os.lchown(path, st.st_uid, st.st_gid)


def _drop_history(repo: Path, tracked: list[bytes]) -> list[bytes]:
    """Deletes .git and untracked leftovers; returns the tracked paths still present."""
    git_dir = repo / ".git"
    if git_dir.is_dir() and not git_dir.is_symlink():
        shutil.rmtree(git_dir)
    else:
        git_dir.unlink()
    tracked_set = {t.decode(errors="surrogateescape") for t in tracked if t}
    for path in list(repo.rglob("*")):
        rel = path.relative_to(repo).as_posix()
        if path.name.endswith(_LEFTOVER_SUFFIXES) and rel not in tracked_set and path.is_file():
            path.unlink()
    return [t for t in tracked if t and (repo / t.decode(errors="surrogateescape")).exists()]


def _protected(rel: str, globs: tuple[str, ...], dirs: tuple[str, ...]) -> bool:
    parts = rel.split("/")
    if any(part in dirs for part in parts[:-1]):
        return True
    return any(fnmatch.fnmatch(parts[-1], pattern) for pattern in globs)


def walk_files(root: Path) -> dict[str, os.stat_result]:
    """Relative path -> lstat of every non-directory under root (skipping .git)."""
    found: dict[str, os.stat_result] = {}
    stack = [root]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            if entry.name == ".git" and current == root:
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(entry.path))
            else:
                found[Path(entry.path).relative_to(root).as_posix()] = st
    return found


def restore_protected(workspace: Path, pristine: Path, globs: tuple[str, ...], dirs: tuple[str, ...]) -> list[str]:
    """Makes every protected file of the workspace identical to the pristine
    snapshot: modified or deleted ones are restored, ones the agent added are
    removed. Returns one tamper event per change."""
    events: list[str] = []
    before = {rel: st for rel, st in walk_files(pristine).items() if _protected(rel, globs, dirs)}
    now = {rel: st for rel, st in walk_files(workspace).items() if _protected(rel, globs, dirs)}
    for rel in sorted(set(now) - set(before)):
        (workspace / rel).unlink(missing_ok=True)
        events.append(f"removed {rel} (added by the agent)")
    for rel in sorted(before):
        src, dst = pristine / rel, workspace / rel
        if replace_symlinked_parents(workspace, rel):
            events.append(f"restored {rel} (a parent directory was replaced by a symlink)")
        if rel not in now:
            events.append(f"restored {rel} (deleted)")
        elif stat.S_ISLNK(now[rel].st_mode) != stat.S_ISLNK(before[rel].st_mode) or not same_file(src, dst):
            events.append(f"restored {rel} (modified)")
        else:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        shutil.copy2(src, dst, follow_symlinks=False)
    return events


def same_file(a: Path, b: Path) -> bool:
    if a.is_symlink() or b.is_symlink():
        return a.is_symlink() and b.is_symlink() and os.readlink(a) == os.readlink(b)
    return filecmp.cmp(a, b, shallow=False)


def replace_symlinked_parents(root: Path, rel: str) -> bool:
    """Replaces each parent of ``rel`` that is a symlink or a file (the agent's) by nothing, so a
    restore writes into the workspace, never through a link. True when one was replaced."""
    current = root
    replaced = False
    for part in rel.split("/")[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            current.unlink()
            replaced = True
    return replaced


def read_rewards(verifier_dir: Path) -> dict[str, float]:
    """Every value the verifier wrote, read as Harbor 0.26's ``Verifier`` reads them
    (``harbor/verifier/verifier.py``): ``reward.json`` wins over ``reward.txt``; a JSON
    object keeps every key (``{"correctness": 1, "performance": 0}``); ``reward.txt``
    is ``{"reward": v}``. Missing, empty, non-numeric or non-finite is a VerifierError,
    never a 0. Where we differ from Harbor, on purpose (services/sandbox/README.md):

    - a bare number in ``reward.json`` is ``{"reward": v}`` (Harbor's ``VerifierResult``
      refuses it): it is unambiguous, and older tasks of ours write it;
    - ``true``/``false`` are refused (Harbor lets them through as 1/0, since a Python bool
      is an int): a grader that writes a bool meant a pass flag, say so with a number;
    - an empty object is refused here (Harbor records it and marks the trial's reward
      invalid, which is our verifier_error);
    - symlinks, files over 64 KiB, more than ``MAX_REWARD_KEYS`` keys or keys over
      ``MAX_REWARD_KEY_CHARS`` characters are refused (the verifier's dir is written by
      the task's tests; the keys travel to the capture store)."""
    json_file, txt_file = verifier_dir / "reward.json", verifier_dir / "reward.txt"
    if _regular(json_file):
        return _parse_json_rewards(_read_small(json_file))
    if _regular(txt_file):
        text = _read_small(txt_file).strip()
        if not text:
            raise VerifierError("reward.txt is empty")
        try:
            value = float(text)
        except ValueError as e:
            raise VerifierError(f"reward.txt is not a number: {text[:80]!r}") from e
        if not math.isfinite(value):
            raise VerifierError(f"reward.txt is not finite: {value}")
        return {"reward": value}
    raise VerifierError("the verifier wrote no reward file (reward.txt or reward.json)")


def select_reward(rewards: dict[str, float], key: str = "", weights: dict[str, float] | None = None) -> float | None:
    """The value that trains, as the run chose it (``TrialSpec.reward_key`` /
    ``reward_weights``): ``weights`` is the sum of weight x value over its keys (keys it
    does not name count 0); ``key`` is that key's value; neither is what Harbor reports
    as a trial's reward (``harbor/cli/jobs.py`` ``_primary_reward``): the key
    ``reward``, else the only key. Harbor has none for several keys without
    ``reward`` (it reports each key's mean), and neither has this: None. The verifier
    did its job, so the trial completes with every key kept and no scalar reward (a
    trainer counts it ``missing_reward``, never trains on it); a training run is refused
    before it starts instead (``multi_key_rewards``, preflight). A named key the verifier
    did not write is a VerifierError naming it and the keys present."""
    present = sorted(rewards)[:MAX_REWARD_KEYS]
    if weights:
        missing = sorted(set(weights) - set(rewards))
        if missing:
            raise VerifierError(
                f"reward_weights names {missing}, which the verifier did not write; keys present: {present}"
            )
        value = math.fsum(w * rewards[k] for k, w in weights.items())
        if not math.isfinite(value):
            raise VerifierError(f"the weighted reward is not finite: {value}")
        return value
    if key:
        if key not in rewards:
            raise VerifierError(f"reward_key {key!r} is not among the verifier's rewards; keys present: {present}")
        return rewards[key]
    if "reward" in rewards:
        return rewards["reward"]
    if len(rewards) == 1:
        return next(iter(rewards.values()))
    return None


def multi_key_rewards(rewards: dict[str, float]) -> list[str]:
    """The keys of ``rewards`` when no scalar follows from them without a run's choice
    (several keys, none named ``reward``); [] otherwise."""
    return sorted(rewards) if len(rewards) > 1 and "reward" not in rewards else []


def read_reward(verifier_dir: Path, key: str = "", weights: dict[str, float] | None = None) -> float | None:
    """The value that trains (``select_reward`` over ``read_rewards``)."""
    return select_reward(read_rewards(verifier_dir), key, weights)


def _regular(path: Path) -> bool:
    return path.exists() and not path.is_symlink() and path.is_file()


def _read_small(path: Path) -> str:
    if path.stat().st_size > MAX_REWARD_FILE_BYTES:
        raise VerifierError(f"{path.name} is larger than {MAX_REWARD_FILE_BYTES} bytes")
    try:
        return path.read_text()
    except UnicodeDecodeError as e:
        raise VerifierError(f"{path.name} is not UTF-8") from e


def _parse_json_rewards(text: str) -> dict[str, float]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise VerifierError(f"reward.json is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        return {"reward": _number(data, "reward.json")}
    if not data:
        raise VerifierError("reward.json is an empty object: the verifier wrote no reward")
    if len(data) > MAX_REWARD_KEYS:
        raise VerifierError(f"reward.json has {len(data)} keys; at most {MAX_REWARD_KEYS}")
    rewards = {}
    for key, value in data.items():
        if not key or len(key) > MAX_REWARD_KEY_CHARS or not key.isprintable():
            raise VerifierError(f"reward.json key {key[:80]!r}: 1-{MAX_REWARD_KEY_CHARS} printable characters")
        rewards[key] = _number(value, f"reward.json key {key!r}")
    return rewards


def _number(value: object, where: str) -> float:
    """A JSON number, finite; bools, strings, null, arrays and objects are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VerifierError(f"{where} is not a number: {json.dumps(value)[:80]}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond a float's range
        number = math.inf
    if not math.isfinite(number):
        raise VerifierError(f"{where} is not finite: {str(value)[:80]}")
    return number
