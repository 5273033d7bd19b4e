"""runner_guard: each of the agent's changes is reverted by the route through which
a test runner or the interpreter would load it, and ordinary work stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.sandbox.common.settings import IntegrityPolicy
from services.sandbox.defences import runner_guard

PRISTINE = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "conftest.py": "# the task's\n",
    "pytest.ini": "[pytest]\nxfail_strict = true\n",
    "pkg/__init__.py": "",
    "pkg/json.py": "# the task's own module named like the stdlib\n",
    "__pycache__/calc.cpython-311.pyc": "pristine bytecode",
    "types.py": "# the task shadows the stdlib itself\n",
    ".venv/pyvenv.cfg": "home = /usr/bin\n",
    ".venv/lib/python3.11/site-packages/_pytest/runner.py": "# pytest's runner\n",
}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    return _tree(tmp_path / "ws", PRISTINE), _tree(tmp_path / "pristine", PRISTINE)


@pytest.mark.parametrize(
    ("rel", "route"),
    [
        (".pytest.ini", "config"),
        ("pytest.toml", "config"),
        (".pytest.toml", "config"),
        ("pyproject.toml", "config"),
        ("sub/tox.ini", "config"),
        ("setup.cfg", "config"),
        ("sub/conftest.py", "conftest"),
        ("conftest/__init__.py", "conftest"),
        ("conftest.cpython-311-x86_64-linux-gnu.so", "conftest"),
        ("evil-1.0.dist-info/entry_points.txt", "plugin-metadata"),
        ("evil.egg-info/entry_points.txt", "plugin-metadata"),
        ("evil.pth", "startup"),
        (".venv/lib/python3.11/site-packages/evil.pth", "environment"),
        (".venv/bin/python3", "environment"),
        ("vendor/site-packages/pytest_evil.py", "environment"),
        ("sitecustomize.py", "startup"),
        ("usercustomize/__init__.py", "startup"),
        ("__pycache__/conftest.cpython-311-pytest-9.2.0.pyc", "bytecode"),
        ("tests/__pycache__/test_calc.cpython-311.pyc", "bytecode"),
        ("argparse.pyc", "bytecode"),
        ("pytest.py", "runner-shadow"),
        ("_pytest/__init__.py", "runner-shadow"),
        ("pluggy/__init__.py", "runner-shadow"),
        ("pytest_timeout.py", "runner-shadow"),
        ("unittest/__init__.py", "runner-shadow"),
        ("argparse.py", "stdlib-shadow"),
        ("src/inspect.py", "stdlib-shadow"),
        ("re/__init__.py", "stdlib-shadow"),
        ("testing_helpers.py", "unittest"),
        (".pytest_cache/v/cache/lastfailed", "runner-state"),
    ],
)
def test_an_added_file_on_a_route_is_removed(trees: tuple[Path, Path], rel: str, route: str) -> None:
    ws, pristine = trees
    _tree(ws, {rel: "import os\n"})
    events = runner_guard.guard_routes(ws, pristine)
    assert not (ws / rel).exists()
    counted = route in ("bytecode", "environment")
    assert events == (
        [f"reverted 1 file(s) the agent phase changed ({route})"] if counted else [f"removed {rel} (added; {route})"]
    )


def test_ordinary_work_stays(trees: tuple[Path, Path]) -> None:
    ws, pristine = trees
    work = {
        "calc.py": "from helpers import plus\n\n\ndef add(a, b):\n    return plus(a, b)\n",
        "helpers.py": "def plus(a, b):\n    return a + b\n",
        "pkg/json.py": "# edited: the task's module\n",
        "pkg/inspect.py": "# inside a package: only ever pkg.inspect\n",
        "pkg/sub/__init__.py": "",
        "types.py": "# the task's own, edited\n",
        "notes.md": "free\n",
    }
    _tree(ws, work)
    assert runner_guard.guard_routes(ws, pristine) == []
    for rel, text in work.items():
        assert (ws / rel).read_text() == text


def test_modified_and_deleted_route_files_are_restored(trees: tuple[Path, Path]) -> None:
    ws, pristine = trees
    (ws / "conftest.py").write_text("pytest_plugins = ['evil']\n")
    (ws / "pytest.ini").unlink()
    (ws / "__pycache__" / "calc.cpython-311.pyc").write_text("planted")
    (ws / ".venv/lib/python3.11/site-packages/_pytest/runner.py").write_text("# every test passes\n")
    events = runner_guard.guard_routes(ws, pristine)
    assert "restored conftest.py (modified; conftest)" in events
    assert "restored pytest.ini (deleted; config)" in events
    assert "reverted 1 file(s) the agent phase changed (environment)" in events
    venv_runner = ".venv/lib/python3.11/site-packages/_pytest/runner.py"
    for rel in ("conftest.py", "pytest.ini", "__pycache__/calc.cpython-311.pyc", venv_runner):
        assert (ws / rel).read_text() == PRISTINE[rel]
    assert runner_guard.guard_routes(ws, pristine) == []  # idempotent


def test_a_venv_the_agent_made_is_removed(trees: tuple[Path, Path]) -> None:
    ws, pristine = trees
    _tree(ws, {"myenv/pyvenv.cfg": "home = /usr/bin\n", "myenv/bin/activate": "", "myenv/lib/x.py": ""})
    assert runner_guard.guard_routes(ws, pristine) == ["reverted 3 file(s) the agent phase changed (environment)"]
    assert not (ws / "myenv").exists()


def test_the_workdir_is_on_sys_path_even_as_a_package(trees: tuple[Path, Path]) -> None:
    """``python -m`` puts the cwd first whatever it holds: an ``__init__.py`` there hides nothing."""
    ws, pristine = trees
    _tree(ws, {"__init__.py": "", "argparse.py": "import sys\nsys.exit(0)\n"})
    assert runner_guard.guard_routes(ws, pristine) == ["removed argparse.py (added; stdlib-shadow)"]


def test_an_emptied_dist_info_is_removed_too(trees: tuple[Path, Path]) -> None:
    """An empty ``x.dist-info`` directory is still a distribution to importlib.metadata;
    an empty directory of the task's stays."""
    ws, pristine = trees
    (pristine / "empty").mkdir()
    _tree(ws, {"evil-1.0.dist-info/METADATA": "Name: evil\n", "evil-1.0.dist-info/entry_points.txt": ""})
    _tree(ws, {"empty/conftest.py": "pytest_plugins = ['evil']\n"})
    runner_guard.guard_routes(ws, pristine)
    assert not (ws / "evil-1.0.dist-info").exists()
    assert (ws / "empty").is_dir() and not any((ws / "empty").iterdir())


def test_load_tests_in_a_package_init_is_reverted(trees: tuple[Path, Path]) -> None:
    ws, pristine = trees
    (ws / "pkg" / "__init__.py").write_text("def load_tests(loader, tests, pattern):\n    return loader.suiteClass()\n")
    _tree(ws, {"newpkg/__init__.py": "def load_tests(*a):\n    pass\n"})
    events = runner_guard.guard_routes(ws, pristine)
    assert "restored pkg/__init__.py (modified; unittest)" in events
    assert "removed newpkg/__init__.py (added; unittest)" in events
    assert (ws / "pkg" / "__init__.py").read_text() == ""


def test_a_symlink_out_of_the_workspace_is_removed(trees: tuple[Path, Path], tmp_path: Path) -> None:
    ws, pristine = trees
    (ws / "plugins").symlink_to(tmp_path)
    (ws / "inside").symlink_to("pkg")
    events = runner_guard.guard_routes(ws, pristine)
    assert events == ["removed plugins (added; symlink-escape)"]
    assert (ws / "inside").is_symlink()


def test_the_policy_switches_each_file_defence(trees: tuple[Path, Path]) -> None:
    ws, pristine = trees
    _tree(ws, {".pytest.ini": "[pytest]\n", "tests/expected.txt": "anything\n"})
    off = IntegrityPolicy(guard_runner_routes=False, restore_pristine_files=False)
    assert runner_guard.restore_for_verify(ws, pristine, off) == []
    only_guard = IntegrityPolicy(restore_pristine_files=False)
    assert runner_guard.restore_for_verify(ws, pristine, only_guard) == ["removed .pytest.ini (added; config)"]
    assert (ws / "tests" / "expected.txt").exists()
    assert runner_guard.restore_for_verify(ws, pristine, IntegrityPolicy()) == [
        "removed tests/expected.txt (added by the agent)"
    ]


def test_verifier_env_cuts_off_bytecode_and_the_user_site() -> None:
    env = runner_guard.verifier_env({"PATH": "/usr/bin", "PYTHONPYCACHEPREFIX": "/app/planted"})
    again = runner_guard.verifier_env({})
    assert env["PATH"] == "/usr/bin"
    assert env["PYTHONNOUSERSITE"] == "1"
    assert env["PYTHONPYCACHEPREFIX"].startswith(runner_guard.VERIFY_PYCACHE_PREFIX)
    assert env["PYTHONPYCACHEPREFIX"] != again["PYTHONPYCACHEPREFIX"]  # fresh each time, not guessable
