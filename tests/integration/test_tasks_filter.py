"""``harnessrl tasks filter`` on a scripted policy whose success per task is known.

Every attempt is a real trial: embedded capture store, gateway with the scripted
engine, proxy, a bubblewrap sandbox running the ``shell`` harness. The agent
script asks the model what to run and runs it; the scripted policy always
answers the same command, which solves a task on attempts ``0..m-1`` where ``m``
is written in the task (``solves.txt``). So a task solves exactly ``m`` of ``k``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.errors import InvalidArgument
from harnessrl.paths import default_model_dir
from stack.taskfilter import Attempt, FilterConfig, TaskResult, _score, parse_keep, select, summarize
from tests.sandbox_support import make_task

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
ROOT = Path(__file__).resolve().parents[2]

TOML = """\
schema_version = "1.4"

[task]
name = "test/{name}"

[metadata]
category = "{family}"
"""

AGENT = r"""
set -e
python3 - <<'PY' > /tmp/policy.sh
import json, os, urllib.request
body = {"model": os.environ["HARNESSRL_MODEL"],
        "messages": [{"role": "user", "content": os.environ["HARNESSRL_INSTRUCTION"]}],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "content-type": "application/json"})
print(json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"])
PY
ATTEMPT="${HARNESSRL_TRIAL_ID##*.a}" bash /tmp/policy.sh
"""
POLICY = 'if [ "$ATTEMPT" -lt "$(cat solves.txt)" ]; then echo hello > hello.txt; fi'


def _pool(root: Path) -> dict[str, int]:
    """Tasks solved m of 4 times, in two families, and one whose environment cannot be built."""
    solves = {"a-never": 0, "a-once": 1, "b-twice": 2, "b-thrice": 3, "b-always": 4}
    for name, m in solves.items():
        family = "alpha" if name.startswith("a-") else "beta"
        toml = TOML.replace("{family}", family)
        make_task(root, name, toml=toml, context={"solves.txt": f"{m}\n"},
                  dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\nCOPY solves.txt /app/solves.txt\n",
                  instruction=f"Write hello to hello.txt ({name}).")  # fmt: skip
    make_task(root, "broken", toml=TOML.replace("{family}", "beta"), dockerfile="FROM x\nWORKDIR /app\nONBUILD RUN x\n")
    return solves


def _env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HARNESSRL_SANDBOX_WORK_DIR": str(tmp / "trials"),
        "HARNESSRL_SANDBOX_CACHE_DIR": str(tmp / "cache"),
        "HARNESSRL_SANDBOX_ARTIFACTS_DIR": str(tmp / "artifacts"),
        "HARNESSRL_SANDBOX_LOCAL__VERIFY_NETWORK": "none",  # the pool's verifiers need no network
    }


def _filter(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "stack.cli", "tasks", "filter", *args]
    return subprocess.run(cmd, cwd=ROOT, env=_env(tmp), capture_output=True, text=True, timeout=600)


def test_filter_keeps_exactly_the_tasks_solved_1_to_3_of_4(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    _pool(pool)
    agent = tmp_path / "agent.sh"
    agent.write_text(AGENT)
    script = tmp_path / "policy.json"
    script.write_text(json.dumps({"context_window": 8192, "threads": {"main": [{"content": POLICY}]}}))
    out, report_path = tmp_path / "kept", tmp_path / "report.json"
    args = [str(pool), "--harness", "shell", "-o", f"script_path={agent}", "--engine", f"scripted:{script}"]
    args += ["--model", default_model_dir().name, "--k", "4", "--out", str(out), "--report", str(report_path)]
    proc = _filter(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]

    assert sorted(p.name for p in out.iterdir()) == ["a-once", "b-thrice", "b-twice"]
    assert (out / "a-once" / "environment" / "solves.txt").read_text() == "1\n"
    report = json.loads(report_path.read_text())
    by_name = {t["name"]: t for t in report["tasks"]}
    assert {n: t["solves"] for n, t in by_name.items() if n != "broken"} == _pool(tmp_path / "again")
    assert report["histogram"] == {"0": 1, "1": 1, "2": 1, "3": 1, "4": 1}
    assert report["kept"] == ["a-once", "b-thrice", "b-twice"]
    assert report["families"]["alpha"] | {"histogram": None} == {
        "tasks": 2, "scored": 2, "kept": 1, "infra_failed": 0, "solves": 1, "attempts": 8,
        "solve_rate": 0.125, "histogram": None,
    }  # fmt: skip
    assert report["families"]["beta"]["kept"] == 2 and report["families"]["beta"]["infra_failed"] == 1
    [infra] = report["infra_failures"]
    assert infra["task"] == "broken" and len(infra["failures"]) == 4
    assert {f["termination_reason"] for f in infra["failures"]} == {"env_setup_failed"}
    assert "ONBUILD" in infra["failures"][0]["error"]
    assert report["config"]["keep"] == [1, 3] and report["config"]["harness"] == "shell"
    assert report["complete"] is True and report["tasks_planned"] == 6
    assert "solves out of 4: 0:1  1:1  2:1  3:1  4:1" in proc.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--keep", "3-1"], "0 <= a <= b <= k"),
        (["--keep", "one"], "expected A-B"),
        (["--k", "0"], "k must be at least 1"),
        (["--temperature", "0"], "temperature must be in (0, 5]"),
        (["-o", "novalue"], "expected KEY=VALUE"),
        (["--harness", "gpt-agent"], "valid harnesses"),
        (["--family", "gamma"], "no task of families"),
    ],
)
def test_filter_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], fragment: str) -> None:
    pool = tmp_path / "pool"
    make_task(pool, "t", toml=TOML.replace("{family}", "alpha"))
    base = {"--harness": "nop", "--out": str(tmp_path / "kept"), "--report": str(tmp_path / "r.json")}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    proc = _filter(tmp_path, str(pool), *[x for kv in base.items() for x in kv])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "kept").exists() and not (tmp_path / "r.json").exists()


def test_filter_refuses_a_non_empty_out_and_a_missing_pool(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    (kept / "old").mkdir(parents=True)
    pool = tmp_path / "pool"
    make_task(pool, "t")
    common = ["--harness", "nop", "--report", str(tmp_path / "r.json")]
    proc = _filter(tmp_path, str(pool), "--out", str(kept), *common)
    assert proc.returncode == 2 and "not an empty directory" in proc.stderr
    assert [p.name for p in kept.iterdir()] == ["old"]
    proc = _filter(tmp_path, str(tmp_path / "nope"), "--out", str(tmp_path / "k2"), *common)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_select_refuses_two_tasks_with_one_directory_name(tmp_path: Path) -> None:
    make_task(tmp_path / "p1", "same")
    make_task(tmp_path / "p2", "same", instruction="Another.")
    with pytest.raises(InvalidArgument, match="same directory name"):
        select([tmp_path / "p1", tmp_path / "p2"])


def test_keep_range_and_scoring_rules() -> None:
    assert parse_keep("1-3") == (1, 3) and parse_keep("2") == (2, 2)
    cfg = FilterConfig(harness="nop", k=4, keep=(1, 3))
    result = TaskResult("p", "t", "org/t", "fam")
    # A partial reward is not a solve; an agent timeout is the policy's failure, not infra.
    result.attempts = [
        Attempt(0, "x.a0", 1.0, "completed"),
        Attempt(1, "x.a1", 0.5, "completed"),
        Attempt(2, "x.a2", None, "agent_timeout"),
        Attempt(3, "x.a3", 1.0, "max_turns"),
    ]
    _score(result, cfg)
    assert (result.solves, result.infra_failed, result.kept) == (2, False, True)
    result.attempts[2] = Attempt(2, "x.a2", None, "verifier_error")
    _score(result, cfg)
    assert (result.infra_failed, result.kept) == (True, False)
    report = summarize([result, TaskResult("q", "unfinished", "org/u", "fam")], cfg, "now")
    assert (report.complete, report.tasks_planned, len(report.tasks)) == (False, 2, 1)
    assert report.histogram == {"0": 0, "1": 0, "2": 0, "3": 0, "4": 0}
    assert report.families["fam"]["solve_rate"] is None and report.infra_failures[0]["task"] == "t"
