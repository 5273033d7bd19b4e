"""Harbor's verifier user and network (``verifier_policy.resolve``) and the guard of
the verifier's routes: real files, a real ``sh`` and ``find`` for the outside script."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from services.sandbox.common.errors import EnvSetupError
from services.sandbox.defences import path_guard
from services.sandbox.task import verifier_policy as vp
from services.sandbox.task.model import load_task
from tests.sandbox_support import DEFAULT_TOML, make_task


def task_with(tmp_path: Path, verifier: str = "", environment: str = ""):
    toml = DEFAULT_TOML.replace("[verifier]\n", "[verifier]\n" + verifier).replace(
        "[environment]\n", "[environment]\n" + environment
    )
    return load_task(make_task(tmp_path, toml=toml))


@pytest.mark.parametrize(
    ("verifier", "environment", "public"),
    [
        ("", "", True),  # Harbor's default: [environment] network_mode = "public"
        ("", "network_mode = 'no-network'\n", False),
        ("", "allow_internet = false\n", False),
        ("", "allow_internet = true\n", True),
        ("network_mode = 'no-network'\n", "", False),
        ("network_mode = 'public'\n", "network_mode = 'no-network'\n", True),
        ("network_mode = 'no-network'\n", "network_mode = 'allowlist'\nallowed_hosts = ['x.org']\n", False),
    ],
)
def test_network_as_harbor_resolves_it(tmp_path: Path, verifier: str, environment: str, public: bool) -> None:
    assert vp.resolve(task_with(tmp_path, verifier, environment)).public is public


@pytest.mark.parametrize(
    ("verifier", "environment", "field"),
    [
        ("network_mode = 'allowlist'\nallowed_hosts = ['pypi.org']\n", "", "[verifier] network_mode"),
        ("", "network_mode = 'allowlist'\nallowed_hosts = ['pypi.org']\n", "[environment] network_mode"),
    ],
)
def test_an_allowlist_is_refused_by_name(tmp_path: Path, verifier: str, environment: str, field: str) -> None:
    with pytest.raises(EnvSetupError, match="egress proxy") as info:
        vp.resolve(task_with(tmp_path, verifier, environment))
    assert f"{field} = 'allowlist'" in str(info.value) and "test/t" in str(info.value)


def test_user_is_the_tasks_or_the_images(tmp_path: Path) -> None:
    assert vp.resolve(task_with(tmp_path / "a")).user == vp.IMAGE_USER
    assert vp.resolve(task_with(tmp_path / "b", "user = 'app'\n")).user == "app"
    assert vp.resolve(task_with(tmp_path / "c", "user = 1001\n")).user == "1001"
    assert vp.is_root(vp.IMAGE_USER, "") and vp.is_root(vp.IMAGE_USER, "root") and vp.is_root("0:0", "app")
    assert not vp.is_root(vp.IMAGE_USER, "1000:1000") and not vp.is_root("app", "")


def test_local_has_root_and_uid_1000_only(tmp_path: Path) -> None:
    vp.check_local_user(task_with(tmp_path / "a"), vp.VerifierRun(user="root", public=False))
    task = task_with(tmp_path / "b", "user = 'app'\n")
    with pytest.raises(EnvSetupError, match="local backend") as info:
        vp.check_local_user(task, vp.resolve(task))
    assert "[verifier] user = 'app'" in str(info.value)


def test_workspace_path_dirs() -> None:
    path = "/app/bin:/usr/bin:/app/.venv/bin:/appendix/bin:/app:relative:/app/bin"
    got = path_guard.workspace_path_dirs(path, PurePosixPath("/app"))
    assert got == [PurePosixPath("bin"), PurePosixPath(".venv/bin"), PurePosixPath(".")]


def test_agent_changes_in_a_workspace_path_dir_are_reverted(tmp_path: Path) -> None:
    pristine, current = tmp_path / "pristine", tmp_path / "current"
    for root in (pristine, current):
        (root / "bin").mkdir(parents=True)
        (root / "bin" / "tool").write_text("#!/bin/sh\necho real\n")
        (root / "bin" / "same").write_text("x")
        (root / "src").mkdir()
    (current / "bin" / "tool").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")  # changed
    (current / "bin" / "python3").write_text("#!/bin/sh\nexit 0\n")  # added
    (current / "bin" / "same").chmod(0o755)  # made executable: a change too
    (current / "src" / "python3").write_text("not on PATH")  # left alone
    (current / "sbin").mkdir()  # a PATH dir the pristine tree lacks: every entry is new
    (current / "sbin" / "pytest").write_text("#!/bin/sh\nexit 0\n")
    events = path_guard.revert_path_dirs(current, pristine, [PurePosixPath("bin"), PurePosixPath("sbin")])
    assert sorted(events) == sorted(f"path-shadow:{p}" for p in ("bin/tool", "bin/python3", "bin/same", "sbin/pytest"))
    assert (current / "bin" / "tool").read_text() == "#!/bin/sh\necho real\n"
    assert not (current / "bin" / "python3").exists() and not (current / "sbin" / "pytest").exists()
    assert (current / "bin" / "same").stat().st_mode & 0o777 == (pristine / "bin" / "same").stat().st_mode & 0o777
    assert (current / "src" / "python3").exists()
    assert path_guard.revert_path_dirs(current, pristine, [PurePosixPath("bin"), PurePosixPath("sbin")]) == []


def test_a_path_dir_replaced_by_a_symlink_is_removed(tmp_path: Path) -> None:
    pristine, current = tmp_path / "pristine", tmp_path / "current"
    pristine.mkdir()
    (current / "elsewhere").mkdir(parents=True)
    (current / "bin").symlink_to(current / "elsewhere")
    assert path_guard.revert_path_dirs(current, pristine, [PurePosixPath("bin")]) == ["path-shadow:bin"]
    assert not (current / "bin").is_symlink() and (current / "elsewhere").is_dir()


def test_route_changes_are_the_agents_outside_the_workspace_on_roots_routes() -> None:
    diff = [
        {"Path": "/opt/tools", "Kind": 0},  # a PATH dir itself: its entries are what counts
        {"Path": "/opt/tools/runtests", "Kind": 0},
        {"Path": "/opt/tools/lib/helper.py", "Kind": 1},  # under a PATH dir: loaded by what runs there
        {"Path": "/etc/apt/apt.conf.d/99hook", "Kind": 1},
        {"Path": "/etc/hosts", "Kind": 0},  # the engine's bind mount
        {"Path": "/usr/local/bin/old", "Kind": 2},  # deleted: not a plant
        {"Path": "/app/bin/python3", "Kind": 1},  # the workspace: revert_path_dirs' job
        {"Path": "/var/tmp/x", "Kind": 1},  # on no route
    ]
    got = path_guard.route_changes(diff, "/app/bin:/opt/tools:/usr/bin", PurePosixPath("/app"))
    assert got.added == ["/opt/tools/lib/helper.py", "/etc/apt/apt.conf.d/99hook"]
    assert got.changed == ["/opt/tools/runtests"]


@pytest.mark.skipif(os.geteuid() != 0, reason="chowns files to the agent's uid")
def test_the_clear_script_removes_added_files_names_changed_ones_and_clears_set_id_bits(tmp_path: Path) -> None:
    added, changed, kept_dir, setuid = tmp_path / "new", tmp_path / "old", tmp_path / "dir", tmp_path / "s"
    for f in (added, changed, setuid):
        f.write_text("#!/bin/sh\n")
    kept_dir.mkdir()
    os.chown(setuid, 1000, 1000)
    setuid.chmod(0o4755)
    script = path_guard.clear_script(
        [str(added), str(kept_dir), str(tmp_path / "gone")], [str(changed), str(kept_dir)], 1000
    )
    # The real find walks / for set-id files: confine it to the test's tree.
    script = script.replace("find / -xdev", f"find {tmp_path} -xdev")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == [f"-{added}", f"~{changed}"]
    assert not added.exists() and changed.exists() and kept_dir.is_dir()
    assert setuid.stat().st_mode & 0o6000 == 0
