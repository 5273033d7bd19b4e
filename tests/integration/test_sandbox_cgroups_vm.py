"""The cgroup v2 tests of the local backend (``test_sandbox_cgroups_v2.py``), run for
real: in a VM whose kernel mounts cgroup2 with the memory, pids and cpu controllers
(``tests/cgroup_vm.py`` says why this host cannot). Every test there must pass;
a skip inside the VM is a failure here. The VM emulates its CPU, so this takes
minutes: marked slow."""

from __future__ import annotations

import shlex
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests import cgroup_vm

# Emulated CPUs: 3 minutes on an idle machine, several times that on a busy one.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests/integration/test_sandbox_cgroups_v2.py"


def test_cgroup_v2_limits_are_enforced_in_a_vm(tmp_path: Path) -> None:
    why = cgroup_vm.unavailable()
    if why is not None:
        pytest.skip(why)
    out = cgroup_vm.GUEST_OUT
    env = {
        **cgroup_vm.guest_env(),
        "HOME": "/tmp/home",
        "HARNESSRL_HOME": "/tmp/harnessrl-home",
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",  # the host's file system is read-only in the guest
        "HARNESSRL_TEST_WORKERS": "0",
    }
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    script = (
        f"export {exports}\nmkdir -p $HOME\ncd {shlex.quote(str(ROOT))}\n"
        f"cat /sys/fs/cgroup/cgroup.controllers > {out}/controllers\n"
        f"exec {shlex.quote(sys.executable)} -m pytest {MODULE} -p no:cacheprovider -q -rs --color=no --tb=short "
        f"--basetemp=/tmp/pytest --junitxml={out}/junit.xml\n"
    )
    run = cgroup_vm.run(script, tmp_path / "vm", timeout_s=2300)
    tail = run.console[-6000:]
    assert {"memory", "pids", "cpu"} <= set((tmp_path / "vm" / "controllers").read_text().split()), tail
    assert run.rc == 0, tail
    cases = ET.parse(tmp_path / "vm" / "junit.xml").getroot().iter("testcase")
    outcomes = {case.get("name"): [child.tag for child in case] for case in cases}
    assert len(outcomes) >= 6 and all(not tags for tags in outcomes.values()), (outcomes, tail)
