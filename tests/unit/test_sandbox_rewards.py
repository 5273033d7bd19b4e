"""Multi-key rewards (Harbor's ``rewards`` dict): ``read_rewards`` keeps every key and
refuses what is not a finite number (a VerifierError, never a 0); ``select_reward`` is
the run's choice of what trains; the choice is a [run] setting that reaches each
trial's spec, and the capture store keeps the map (old records read as {"reward": v})."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from harnessrl.errors import ConfigError, InvalidArgument
from harnessrl.v1 import capture_pb2
from services.capture_store import assemble, validate
from services.capture_store import records as rec
from services.sandbox.common.errors import VerifierError
from services.sandbox.defences import integrity
from services.sandbox.trial.lifecycle import TrialSpec
from stack import runconfig
from stack.launcher import PlannedTrial, TrialTemplate
from tests.cli_support import run_cli
from tests.sandbox_support import make_task


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"reward.json": json.dumps({"correctness": 1, "performance": 0})}, {"correctness": 1.0, "performance": 0.0}),
        ({"reward.json": json.dumps({"reward": 0.5, "style": -2})}, {"reward": 0.5, "style": -2.0}),
        ({"reward.json": "0.25"}, {"reward": 0.25}),  # a bare number (Harbor refuses it; see read_rewards)
        ({"reward.txt": " 1\n"}, {"reward": 1.0}),
        ({"reward.json": json.dumps({"a": 1}), "reward.txt": "0"}, {"a": 1.0}),  # reward.json wins, as in Harbor
    ],
)
def test_every_key_of_reward_json_is_kept(tmp_path: Path, files: dict[str, str], expected: dict[str, float]) -> None:
    assert integrity.read_rewards(_write(tmp_path, files)) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": "x"}', "reward.json key 'a' is not a number: \"x\""),
        ('{"a": true}', "reward.json key 'a' is not a number: true"),
        ('{"a": 1, "b": {"c": 1}}', "reward.json key 'b' is not a number"),
        ('{"a": [1]}', "reward.json key 'a' is not a number"),
        ('{"a": null}', "reward.json key 'a' is not a number: null"),
        ('{"a": NaN}', "reward.json key 'a' is not finite"),
        ('{"a": Infinity}', "reward.json key 'a' is not finite"),
        ('{"a": -Infinity}', "reward.json key 'a' is not finite"),
        ('{"a": 1e999}', "reward.json key 'a' is not finite"),
        ('{"a": 1' + "0" * 400 + "}", "reward.json key 'a' is not finite"),
        ("{}", "empty object"),
        ("true", "reward.json is not a number"),
        ("[1]", "reward.json is not a number"),
        ('"1"', "reward.json is not a number"),
        ("", "not valid JSON"),
        ('{"": 1}', "1-128 printable characters"),
        (json.dumps({"k" * 129: 1}), "1-128 printable characters"),
        (json.dumps({f"k{i}": 1 for i in range(65)}), "65 keys; at most 64"),
    ],
)
def test_a_bad_reward_json_is_a_verifier_error_never_zero(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "reward.json").write_text(text)
    with pytest.raises(VerifierError) as info:
        integrity.read_rewards(tmp_path)
    assert message in str(info.value)


GRADED = {"correctness": 1.0, "performance": 0.25}


@pytest.mark.parametrize(
    ("rewards", "key", "weights", "expected"),
    [
        ({"reward": 0.5, "correctness": 1.0}, "", None, 0.5),  # Harbor's primary reward: "reward"...
        ({"accuracy": 0.75}, "", None, 0.75),  # ... else the only key
        (GRADED, "performance", None, 0.25),
        (GRADED, "", {"correctness": 1.0, "performance": 2.0}, 1.5),
        (GRADED, "", {"performance": -1.0}, -0.25),  # keys not named count 0
        ({"reward": 1.0}, "reward", None, 1.0),  # reward.txt's value under its Harbor name
    ],
)
def test_the_run_chooses_what_trains(
    rewards: dict[str, float], key: str, weights: dict[str, float] | None, expected: float
) -> None:
    assert integrity.select_reward(rewards, key, weights) == expected


@pytest.mark.parametrize(
    ("key", "weights", "message"),
    [
        ("speed", None, "reward_key 'speed' is not among the verifier's rewards; keys present: ['correctness', "),
        ("", {"correctness": 1.0, "speed": 1.0}, "reward_weights names ['speed'], which the verifier did not write"),
        ("", {"correctness": 1e308, "performance": 1e308 * 8}, "the weighted reward is not finite"),
    ],
)
def test_a_choice_the_rewards_cannot_meet_is_a_verifier_error(
    key: str, weights: dict[str, float] | None, message: str
) -> None:
    with pytest.raises(VerifierError) as info:
        integrity.select_reward(GRADED, key, weights)
    assert message in str(info.value)


def test_several_keys_without_a_choice_give_no_scalar_reward_and_no_error() -> None:
    # The verifier did its job (invariant 5): no error, no made-up 0; the run must choose what trains.
    assert integrity.select_reward(GRADED) is None
    assert integrity.multi_key_rewards(GRADED) == ["correctness", "performance"]
    assert integrity.multi_key_rewards({"reward": 1.0, "x": 0.0}) == integrity.multi_key_rewards({"x": 1.0}) == []


def test_the_choice_travels_in_the_trial_spec_and_is_checked() -> None:
    spec = TrialSpec(trial_id="t", task_path="/t", harness="nop", reward_weights={"correctness": 1, "performance": 0.5})
    assert TrialSpec.from_proto(spec.to_proto()) == spec
    assert TrialSpec.from_proto(TrialSpec(trial_id="t", task_path="/t", harness="nop").to_proto()).reward_key == ""
    for bad in ({"reward_key": "a", "reward_weights": {"a": 1.0}}, {"reward_weights": {"a": True}}):
        with pytest.raises(ValidationError):
            TrialSpec(trial_id="t", task_path="/t", harness="nop", **bad)


def _config(tmp_path: Path, run: str) -> Path:
    make_task(tmp_path / "pool", "alpha")
    path = tmp_path / "run.toml"
    path.write_text(f'[run]\ntrain_tasks = ["{tmp_path / "pool"}"]\nruns_dir = "runs"\n{run}\n')
    return path


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        ('reward_weights = {correctness = "x"}', "[run]: reward_weights.correctness: Input should be a valid number"),
        ("reward_weights = {correctness = true}", "[run]: reward_weights.correctness: Input should be a valid number"),
        ("reward_weights = {correctness = nan}", "[run]: reward_weights.correctness: Input should be a finite number"),
        ("reward_weights = {correctness = {a = 1}}", "[run]: reward_weights.correctness: Input should be a valid"),
        ("reward_weights = {}", "[run]: reward_weights: Dictionary should have at least 1 item"),
        ('reward_weights = {"" = 1}', "reward_weights keys must be 1-128 characters"),
        ("reward_weights = 1", "[run]: reward_weights: Input should be a valid dictionary"),
        ('reward_key = ""', "[run]: reward_key: String should have at least 1 character"),
        ('reward_key = "a"\nreward_weights = {a = 1}', "set reward_key or reward_weights, not both"),
    ],
)
def test_a_bad_reward_choice_is_a_config_error_naming_file_table_and_field(
    tmp_path: Path, run: str, expected: str
) -> None:
    path = _config(tmp_path, run)
    with pytest.raises(ConfigError) as info:
        runconfig.load(path)
    assert str(path) in str(info.value) and expected in str(info.value)
    proc = run_cli("run", str(path))
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("run", "key", "weights"),
    [
        ("", "", {}),
        ('reward_key = "performance"', "performance", {}),
        ("reward_weights = {correctness = 1, performance = 0.5}", "", {"correctness": 1.0, "performance": 0.5}),
    ],
)
def test_the_run_config_reaches_every_trial_spec(tmp_path: Path, run: str, key: str, weights: dict[str, Any]) -> None:
    cfg = runconfig.load(_config(tmp_path, run))
    msg = TrialTemplate.for_run(cfg).spec(PlannedTrial("t-0", "g", tmp_path / "pool" / "alpha", 0, 0), 0)
    spec = TrialSpec.from_proto(msg)
    assert (spec.reward_key, spec.reward_weights) == (key, weights)


def _final(**fields: Any) -> capture_pb2.FinalizeTrajectoryRequest:
    base: dict[str, Any] = {"run_id": "r", "trial_id": "t", "task_id": "k", "group_id": "g", "group_size": 1}
    return capture_pb2.FinalizeTrajectoryRequest(termination_reason=1, **base, **fields)


def test_the_capture_store_keeps_the_map_and_reads_old_records_as_reward() -> None:
    trial = rec.TrialRec(task_id="k", group_id="g", created_at=0.0)
    kept = assemble.trajectory_proto("r", "t", trial, _final(reward=1.5, has_reward=True, rewards=GRADED), [])
    assert dict(kept.rewards) == GRADED and kept.reward == 1.5
    old = assemble.trajectory_proto("r", "t", trial, _final(reward=0.5, has_reward=True), [])
    assert dict(old.rewards) == {"reward": 0.5}
    assert dict(assemble.trajectory_proto("r", "t", trial, _final(), []).rewards) == {}
    for bad, message in [({"a": float("nan")}, "rewards['a'] nan is not finite"), ({"": 1.0}, "empty key")]:
        with pytest.raises(InvalidArgument, match=message.replace("[", r"\[").replace("]", r"\]")):
            validate.check_finalize(_final(rewards=bad))
