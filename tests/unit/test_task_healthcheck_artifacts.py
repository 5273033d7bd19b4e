"""Harbor's ``[environment.healthcheck]`` and task-level ``artifacts`` as task.toml fields:
read with Harbor's defaults and forms, malformed values refused naming the task, the file
and the field; the artifact copy's safety (links out, special files, caps) and tar's
``--exclude`` matching; and ``check-harbor`` naming a verifier allowlist it would refuse."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath

import pytest

from services.sandbox.common.errors import TaskError
from services.sandbox.task.artifacts import ArtifactEntry
from services.sandbox.task.healthcheck import Healthcheck
from services.sandbox.task.model import load_task
from services.sandbox.trial import artifacts
from services.sandbox.trial.artifacts import _Budget, _place, excluded
from tests.cli_support import run_cli
from tests.sandbox_support import make_task


def test_a_healthcheck_has_harbors_defaults(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, toml="[environment.healthcheck]\ncommand = 'curl -f localhost'\n"))
    assert task.config.environment.healthcheck == Healthcheck(
        command="curl -f localhost",
        interval_sec=5.0,
        timeout_sec=30.0,
        start_period_sec=0.0,
        start_interval_sec=5.0,
        retries=3,
    )
    assert load_task(make_task(tmp_path / "none")).config.environment.healthcheck is None


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("interval_sec = 1\n", "environment.healthcheck.command"),  # required
        ("command = ''\n", "environment.healthcheck.command: Value error, must be a shell command"),
        ("command = 'true'\nretries = -1\n", "environment.healthcheck.retries"),
        ("command = 'true'\ntimeout_sec = 0\n", "environment.healthcheck.timeout_sec"),
        ("command = 'true'\ninterval_sec = 'soon'\n", "environment.healthcheck.interval_sec"),
        ("command = 'true'\ninterval = 1\n", "unknown setting 'environment.healthcheck.interval'"),
    ],
)
def test_a_malformed_healthcheck_is_named(tmp_path: Path, body: str, fragment: str) -> None:
    task = make_task(tmp_path, toml="[environment.healthcheck]\n" + body)
    with pytest.raises(TaskError) as info:
        load_task(task)
    assert str(task) in str(info.value) and "task.toml" in str(info.value) and fragment in str(info.value)


def test_artifacts_are_strings_or_tables(tmp_path: Path) -> None:
    toml = (
        "artifacts = ['/app/out.txt', 'var/log/x', "
        "{{ source = '/app/logs', destination = 'logs', exclude = ['*.tmp'] }}, "
        "{{ source = '/a', service = 'main' }}]\n"
    )
    entries = load_task(make_task(tmp_path, toml=toml)).config.artifacts
    assert [(e.source, e.destination, e.exclude) for e in entries] == [
        ("/app/out.txt", None, []),
        ("var/log/x", None, []),
        ("/app/logs", "logs", ["*.tmp"]),
        ("/a", None, []),
    ]
    # Where each lands under artifacts/ (Harbor's artifact_host_path) and what is read in the sandbox.
    assert [str(e.relative) for e in entries] == ["app/out.txt", "var/log/x", "logs", "a"]
    assert entries[1].path == PurePosixPath("/var/log/x")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("['/app/../etc/passwd']", "artifacts.0.source: Value error, must not contain '..'"),
        ("['/']", "artifacts.0.source: Value error, must name a file or directory"),
        ("[{{ source = '/a', destination = '/abs' }}]", "artifacts.0.destination: Value error, must be a relative"),
        ("[{{ source = '/a', destination = 'x/../../y' }}]", "artifacts.0.destination: Value error, must not contain"),
        ("[{{ source = '/a', destination = 'manifest.json' }}]", "reserved for the collection manifest"),
        ("[{{ source = '/a', destination = 'a\\\\b' }}]", "must use '/' as separator"),
        ("['/ok', {{ source = '/a', service = 'db' }}]", "artifacts.1.service: Value error, collecting from compose"),
        ("[{{ source = '/a', glob = '*.txt' }}]", "unknown setting 'artifacts.0.glob'"),
        ("[{{ destination = 'x' }}]", "artifacts.0.source"),
        ("'/app/out.txt'", "artifacts: Input should be a valid list"),
    ],
)
def test_malformed_artifacts_are_named(tmp_path: Path, value: str, fragment: str) -> None:
    task = make_task(tmp_path, toml=f"artifacts = {value}\n")  # make_task formats: {{ }} are braces
    with pytest.raises(TaskError) as info:
        load_task(task)
    assert str(task) in str(info.value) and "task.toml" in str(info.value) and fragment in str(info.value)


@pytest.mark.parametrize(
    ("rel", "pattern", "hit"),
    [
        ("a.tmp", "*.tmp", True),
        ("sub/deep/a.tmp", "*.tmp", True),
        ("sub/cache", "cache", True),
        ("cachefile", "cache", False),
        ("x/sub/deep/a.tmp", "sub/*.tmp", True),  # unanchored, '*' matches '/', as tar's --exclude
        ("a.txt", "*.tmp", False),
        ("node_modules", "node_modules", True),
    ],
)
def test_exclude_is_tars(rel: str, pattern: str, hit: bool) -> None:
    assert excluded(PurePosixPath(rel), [pattern]) is hit


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "skip.tmp").write_text("t")
    (root / "sub" / "b.txt").write_text("bb")
    os.symlink("/etc/passwd", root / "abs-link")
    os.symlink("../../outside", root / "sub" / "up-link")
    os.symlink("sub/b.txt", root / "in-link")
    os.mkfifo(root / "fifo")
    return root


def test_placing_keeps_files_and_inner_links_and_drops_what_leads_out(tmp_path: Path) -> None:
    src, dst = _tree(tmp_path / "src"), tmp_path / "dst"
    placed = _place(src, dst, True, ["*.tmp"], _Budget())
    names = sorted(str(p.relative_to(dst)) for p in dst.rglob("*"))
    assert names == ["a.txt", "in-link", "sub", "sub/b.txt"]
    assert (dst / "in-link").is_symlink() and (dst / "in-link").read_text() == "bb"
    assert (placed.files, placed.dropped, placed.cut) == (2, 3, False)  # abs-link, up-link, fifo


def test_placing_stops_at_the_trials_cap(tmp_path: Path) -> None:
    src, dst = _tree(tmp_path / "src"), tmp_path / "dst"
    placed = _place(src, dst, True, [], _Budget(bytes_left=2, files_left=10))
    # In name order: a.txt and skip.tmp (1 byte each) fit, sub/b.txt (2 bytes) does not.
    assert placed.cut and placed.files == 2 and (dst / "skip.tmp").exists() and not (dst / "sub" / "b.txt").exists()
    placed = _place(src / "a.txt", tmp_path / "one" / "a.txt", False, [], _Budget(bytes_left=10, files_left=0))
    assert placed.cut and not (tmp_path / "one" / "a.txt").exists()


def test_read_manifest(tmp_path: Path) -> None:
    assert artifacts.read_manifest(tmp_path) == []
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "manifest.json").write_text(json.dumps([{"source": "/a", "status": "ok"}]))
    assert artifacts.read_manifest(tmp_path) == [{"source": "/a", "status": "ok"}]
    assert ArtifactEntry(source="/a/b.txt").relative == PurePosixPath("a/b.txt")


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        ("[verifier]\nnetwork_mode = 'allowlist'\nallowed_hosts = ['pypi.org']\n", "[verifier] network_mode"),
        ("[environment]\nnetwork_mode = 'allowlist'\nallowed_hosts = ['pypi.org']\n", "[environment] network_mode"),
    ],
    ids=["set", "inherited"],
)
def test_check_harbor_refuses_a_verifier_allowlist(tmp_path: Path, toml: str, field: str) -> None:
    task = make_task(tmp_path, toml="[task]\nname = 'test/{name}'\n" + toml)
    proc = run_cli("tasks", "check-harbor", "--json", str(task))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (report,) = json.loads(proc.stdout)
    assert report["runs"] is False and report["task_id"] == "test/t"
    (refused,) = [f for f in report["fields"] if f["status"] == "refused"]
    assert refused["field"] == "verifier.network_mode"
    assert f"{field} = 'allowlist'" in refused["note"] and "refused at setup" in refused["note"]
    ok = make_task(tmp_path / "ok", toml="[verifier]\nnetwork_mode = 'no-network'\n")
    assert run_cli("tasks", "check-harbor", str(ok)).returncode == 0
