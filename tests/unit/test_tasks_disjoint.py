"""Disjointness of training and evaluation pools, at instance and repository level."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harnessrl.errors import InvalidArgument
from services.sandbox.common.errors import TaskError
from stack.cli.main import app
from stack.disjoint import find_overlaps, task_dirs
from tests.cli_support import run_cli
from tests.sandbox_support import make_task

SWE_TOML = """\
schema_version = "1.4"

[task]
name = "test/{name}"

[metadata]
category = "swe"
repo = "{repo}"
base_commit = "{commit}"
"""


def _swe(root: Path, name: str, repo: str, commit: str) -> Path:
    toml = SWE_TOML.replace("{repo}", repo).replace("{commit}", commit)
    return make_task(root, name, toml=toml, instruction=f"Fix issue {name} in {repo}.")


def _pool(root: Path, *names: str) -> Path:
    root.mkdir(parents=True)
    for n in names:
        make_task(root, n, instruction=f"Write {n} to {n}.txt.")
    return root


def test_disjoint_pools_have_no_overlap(tmp_path: Path) -> None:
    train = _pool(tmp_path / "train", "a", "b")
    ev = _pool(tmp_path / "eval", "c")
    assert find_overlaps([train], [ev]) == []


def test_same_task_id_is_an_instance_overlap(tmp_path: Path) -> None:
    train = _pool(tmp_path / "train", "a", "b")
    ev = tmp_path / "eval"
    ev.mkdir()
    make_task(ev, "b", instruction="Something else entirely.")
    [o] = find_overlaps([train], [ev])
    assert o.level == "instance"
    assert o.train_task.startswith("test/b") and o.eval_task.startswith("test/b")
    assert "same task id" in o.detail


def test_copied_content_under_a_new_name_is_an_instance_overlap(tmp_path: Path) -> None:
    train = _pool(tmp_path / "train", "a")
    ev = tmp_path / "eval"
    ev.mkdir()
    # Same instruction (modulo surrounding whitespace) and the same tests, another name.
    make_task(ev, "renamed", instruction="\n  Write a to a.txt.\n")
    [o] = find_overlaps([train], [ev])
    assert (o.level, o.detail) == ("instance", "same instruction and tests")


def test_same_instruction_with_different_tests_is_not_an_overlap(tmp_path: Path) -> None:
    train = _pool(tmp_path / "train", "a")
    ev = tmp_path / "eval"
    ev.mkdir()
    make_task(ev, "other", instruction="Write a to a.txt.", test_sh="#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")
    assert find_overlaps([train], [ev]) == []


def test_same_repo_is_a_repository_overlap_even_at_another_commit(tmp_path: Path) -> None:
    train, ev = tmp_path / "train", tmp_path / "eval"
    train.mkdir()
    ev.mkdir()
    _swe(train, "t1", "acme/widgets", "aaa111")
    _swe(ev, "e1", "acme/widgets", "bbb222")
    _swe(ev, "e2", "acme/gadgets", "aaa111")
    [o] = find_overlaps([train], [ev])
    assert o.level == "repository"
    assert "e1" in o.eval_task
    assert "acme/widgets" in o.detail and "aaa111" in o.detail and "bbb222" in o.detail


def test_both_levels_are_reported_and_instance_comes_first(tmp_path: Path) -> None:
    train, ev = tmp_path / "train", tmp_path / "eval"
    train.mkdir()
    ev.mkdir()
    _swe(train, "same", "acme/widgets", "aaa111")
    _swe(ev, "same", "acme/widgets", "aaa111")
    levels = [o.level for o in find_overlaps([train], [ev])]
    assert levels == ["instance", "repository"]


def test_single_task_paths_and_pools_mix(tmp_path: Path) -> None:
    train = _pool(tmp_path / "train", "a", "b")
    assert task_dirs([train / "b", train]) == [train / "b", train / "a", train / "b"]


def test_a_path_that_is_neither_task_nor_pool_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidArgument, match="neither a task"):
        find_overlaps([empty], [empty])
    with pytest.raises(InvalidArgument, match="does not exist"):
        find_overlaps([tmp_path / "missing"], [empty])


def test_a_malformed_task_names_the_task(tmp_path: Path) -> None:
    train = _pool(tmp_path / "train", "a")
    (train / "a" / "instruction.md").unlink()
    with pytest.raises(TaskError, match=r"instruction\.md"):
        find_overlaps([train], [train])


def test_cli_lists_overlaps_and_exits_1(tmp_path: Path) -> None:
    train = _pool(tmp_path / "train", "a", "b")
    ev = _pool(tmp_path / "eval", "b", "c")
    result = CliRunner().invoke(app, ["tasks", "disjoint", str(train), "--eval", str(ev)])
    assert result.exit_code == 1
    assert "instance: test/b" in result.output
    ok = CliRunner().invoke(app, ["tasks", "disjoint", str(train / "a"), "--eval", str(ev)])
    assert ok.exit_code == 0, ok.output
    assert "disjoint: 1 training and 2 evaluation" in ok.output
    js = CliRunner().invoke(app, ["tasks", "disjoint", str(train), "--eval", str(ev), "--json"])
    assert js.exit_code == 1
    assert [o["level"] for o in json.loads(js.output)] == ["instance"]


def test_cli_bad_path_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = run_cli("tasks", "disjoint", str(tmp_path / "nope"), "--eval", str(tmp_path))
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr
