"""``harnessrl tasks check-harbor``: per task, which fields run, run mapped, are refused;
exit 1 when a task would be refused, 0 otherwise, 2 (one line) on malformed input."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_support import run_cli
from tests.sandbox_support import make_task

RUNS = "[task]\nname = 'test/{name}'\n[agent]\ntimeout_sec = 30\n[environment]\nallow_internet = false\n"
REFUSED = "[environment]\ngpu_types = ['H100']\n"


def _dataset(root: Path) -> Path:
    make_task(root, "ok", toml=RUNS + "colour = 'blue'\n")
    make_task(root, "skills", toml=REFUSED)
    make_task(root, "compose", toml=RUNS, context={"docker-compose.yaml": "services: {}\n"})
    return root


def test_a_task_that_runs_exits_0(tmp_path: Path) -> None:
    task = make_task(tmp_path, "ok", toml=RUNS)
    proc = run_cli("tasks", "check-harbor", "--verbose", str(task))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("runs     test/ok")
    assert "supported agent.timeout_sec" in proc.stdout
    assert "mapped    environment.allow_internet" in proc.stdout
    assert "1 of 1 task(s) run" in proc.stdout


def test_a_dataset_names_each_refusal_and_exits_1(tmp_path: Path) -> None:
    proc = run_cli("tasks", "check-harbor", str(_dataset(tmp_path / "ds")))
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "REFUSED" in out and "refused   environment.gpu_types: GPU tasks" in out
    assert "environment/docker-compose.yaml: services: must be a mapping of at least one service" in out
    assert "unknown   environment.colour: ignored, as Harbor ignores them" in out
    assert "1 of 3 task(s) run; 2 refused" in out


def test_json_report(tmp_path: Path) -> None:
    proc = run_cli("tasks", "check-harbor", "--json", str(_dataset(tmp_path / "ds")))
    assert proc.returncode == 1
    reports = {Path(r["path"]).name: r for r in json.loads(proc.stdout)}
    assert [reports[n]["runs"] for n in ("compose", "ok", "skills")] == [False, True, False]
    statuses = {f["field"]: f["status"] for f in reports["ok"]["fields"]}
    assert statuses["agent.timeout_sec"] == "supported" and statuses["environment.allow_internet"] == "mapped"
    assert reports["ok"]["unknown"] == ["environment.colour"] and reports["ok"]["task_id"] == "test/ok"
    (refused,) = [f for f in reports["skills"]["fields"] if f["status"] == "refused"]
    assert refused["field"] == "environment.gpu_types" and "GPU" in refused["note"]


def test_an_invalid_task_is_named_and_exits_1(tmp_path: Path) -> None:
    task = make_task(tmp_path, "bad", toml="[agent]\ntimeout_sec = 'soon'\n")
    proc = run_cli("tasks", "check-harbor", str(task))
    assert proc.returncode == 1
    assert "INVALID" in proc.stdout and "agent.timeout_sec" in proc.stdout


def test_malformed_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    proc = run_cli("tasks", "check-harbor", str(missing))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and f"{missing}: not a directory" in proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli("tasks", "check-harbor", str(empty))
    assert proc.returncode == 2 and "no task.toml" in proc.stderr and proc.stdout == ""
    broken = make_task(tmp_path, "broken", toml="[agent\n")
    proc = run_cli("tasks", "check-harbor", str(broken))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert f"{broken}: task.toml is not valid TOML" in proc.stderr and proc.stdout == ""


def test_a_public_verifier_is_named_with_what_it_needs(tmp_path: Path) -> None:
    """Harbor's verifier is public unless the task says otherwise; a backend with no network
    to give refuses such a task's trials, so the check says so before anything runs."""
    public = make_task(tmp_path, "public", toml="[task]\nname = 'test/public'\n")
    proc = run_cli("tasks", "check-harbor", "--json", str(public))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["public_verifier"] is True
    text = run_cli("tasks", "check-harbor", str(public)).stdout
    assert "network   its verifier asks for a public network" in text and "network_mode = 'no-network'" in text
    # Said quiet ([verifier] over [environment], and a step's over the task's): no such line.
    quiet = make_task(tmp_path, "quiet", toml=RUNS)  # allow_internet = false: 'no-network', inherited
    assert json.loads(run_cli("tasks", "check-harbor", "--json", str(quiet)).stdout)[0]["public_verifier"] is False
    assert "network " not in run_cli("tasks", "check-harbor", str(quiet)).stdout
