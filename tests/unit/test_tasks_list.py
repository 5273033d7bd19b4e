"""``harnessrl tasks list``: pools and families with counts (the built-in pools by default);
a path that is neither a task nor a pool is one clear error, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from harnessrl.paths import PROJECT_ROOT
from tests.cli_support import run_cli
from tests.sandbox_support import make_task

FAMILY_TOML = '[metadata]\ncategory = "{family}"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\n'


def test_lists_the_builtin_pools_by_default() -> None:
    out = run_cli("tasks", "list", "--json")
    assert out.returncode == 0, out.stderr
    rows = {Path(r["path"]).name: r for r in json.loads(out.stdout)}
    assert rows["train"]["path"] == str(PROJECT_ROOT / "tasks" / "builtin" / "train")
    assert rows["train"]["tasks"] == 48 and rows["train"]["families"]["echo"] == 8
    assert rows["heldout"]["tasks"] == 18 and len(rows["heldout"]["families"]) == 6
    text = run_cli("tasks", "list").stdout
    assert "48 task(s)" in text and "  echo" in text and "families = [FAMILY]" in text


def test_lists_a_pool_and_a_single_task(tmp_path: Path) -> None:
    for name, fam in (("a", "alpha"), ("b", "alpha"), ("c", "beta")):
        make_task(tmp_path / "pool", name, toml=FAMILY_TOML.replace("{family}", fam))
    make_task(tmp_path / "pool", "plain")
    out = run_cli("tasks", "list", str(tmp_path / "pool"), str(tmp_path / "pool" / "c"), "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows[0] == {"path": str(tmp_path / "pool"), "tasks": 4, "families": {"": 1, "alpha": 2, "beta": 1}}
    assert rows[1]["tasks"] == 1 and rows[1]["families"] == {"beta": 1}
    assert "(no family)" in run_cli("tasks", "list", str(tmp_path / "pool")).stdout


def test_bad_paths_are_one_clear_error(tmp_path: Path) -> None:
    out = run_cli("tasks", "list", str(tmp_path / "nope"))
    assert out.returncode == 2 and f"task path {tmp_path / 'nope'} does not exist" in out.stderr
    (tmp_path / "empty").mkdir()
    out = run_cli("tasks", "list", str(tmp_path / "empty"))
    assert out.returncode == 2 and "is neither a task" in out.stderr and "Traceback" not in out.stderr
