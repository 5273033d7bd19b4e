"""Module shadowing (issue 45, section 1): the probe reads what the verifier's Python can
import from outside the workspace, run for real on this machine's interpreter; the guard
reverts an added module of such a name, keeps a new name and the task's own module; on
docker the agent's changes on the verifier's lookup paths outside the workspace are found
from the container's diff."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

from services.sandbox.defences import module_shadow, path_guard, runner_guard


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _probe(workdir: Path, env: dict[str, str]) -> module_shadow.VerifierImports:
    argv = module_shadow.probe_command(PurePosixPath(workdir))
    out = subprocess.run(argv, capture_output=True, env=env, cwd=workdir, check=True).stdout
    return module_shadow.parse(out)


def _plugin_dir(root: Path) -> Path:
    """A directory holding an installed pytest plugin whose module is not named ``pytest_*``."""
    return _tree(
        root,
        {
            "shadowplug/__init__.py": "",
            "shadowplug-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: shadowplug\nVersion: 1.0\n",
            "shadowplug-1.0.dist-info/entry_points.txt": "[pytest11]\nplug = shadowplug.hooks:Plugin\n",
            "shadowplug-1.0.dist-info/top_level.txt": "shadowplug\n",
            "other-2.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: other\nVersion: 2.0\n",
            "other-2.0.dist-info/RECORD": "otherpkg/__init__.py,,\n../../bin/tool,,\n",
            "run.pth": "import this_line_is_never_run\n",
        },
    )


def test_the_probe_reads_the_sandboxes_own_environment(tmp_path: Path) -> None:
    plugins = _plugin_dir(tmp_path / "pylib")
    work = _tree(tmp_path / "work", {"calc.py": "", "mine/__init__.py": ""})
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "PYTHONPATH": f"{plugins}:{work}"}
    imports = _probe(work, env)
    assert imports.pythons, "no interpreter answered"
    # the entry point's module, top_level.txt, RECORD, the stdlib and what a directory holds
    assert {"shadowplug", "otherpkg", "json", "sys", "pytest"} <= imports.names
    # nothing from the workspace (it is on PYTHONPATH and is the cwd), nothing a .pth would import
    assert not {"calc", "mine", "this_line_is_never_run"} & imports.names
    assert str(plugins.resolve()) in imports.dirs and str(work.resolve()) not in imports.dirs


def test_a_planted_python_in_the_workspace_is_not_asked(tmp_path: Path) -> None:
    work = _tree(tmp_path / "work", {"bin/python3": "#!/bin/sh\necho harnessrl-imports:{}\n"})
    os.chmod(work / "bin" / "python3", 0o755)
    path = module_shadow.path_outside(f"{work}/bin:/usr/bin:relative", PurePosixPath(work))
    assert path == "/usr/bin"


def test_an_added_module_of_an_importable_name_is_reverted(tmp_path: Path) -> None:
    pristine = _tree(tmp_path / "pristine", {"calc.py": "", "src/anyio_compat.py": "", "vendored/__init__.py": ""})
    ws = _tree(tmp_path / "ws", {"calc.py": "", "src/anyio_compat.py": "", "vendored/__init__.py": ""})
    _tree(
        ws,
        {
            "shadowplug.py": "hook",  # the cheat: the plugin's module, first on sys.path
            "hypothesis/__init__.py": "hook",  # a package of an installed name
            "otherpkg/sub/mod.py": "hook",  # a namespace portion of an installed name
            "src/faker.py": "hook",  # src/ is no package: a sys.path entry under pytest's rootdir insertion
            "vendored/faker.py": "fine",  # vendored.faker: not top-level
            "helpers.py": "fine",  # a new module of a new name
            "calc_extra/__init__.py": "fine",
            "README.txt": "fine",
        },
    )
    importable = frozenset({"shadowplug", "hypothesis", "otherpkg", "faker", "calc", "vendored", "README"})
    events = runner_guard.guard_routes(ws, pristine, importable)
    assert events == [
        "removed hypothesis/__init__.py (added; module-shadow)",
        "removed otherpkg/sub/mod.py (added; module-shadow)",
        "removed shadowplug.py (added; module-shadow)",
        "removed src/faker.py (added; module-shadow)",
    ]
    assert not (ws / "hypothesis").exists() and not (ws / "otherpkg").exists()
    for kept in ("vendored/faker.py", "helpers.py", "calc_extra/__init__.py", "README.txt", "calc.py"):
        assert (ws / kept).exists(), kept
    # without the sandbox's names only the worker's stdlib route applies
    _tree(ws, {"shadowplug.py": "hook"})
    assert runner_guard.guard_routes(ws, pristine) == []


def test_the_tasks_own_module_of_an_importable_name_is_kept(tmp_path: Path) -> None:
    """An editable install of the task's repo makes its package importable: the agent's new
    file inside it, and its edit of it, are the task's work."""
    files = {"astropy/__init__.py": "", "astropy/units.py": ""}
    pristine, ws = _tree(tmp_path / "pristine", files), _tree(tmp_path / "ws", files)
    _tree(ws, {"astropy/new_module.py": "x = 1\n", "astropy/units.py": "y = 2\n"})
    assert runner_guard.guard_routes(ws, pristine, frozenset({"astropy"})) == []


def test_lookup_changes_outside_the_workspace() -> None:
    diff: list[dict[str, object]] = [
        {"Path": "/opt/venv/lib/python3.11/site-packages/plug/__init__.py", "Kind": 0},
        {"Path": "/opt/venv/lib/python3.11/site-packages/evil.pth", "Kind": 1},
        {"Path": "/home/agent/pytest.ini", "Kind": 1},
        {"Path": "/home/agent/conftest.py", "Kind": 1},
        {"Path": "/home/conftest.py", "Kind": 0},
        {"Path": "/home/agent/notes.txt", "Kind": 1},  # not a config pytest reads
        {"Path": "/home/agent/app/pytest.ini", "Kind": 1},  # the workspace's own guard's
        {"Path": "/tmp/x.py", "Kind": 1},
        {"Path": "/home/agent/sub/pytest.ini", "Kind": 1},  # not a parent of WORKDIR
    ]
    changes = path_guard.lookup_changes(
        diff, ("/opt/venv/lib/python3.11/site-packages", "/"), PurePosixPath("/home/agent/app")
    )
    assert changes.added == [
        "/opt/venv/lib/python3.11/site-packages/evil.pth",
        "/home/agent/pytest.ini",
        "/home/agent/conftest.py",
    ]
    assert changes.changed == ["/opt/venv/lib/python3.11/site-packages/plug/__init__.py", "/home/conftest.py"]


def test_parse_ignores_what_is_not_a_report() -> None:
    out = b"noise\nharnessrl-imports:{bad json\nharnessrl-imports:" + (
        b'{"python": "/usr/bin/python3", "names": ["json", "not-an-identifier", 3], "dirs": ["/usr/lib", "rel"]}\n'
    )
    imports = module_shadow.parse(out)
    assert imports == module_shadow.VerifierImports(frozenset({"json"}), ("/usr/lib",), ("/usr/bin/python3",))
