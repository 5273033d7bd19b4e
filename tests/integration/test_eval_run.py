"""``harnessrl eval``: eval tasks x k trials through the same stack, pass@k and
pass^k per task and overall in <run>/eval.jsonl, as the dashboard reads them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl import paths
from harnessrl.localservers import free_port
from services.dashboard import panels, rundir
from stack.evaluate import EvalTrials, pass_at, pass_hat, versions_seen
from tests.run_support import make_pool, tiny_model, write_config
from tests.sandbox_support import make_task

pytestmark = pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")


def test_estimators() -> None:
    assert pass_at(4, 2, 1) == 0.5 and pass_at(4, 2, 4) == 1.0 and pass_at(4, 0, 2) == 0.0
    assert pass_at(5, 1, 2) == pytest.approx(1 - 6 / 10)  # 1 - C(4,2)/C(5,2)
    assert pass_hat(4, 2, 1) == 0.5 and pass_hat(4, 2, 2) == pytest.approx(1 / 6) and pass_hat(4, 4, 4) == 1.0
    assert pass_at(2, 1, 4) is None and pass_hat(2, 1, 4) is None


async def test_an_unreachable_capture_store_leaves_the_versions_unknown(caplog: pytest.LogCaptureFixture) -> None:
    trials = EvalTrials("r-eval", 0, {"east": []}, {"east": "r-eval-s0-t0"})
    assert await versions_seen(f"127.0.0.1:{free_port()}", None, trials) is None
    assert "policy versions not read from the capture store: UNAVAILABLE" in caplog.text


def eval_pool(root: Path) -> Path:
    pool = root / "heldout"
    for name in ("east", "west"):
        make_task(pool, name, instruction=f"Create hello.txt holding the word hello ({name}).")
    return pool


def harnessrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stack.cli", *args], capture_output=True, text=True, timeout=300)


def test_eval_of_the_base_model_then_of_a_trained_checkpoint(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "tiny")
    run = {"steps": 1, "eval_tasks": [str(eval_pool(tmp_path))], "eval_k": 4}
    config = write_config(tmp_path, model, make_pool(tmp_path), run=run)

    proc = harnessrl("eval", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = tmp_path / "runs" / "e2e"
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["east", "west", "*"]
    for row in rows[:2]:  # even trials obey the policy (success), odd ones do not
        assert (row["step"], row["checkpoint"], row["n"], row["successes"]) == (0, "base", 4, 2)
        assert (row["pass@1"], row["pass@4"], row["pass^1"], row["pass^4"]) == (0.5, 1.0, 0.5, 0.0)
        assert row["termination"] == {"completed": 4} and row["infra_failures"] == 0
    assert all(r["policy_versions"] == [0] for r in rows)  # read back from the captured trajectories
    assert rows[2]["n"] == 8 and rows[2]["pass@1"] == 0.5 and rows[2]["tasks"] == 2
    assert "overall" in proc.stdout and "pass@4" in proc.stdout
    assert json.loads((run_dir / "run.json").read_text())["status"] == "done"

    # Train one step, then evaluate the checkpoint (the run goes on from the eval's run dir).
    proc = harnessrl("run", str(config), "--resume", "e2e")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = harnessrl("eval", str(config), "--k", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    latest = [r for r in rows if r["step"] == 1]
    assert [r["checkpoint"] for r in latest] == ["step-00000001"] * 3 and latest[0]["k"] == 2
    assert all(r["policy_versions"] == [1] for r in latest)  # the gateway serves the checkpoint's version
    assert "pass@2" in latest[0] and "pass^2" in latest[0]

    run = rundir.open_run(tmp_path / "runs", "e2e")
    read, problems = rundir.read_eval(run)
    assert problems == [] and len(read) == 6
    assert panels.validation(read) == {0: 0.5, 1: 0.5}


def test_eval_without_eval_tasks_is_a_clear_error(tmp_path: Path) -> None:
    config = write_config(tmp_path, tmp_path / "no-model", make_pool(tmp_path))
    proc = harnessrl("eval", str(config))
    assert proc.returncode == 2 and "eval_tasks is empty" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_periodic_evaluation_during_a_run(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "tiny")
    run = {"steps": 2, "eval_tasks": [str(eval_pool(tmp_path))], "eval_k": 2, "eval_every": 1}
    config = write_config(tmp_path, model, make_pool(tmp_path), run=run)
    proc = harnessrl("run", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = tmp_path / "runs" / "e2e"
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows}) == [0, 1, 2]  # the base model, then after each step
    assert all(r["k"] == 2 and r["n"] == 2 for r in rows if r["task_id"] != "*")
    # Each row names the weights its trials sampled with: the step's, or a later one's
    # when an update landed while the evaluation ran.
    assert all(r["policy_versions"] and min(r["policy_versions"]) >= r["step"] for r in rows), rows
    read, problems = rundir.read_eval(rundir.open_run(tmp_path / "runs", "e2e"))
    assert problems == [] and panels.validation(read) == {0: 0.5, 1: 0.5, 2: 0.5}
    # Extended by a step: the step it resumes at was evaluated already and is not redone.
    proc = harnessrl("run", str(config), "--resume", "e2e", "--steps", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in rows if r["task_id"] == "*") == [0, 1, 2, 3]


def test_the_control_of_a_run_only_evaluates_with_the_weights_it_starts_from(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "tiny")
    run = {"steps": 4, "eval_tasks": [str(eval_pool(tmp_path))], "eval_k": 2, "eval_every": 2, "evaluate_only": True}
    config = write_config(tmp_path, model, make_pool(tmp_path), run=run)
    proc = harnessrl("run", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [f"control: evaluation at step {s} done" in proc.stdout for s in (0, 2, 4)] == [True] * 3
    run_dir = tmp_path / "runs" / "e2e"
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["task_id"] == "*"] == [0, 2, 4]
    assert {r["checkpoint"] for r in rows} == {"base"} and all(r["policy_versions"] == [0] for r in rows)
    assert not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "done"
    # Resumed, a finished control has nothing left to evaluate.
    proc = harnessrl("run", str(config), "--resume", "e2e")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len((run_dir / "eval.jsonl").read_text().splitlines()) == len(rows)
