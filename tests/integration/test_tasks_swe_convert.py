"""SWE-style records -> Harbor tasks, on tiny git repositories the tests build:
a base commit with a bug, a fix commit and a test commit. Converted tasks pass
with the gold patch and fail without it, in the local backend."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.sandbox.factory import build_runner
from services.sandbox.pools.swe import RecordError, convert
from services.sandbox.task.model import load_task
from services.sandbox.trial.lifecycle import TrialSpec
from services.sandbox.validate import validate_task
from stack.disjoint import find_overlaps
from tests.sandbox_support import settings_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
ROOT = Path(__file__).resolve().parents[2]

CALC = "def add(a, b):\n    return a {op} b\n\n\ndef sub(a, b):\n    return a - b\n"
TESTS = """\
import os
import unittest

from calc import add, sub


class TestCalc(unittest.TestCase):
    def test_sub(self):
        self.assertEqual(sub(5, 3), 2)

    def test_built(self):
        self.assertTrue(os.path.exists("built.txt"))

    def test_unlisted_and_broken(self):
        self.assertEqual(1, 2)
{extra}
"""
ADD_TEST = """
    def test_add(self):
        self.assertEqual(add(2, 3), 5)
"""


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD").strip()


def make_repo(repos: Path, name: str = "acme__calc") -> dict[str, Any]:
    """A clone with base (bug) -> fix -> tests; returns a record for it."""
    repo = repos / name
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    files = {"calc.py": CALC.format(op="-"), "tests/__init__.py": "", "tests/test_calc.py": TESTS.format(extra="")}
    base = _commit(repo, files, "base")
    fix = _commit(repo, {"calc.py": CALC.format(op="+")}, "fix add")
    patch = _git(repo, "diff", base, fix)
    test = _commit(repo, {"tests/test_calc.py": TESTS.format(extra=ADD_TEST)}, "test add")
    test_patch = _git(repo, "diff", fix, test)
    return {
        "repo": name.replace("__", "/"),
        "instance_id": f"{name}-1",
        "base_commit": base,
        "problem_statement": "add() subtracts instead of adding.",
        "patch": patch,
        "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(["tests.test_calc.TestCalc.test_add"]),  # SWE-bench ships JSON strings
        "PASS_TO_PASS": ["tests.test_calc.TestCalc.test_sub", "tests.test_calc.TestCalc.test_built"],
        "setup_commands": ["python3 -c \"open('built.txt', 'w').write('ok')\""],
        "test_command": "python3 -m unittest {tests}",
    }


def _jsonl(path: Path, *records: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


async def test_converted_task_passes_with_the_gold_patch_and_fails_without(tmp_path: Path) -> None:
    record = make_repo(tmp_path / "repos")
    [task] = convert(_jsonl(tmp_path / "r.jsonl", record), tmp_path / "repos", tmp_path / "out")
    parsed = load_task(task)
    assert parsed.task_id == "swe/acme__calc-1" and "subtracts" in parsed.instruction
    meta = parsed.config.metadata
    assert (meta["repo"], meta["base_commit"], meta["category"]) == ("acme/calc", record["base_commit"], "swe")
    assert meta["fail_to_pass"] == ["tests.test_calc.TestCalc.test_add"]
    report = await validate_task(build_runner(settings_for(tmp_path)), task)
    assert report.ok, report.reasons  # oracle (gold patch) 1, nop 0; the unlisted broken test is not run
    assert report.outcomes["oracle"].suspicious_events == []  # the detector's false positives: none


async def test_an_agent_that_edits_the_tests_gains_nothing(tmp_path: Path) -> None:
    """The verifier restores the files the test patch touches before applying it."""
    record = make_repo(tmp_path / "repos")
    [task] = convert(_jsonl(tmp_path / "r.jsonl", record), tmp_path / "repos", tmp_path / "out")
    cheat = "cat > tests/test_calc.py <<'EOF'\nimport unittest\nclass TestCalc(unittest.TestCase):\n"
    cheat += "    def test_add(self): pass\n    def test_sub(self): pass\n    def test_built(self): pass\nEOF\n"
    cheat += "git log --all --oneline > /logs/agent/history.txt\n"
    spec = TrialSpec(trial_id="swe-cheat", task_path=str(task), harness="shell", harness_options={"script": cheat})
    runner = build_runner(settings_for(tmp_path))
    outcome = await runner.run(spec)
    assert outcome.termination_reason == "completed" and outcome.reward == 0.0, outcome
    history = (Path(outcome.artifacts_dir) / "agent" / "history.txt").read_text()
    assert len(history.splitlines()) == 1  # one squashed base commit: the fix commit is not there


def test_parquet_records_and_disjointness_metadata(tmp_path: Path) -> None:
    record = make_repo(tmp_path / "repos")
    path = tmp_path / "r.parquet"
    pq.write_table(pa.Table.from_pylist([record]), path)
    [task] = convert(path, tmp_path / "repos", tmp_path / "out")
    other = make_repo(tmp_path / "repos2", "acme__calc")
    other["instance_id"] = "acme__calc-2"
    [task2] = convert(_jsonl(tmp_path / "r2.jsonl", other), tmp_path / "repos2", tmp_path / "out2")
    [overlap] = find_overlaps([task], [task2])
    assert overlap.level == "repository" and "acme/calc" in overlap.detail


def _error(tmp_path: Path, record: dict[str, Any] | str, repos: Path | None = None) -> str:
    path = tmp_path / "bad.jsonl"
    path.write_text(record if isinstance(record, str) else json.dumps(record) + "\n")
    with pytest.raises(RecordError) as info:
        convert(path, repos or tmp_path / "repos", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    return str(info.value)


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"patch": None}, ["line 1 (acme__calc-1)", "patch"]),
        ({"FAIL_TO_PASS": []}, ["FAIL_TO_PASS"]),
        ({"FAIL_TO_PASS": "[not json"}, ["FAIL_TO_PASS", "JSON"]),
        ({"base_commit": "main"}, ["base_commit", "commit hash"]),
        ({"base_commit": "0" * 40}, ["base_commit", "not in the clone"]),
        ({"repo": "acme/nothere"}, ["repo", "no local git clone"]),
        ({"patch": "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n"}, ["patch", "does not apply"]),
        ({"test_command": "python3 -m unittest"}, ["test_command", "{tests}"]),
        ({"instance_id": "../escape"}, ["instance_id"]),
    ],
)
def test_malformed_records_name_the_record_and_the_field(
    tmp_path: Path, change: dict[str, Any], fragments: list[str]
) -> None:
    record = make_repo(tmp_path / "repos")
    for key, value in change.items():
        if value is None:
            del record[key]
        else:
            record[key] = value
    message = _error(tmp_path, record)
    assert "bad.jsonl line 1" in message
    for fragment in fragments:
        assert fragment in message, message


def test_malformed_files_and_duplicates(tmp_path: Path) -> None:
    record = make_repo(tmp_path / "repos")
    assert "line 2: not valid JSON" in _error(tmp_path, json.dumps(record) + "\n{oops\n")
    assert "must be a JSON object" in _error(tmp_path, "[1, 2]\n")
    dup = json.dumps(record) + "\n" + json.dumps(record) + "\n"
    assert "repeats" in _error(tmp_path, dup) and "line 2" in _error(tmp_path, dup)
    broken = tmp_path / "r.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(RecordError, match="not a readable Parquet"):
        convert(broken, tmp_path / "repos", tmp_path / "out")
    with pytest.raises(RecordError, match=r"expected a \.jsonl or \.parquet"):
        convert(tmp_path / "repos" / "acme__calc" / "calc.py", tmp_path / "repos", tmp_path / "out")


def test_cli_convert_and_its_errors(tmp_path: Path) -> None:
    record = make_repo(tmp_path / "repos")
    records = _jsonl(tmp_path / "r.jsonl", record)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "stack.cli", "tasks", "convert", *args]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)

    ok = cli("--records", str(records), "--repos", str(tmp_path / "repos"), "--out", str(tmp_path / "out"))
    assert ok.returncode == 0 and "wrote 1 task(s)" in ok.stdout, ok.stderr
    again = cli("--records", str(records), "--repos", str(tmp_path / "repos"), "--out", str(tmp_path / "out"))
    assert again.returncode == 2 and "not an empty directory" in again.stderr
    bad = cli("--records", str(tmp_path / "none.jsonl"), "--repos", str(tmp_path), "--out", str(tmp_path / "o2"))
    assert bad.returncode == 2 and "no such records file" in bad.stderr and "Traceback" not in bad.stderr
