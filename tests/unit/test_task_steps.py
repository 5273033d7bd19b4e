"""Harbor's multi-step tasks ([[steps]], steps/NAME/) as tasks.py reads them, and the
rules of trial/multi_step.py the runner applies: the early stop (min_reward) and how
the trial's rewards combine the steps' (multi_step_reward_strategy). Malformed steps
are refused naming the file and the field."""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import pytest

from services.sandbox.common.errors import TaskError
from services.sandbox.task import steps as task_steps
from services.sandbox.task.model import load_task
from tests.sandbox_support import make_task

EXAMPLE = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "examples" / "steps"
TWO_STEPS = "[task]\nname = 'test/{name}'\n[[steps]]\nname = 'one'\n[[steps]]\nname = 'two'\n"


def steps_task(root: Path, toml: str = TWO_STEPS, names: tuple[str, ...] = ("one", "two")) -> Path:
    task = make_task(root, toml=toml)
    for name in names:
        (task / "steps" / name).mkdir(parents=True)
        (task / "steps" / name / "instruction.md").write_text(f"Do {name}.\n")
    return task


def refused(task: Path, *fragments: str) -> str:
    with pytest.raises(TaskError) as info:
        load_task(task)
    message = str(info.value)
    for fragment in (str(task), *fragments):
        assert fragment in message, message
    return message


def test_the_example_reads_as_harbor_reads_it() -> None:
    task = load_task(EXAMPLE)
    assert [s.name for s in task.steps] == ["greet", "personalise"]
    greet, personalise = task.steps
    assert task.instruction == "" and "prints exactly `hello`" in greet.instruction
    # tests/ first, the step's own over it; the step's solution, not the task's.
    assert greet.tests_dirs == (EXAMPLE / "tests", EXAMPLE / "steps" / "greet" / "tests")
    assert personalise.solution_dir == EXAMPLE / "steps" / "personalise" / "solution"
    assert (greet.config.min_reward, greet.config.agent.timeout_sec) == (1.0, 60)
    assert personalise.config.verifier.env == {"GREETING_NAME": "Ada"}
    view = task.for_step(personalise)
    assert (view.instruction, view.solution_dir) == (personalise.instruction, personalise.solution_dir)
    assert task.config.multi_step_reward_strategy == "mean"


def test_shared_tests_and_solution_serve_steps_without_their_own(tmp_path: Path) -> None:
    task = load_task(steps_task(tmp_path))
    one = task.steps[0]
    assert one.tests_dirs == (task.path / "tests",) and one.solution_dir == task.path / "solution"
    # Harbor's quirk, matched: an unset step verifier timeout is 600 s, not [verifier] timeout_sec.
    assert one.config.verifier.timeout_sec == 600 and one.config.agent.timeout_sec is None


def test_no_root_instruction_is_needed(tmp_path: Path) -> None:
    task = steps_task(tmp_path)
    (task / "instruction.md").unlink()
    assert len(load_task(task).steps) == 2


def test_a_missing_step_directory_is_named(tmp_path: Path) -> None:
    task = steps_task(tmp_path, names=("one",))
    refused(task, "steps/two/: missing", "steps[1].name = 'two'")


def test_duplicate_names_are_refused_case_insensitively(tmp_path: Path) -> None:
    toml = "[[steps]]\nname = 'one'\n[[steps]]\nname = 'ONE'\n"
    refused(steps_task(tmp_path, toml=toml), "task.toml", "steps", "steps[1].name 'ONE' is not unique")


@pytest.mark.parametrize("name", ["", "a/b", "..", "con", "x."])
def test_a_name_that_is_no_portable_directory_is_refused(tmp_path: Path, name: str) -> None:
    refused(make_task(tmp_path, toml=f"[[steps]]\nname = '{name}'\n"), "task.toml", "steps.0.name", "invalid step name")


def test_an_unknown_strategy_is_refused(tmp_path: Path) -> None:
    toml = "multi_step_reward_strategy = 'max'\n" + TWO_STEPS
    refused(steps_task(tmp_path, toml=toml), "task.toml", "multi_step_reward_strategy", "'mean' or 'final'")


def test_an_empty_or_missing_instruction_is_named(tmp_path: Path) -> None:
    task = steps_task(tmp_path / "a")
    (task / "steps" / "two" / "instruction.md").write_text(" \n")
    refused(task, "steps/two/instruction.md: empty")
    task = steps_task(tmp_path / "b")
    (task / "steps" / "one" / "instruction.md").unlink()
    refused(task, "steps/one/instruction.md: missing")


def test_a_step_without_any_test_script_is_named(tmp_path: Path) -> None:
    task = steps_task(tmp_path)
    (task / "tests" / "test.sh").unlink()
    refused(task, "steps/one/tests/test.sh: missing, and no shared tests/test.sh")
    (task / "steps" / "one" / "tests").mkdir()
    (task / "steps" / "one" / "tests" / "test.sh").write_text("#!/bin/bash\n")
    refused(task, "steps/two/tests/test.sh")  # one has its own now, two has none


def test_a_step_solution_without_solve_sh_is_named(tmp_path: Path) -> None:
    task = steps_task(tmp_path)
    (task / "steps" / "two" / "solution").mkdir()
    refused(task, "steps/two/solution/solve.sh: missing")


def test_step_fields_that_cannot_run_are_refused_by_name(tmp_path: Path) -> None:
    toml = (
        "[[steps]]\nname = 'one'\n[steps.verifier]\nnetwork_mode = 'allowlist'\nenvironment_mode = 'separate'\n"
        "[[steps]]\nname = 'two'\n[steps.agent]\nuser = 1001\n"
    )
    message = refused(steps_task(tmp_path, toml=toml), "task.toml: steps: ")
    fragments = [
        "steps[0].verifier.network_mode: 'allowlist'",
        "steps[0].verifier.environment_mode: only the",
        "steps[1].agent.user: every agent phase",
    ]
    for fragment in fragments:
        assert fragment in message


def test_unknown_step_keys_are_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    toml = TWO_STEPS + "colour = 'red'\n[steps.verifier]\ntimout_sec = 5\n"
    with caplog.at_level(logging.WARNING, logger="services.sandbox.task.model"):
        task = load_task(steps_task(tmp_path, toml=toml))
    (warning,) = task.warnings
    assert "steps[1].colour" in warning and "steps[1].verifier.timout_sec" in warning
    assert task.steps[1].config.verifier.timeout_sec == 600


def test_min_reward_gates_reward_or_each_key_missing_is_minus_infinity() -> None:
    assert task_steps.min_reward_failure({"reward": 1.0}, None) is None
    assert task_steps.min_reward_failure({"reward": 1.0}, 1.0) is None
    assert task_steps.min_reward_failure({"reward": 0.5}, 1.0) == "reward=0.5 is below min_reward 1.0"
    assert task_steps.min_reward_failure({"a": 1.0}, 0.0) == f"reward={-math.inf} is below min_reward 0.0"
    assert task_steps.min_reward_failure({"a": 1.0, "b": 0.2}, {"a": 1.0}) is None
    assert "b=0.2" in (task_steps.min_reward_failure({"a": 1.0, "b": 0.2}, {"a": 1.0, "b": 0.5}) or "")


def test_rewards_combine_as_harbor_combines_them() -> None:
    steps = [{"reward": 1.0, "kept": 1.0}, {"reward": 0.0}, {"reward": 0.5, "style": 1.0}]
    mean = task_steps.combine("mean", steps)
    assert mean == pytest.approx({"reward": 0.5, "kept": 1 / 3, "style": 1 / 3})  # missing keys count 0
    assert task_steps.combine(None, steps) == mean  # unset: mean
    assert task_steps.combine("final", steps) == {"reward": 0.5, "style": 1.0}
    assert task_steps.combine("mean", [None, {"reward": 1.0}]) == {"reward": 1.0}  # no result: left out
    assert task_steps.combine("final", [{"reward": 1.0}, None]) == {}
    assert task_steps.combine("mean", []) == {}


def test_check_harbor_runs_the_example(tmp_path: Path) -> None:
    from services.sandbox.task.harbor_check import check_task
    from services.sandbox.task.harbor_fields import Status

    report = check_task(EXAMPLE)
    assert report.runs and report.task_id == "harnessrl/steps", report
    statuses = {f.field: f.status for f in report.fields}
    assert statuses["steps"] == Status.MAPPED and statuses["multi_step_reward_strategy"] == Status.SUPPORTED
    copy = shutil.copytree(EXAMPLE, tmp_path / "steps")
    (copy / "task.toml").write_text((copy / "task.toml").read_text() + "[[steps.verifier.collect]]\ncommand = 'x'\n")
    report = check_task(copy)
    assert not report.runs
    (refusal,) = [f for f in report.fields if f.status == Status.REFUSED]
    assert refusal.field == "steps" and "steps[1].verifier.collect" in refusal.note


def test_check_harbor_names_a_steps_public_verifier(tmp_path: Path) -> None:
    """A task that is quiet but for one step's verifier still needs a public network for it."""
    from services.sandbox.task.harbor_check import check_task

    quiet = "[task]\nname = 'test/{name}'\n[environment]\nnetwork_mode = 'no-network'\n[[steps]]\nname = 'one'\n"
    assert not check_task(steps_task(tmp_path / "q", quiet + "[[steps]]\nname = 'two'\n")).public_verifier
    public = quiet + "[[steps]]\nname = 'two'\n[steps.verifier]\nnetwork_mode = 'public'\n"
    assert check_task(steps_task(tmp_path / "p", public)).public_verifier


def test_a_steps_healthcheck_and_artifacts_read_as_harbor_reads_them(tmp_path: Path) -> None:
    toml = TWO_STEPS + "artifacts = ['/app/out', {{ source = '/logs/x', destination = 'x' }}]\n"
    toml += "[steps.healthcheck]\ncommand = 'test -e /app'\nretries = 2\n"
    task = load_task(steps_task(tmp_path, toml=toml))
    two = task.steps[1].config
    assert two.healthcheck is not None and (two.healthcheck.command, two.healthcheck.retries) == ("test -e /app", 2)
    assert [(a.source, a.destination) for a in two.artifacts] == [("/app/out", None), ("/logs/x", "x")]
    view = task.for_step(task.steps[1])  # the task's artifacts then the step's; the step's healthcheck
    assert view.config.artifacts == two.artifacts and view.config.environment.healthcheck == two.healthcheck
    assert task.for_step(task.steps[0]).config.environment.healthcheck is None
    bad = TWO_STEPS + "artifacts = [{{ source = '/app/x', service = 'db' }}]\n"
    refused(steps_task(tmp_path / "bad", toml=bad), "task.toml", "steps.1.artifacts.0.service", "'db'")
