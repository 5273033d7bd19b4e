"""Worker-side integrity: git history squash, protected-file restore, strict reward reading."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from services.sandbox.common.errors import VerifierError
from services.sandbox.common.settings import IntegrityPolicy
from services.sandbox.defences import integrity, runner_guard

FIX = "def add(a, b):\n    return a + b  # THE-FIX\n"
BUG = "def add(a, b):\n    return a - b\n"


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x", "GIT_COMMITTER_NAME": "x", "GIT_COMMITTER_EMAIL": "x@x"}
    import os

    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout


def repo_with_a_leaky_history(root: Path) -> Path:
    """HEAD has the bug; the fix lives in history, a tag, a stash, a remote ref,
    the reflog, ORIG_HEAD, a pack and a .orig file."""
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text(FIX)
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "fix")
    git(repo, "tag", "v-fixed")
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    (repo / "calc.py").write_text(BUG)
    git(repo, "commit", "-qam", "reintroduce the bug")
    (repo / "calc.py").write_text(FIX.replace("FIX", "FIX-STASHED"))
    git(repo, "stash", "-q")
    git(repo, "gc", "-q")
    git(repo, "reset", "-q", "--hard", "HEAD")
    (repo / ".git" / "ORIG_HEAD").write_text(git(repo, "rev-parse", "v-fixed"))
    (repo / "calc.py.orig").write_text(FIX)
    (repo / "build.log").write_text("ignored but present\n")
    return repo


async def test_squash_leaves_one_commit_and_no_original_object(tmp_path: Path) -> None:
    repo = repo_with_a_leaky_history(tmp_path)
    assert "THE-FIX" in git(repo, "log", "--all", "-p")
    assert await integrity.squash_git_history(repo)
    assert git(repo, "rev-list", "--all").count("\n") == 1
    assert git(repo, "log", "--format=%s") == "base\n"
    assert git(repo, "for-each-ref").count("\n") == 1  # refs/heads/main only
    assert git(repo, "stash", "list") == ""
    assert not (repo / ".git" / "ORIG_HEAD").exists()
    assert not (repo / "calc.py.orig").exists()
    assert (repo / "build.log").exists() and git(repo, "status", "--porcelain") == ""
    objects = git(repo, "cat-file", "--batch-all-objects", "--batch-check").splitlines()
    assert len(objects) == 4  # commit, tree, calc.py, .gitignore
    contents = "".join(git(repo, "cat-file", "-p", line.split()[0]) for line in objects)
    assert "THE-FIX" not in contents and "a - b" in contents
    assert not list((repo / ".git").rglob("*.pack"))
    assert (repo / "calc.py").read_text() == BUG


async def test_nested_repositories_are_squashed_too(tmp_path: Path) -> None:
    outer = tmp_path / "ws"
    outer.mkdir()
    (outer / "main.py").write_text("print(1)\n")
    (outer / "vendor").mkdir()
    nested = repo_with_a_leaky_history(outer / "vendor")
    git(outer, "init", "-q", "-b", "main")
    assert await integrity.squash_all_git(outer) == 2
    assert await integrity.squash_all_git(tmp_path / "nothing-here") == 0
    for repo in (outer, nested):
        contents = "".join(
            git(repo, "cat-file", "-p", line.split()[0])
            for line in git(repo, "cat-file", "--batch-all-objects", "--batch-check").splitlines()
        )
        assert "THE-FIX" not in contents
    assert git(nested, "rev-list", "--all").count("\n") == 1


async def test_squash_without_git_is_a_no_op(tmp_path: Path) -> None:
    assert not await integrity.squash_git_history(tmp_path)


def _restore(ws: Path, pristine: Path) -> list[str]:
    """Every file defence of the default policy (test files, then the runner's routes)."""
    return runner_guard.restore_for_verify(ws, pristine, IntegrityPolicy())


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_restore_undoes_every_kind_of_tampering(tmp_path: Path) -> None:
    files = {
        "calc.py": BUG,
        "tests/test_calc.py": "def test(): assert False\n",
        "tests/data/expected.txt": "42\n",
        "pyproject.toml": "[tool.pytest.ini_options]\n",
        "pkg/test_util.py": "def test(): pass\n",
    }
    pristine = _tree(tmp_path / "pristine", files)
    ws = _tree(tmp_path / "ws", files)
    (ws / "calc.py").write_text(FIX)  # the agent's real work: kept
    (ws / "tests" / "test_calc.py").write_text("def test(): pass\n")
    (ws / "tests" / "data" / "expected.txt").unlink()
    (ws / "conftest.py").write_text("# forces a pass\n")
    (ws / "sitecustomize.py").write_text("import os\n")
    (ws / "evil.pth").write_text("import os\n")
    (ws / "pytest.ini").write_text("[pytest]\n")
    (ws / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-p no:x'\n")
    (ws / "tests" / "test_new.py").write_text("import calc\n")
    (ws / "notes.md").write_text("free to add\n")
    events = _restore(ws, pristine)
    assert (ws / "calc.py").read_text() == FIX
    assert (ws / "notes.md").exists()
    for rel, text in files.items():
        if rel != "calc.py":
            assert (ws / rel).read_text() == text, rel
    assert "removed tests/test_new.py (added by the agent)" in events
    for added, route in [
        ("conftest.py", "conftest"),
        ("sitecustomize.py", "startup"),
        ("evil.pth", "startup"),
        ("pytest.ini", "config"),
    ]:
        assert not (ws / added).exists()
        assert f"removed {added} (added; {route})" in events
    assert "restored tests/test_calc.py (modified)" in events
    assert "restored tests/data/expected.txt (deleted)" in events
    assert "restored pyproject.toml (modified; config)" in events
    assert _restore(ws, pristine) == []  # idempotent: nothing left to undo


def test_restore_replaces_a_symlinked_tests_dir(tmp_path: Path) -> None:
    pristine = _tree(tmp_path / "pristine", {"tests/test_a.py": "def test(): assert False\n"})
    ws = tmp_path / "ws"
    _tree(tmp_path / "elsewhere", {"test_a.py": "def test(): pass\n"})
    ws.mkdir()
    (ws / "tests").symlink_to(tmp_path / "elsewhere")
    events = _restore(ws, pristine)
    assert not (ws / "tests").is_symlink()
    assert (ws / "tests" / "test_a.py").read_text() == "def test(): assert False\n"
    assert (tmp_path / "elsewhere" / "test_a.py").read_text() == "def test(): pass\n"
    assert any("symlink" in e for e in events)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"reward.txt": "1\n"}, 1.0),
        ({"reward.txt": " 0.25 "}, 0.25),
        ({"reward.json": "0.5"}, 0.5),
        ({"reward.json": json.dumps({"reward": 1})}, 1.0),
        ({"reward.json": json.dumps({"accuracy": 0.75})}, 0.75),
        ({"reward.json": json.dumps({"reward": 0}), "reward.txt": "1"}, 0.0),
        ({"reward.json": json.dumps({"a": 1, "b": 2})}, None),  # several keys, none chosen: no scalar, no error
    ],
)
def test_reward_files(tmp_path: Path, files: dict[str, str], expected: float | None) -> None:
    _tree(tmp_path, files)
    assert integrity.read_reward(tmp_path) == expected


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, "no reward file"),
        ({"reward.txt": ""}, "empty"),
        ({"reward.txt": "passed"}, "not a number"),
        ({"reward.txt": "nan"}, "not finite"),
        ({"reward.json": "{"}, "not valid JSON"),
        ({"reward.json": json.dumps({"reward": "1"})}, "not a number"),
        ({"reward.json": "true"}, "not a number"),
        ({"reward.txt": "1" * 70000}, "larger than"),
    ],
)
def test_bad_reward_files_are_verifier_errors_never_zero(tmp_path: Path, files: dict[str, str], message: str) -> None:
    _tree(tmp_path, files)
    with pytest.raises(VerifierError, match=message):
        integrity.read_reward(tmp_path)


def test_symlinked_reward_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("1\n")
    (tmp_path / "reward.txt").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(VerifierError, match="no reward file"):
        integrity.read_reward(tmp_path)
