"""Our graders' pytest plugin (``pools/grade_plugin.py``) and ``junit_check --verdict``, over
real pytest runs: what pytest really ran against what it reported, and who registered a
plugin during the run. The gc-found Config hook is in test_suspicious.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from services.sandbox.pools import junit_check

PLUGIN = Path(junit_check.__file__).with_name("grade_plugin.py")
NAME = "harnessrl_grade_5e1d"

# Rewrites every report to "passed" without registering any plugin: only the innermost
# wrappers' record tells.
REWRITE = """import _pytest.reports

_orig = _pytest.reports.TestReport.from_item_and_call.__func__


def _passed(cls, item, call):
    report = _orig(cls, item, call)
    report.outcome, report.longrepr = "passed", None
    return report


_pytest.reports.TestReport.from_item_and_call = classmethod(_passed)
"""
# Registers a hook through pluggy's own register, which the plugin manager's wrapper never sees.
UNBOUND = """import gc

import pluggy
import pytest


class _Pass:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        outcome.get_result().outcome = "passed"


for _obj in gc.get_objects():
    if type(_obj).__name__ == "Config" and hasattr(_obj, "pluginmanager"):
        pluggy.PluginManager.register(_obj.pluginmanager, _Pass())
        break
"""
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
# What legitimate repositories do: a conftest that registers a helper plugin, unittest
# classes (a passing test, an expected failure), parametrised ids, a class of tests.
CONFTEST = (
    "import pytest\n\n\nclass Helper:\n    pass\n\n\ndef pytest_configure(config):\n"
    "    config.pluginmanager.register(Helper(), 'helper')\n\n\n@pytest.fixture\ndef one():\n    return 1\n"
)
LEGIT = """import unittest

import pytest


class TestUnit(unittest.TestCase):
    def test_ok(self):
        self.assertEqual(1, 1)

    @unittest.expectedFailure
    def test_known_bug(self):
        self.assertEqual(1, 2)


class TestPlain:
    @pytest.mark.parametrize("s", ["a b", "x::y", "1.5"])
    def test_param(self, s, one):
        assert one == 1 and s
"""
UNIT_FAIL = (
    "import unittest\n\n\nclass TestU(unittest.TestCase):\n    def test_u(self):\n        self.assertEqual(1, 2)\n"
)


def _run(root: Path, files: dict[str, str], tests: list[str]) -> tuple[int, int, int]:
    """(pytest's status, junit_check without the verdict, with it) over the named tests."""
    for rel, text in {**files, f"{NAME}.py": PLUGIN.read_text()}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    report, verdict = root / "junit.xml", root / "verdict.json"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, "-p", NAME]
    argv += [f"--harnessrl-verdict={verdict}", f"--junitxml={report}"]
    status = subprocess.run(argv, cwd=root, capture_output=True).returncode
    plain = junit_check.main([str(report), *tests])
    return status, plain, junit_check.main(["--verdict", str(verdict), str(report), *tests])


def test_a_rewritten_report_is_not_a_pass(tmp_path: Path, capsys) -> None:
    status, plain, checked = _run(tmp_path, {"calc.py": REWRITE + BUGGY, "tests/test_calc.py": TESTS}, ["tests"])
    assert (status, plain, checked) == (0, 0, 1)
    assert "reported passed, but did not run clean: tests.test_calc::test_add" in capsys.readouterr().err


def test_a_plugin_registered_past_the_plugin_manager_is_late(tmp_path: Path, capsys) -> None:
    status, plain, checked = _run(tmp_path, {"calc.py": UNBOUND + BUGGY, "tests/test_calc.py": TESTS}, ["tests"])
    assert (status, plain, checked) == (0, 0, 1)
    assert "registered without the plugin manager's register (_Pass)" in capsys.readouterr().err


def test_legitimate_runs_pass_and_failures_do_not(tmp_path: Path) -> None:
    legit = {"calc.py": FIXED, "tests/conftest.py": CONFTEST, "tests/test_calc.py": TESTS, "tests/test_legit.py": LEGIT}
    named = ["tests/test_calc.py", "tests/test_legit.py::TestUnit::test_ok"]
    named += ["tests/test_legit.py::TestPlain::test_param[a b]", "tests/test_legit.py::TestPlain::test_param[1.5]"]
    assert _run(tmp_path / "ok", legit, named) == (0, 0, 0)
    verdict = json.loads((tmp_path / "ok" / "verdict.json").read_text())
    assert verdict["late_plugins"] == [] and "tests.test_legit.TestPlain::test_param[a b]" in verdict["tests"]
    failing = {"calc.py": FIXED, "tests/test_u.py": UNIT_FAIL}
    assert _run(tmp_path / "fail", failing, ["tests/test_u.py"]) == (1, 1, 1)


def test_a_missing_or_malformed_verdict_is_no_pass(tmp_path: Path, capsys) -> None:
    _run(tmp_path, {"calc.py": FIXED, "tests/test_calc.py": TESTS}, ["tests"])
    report, ids = str(tmp_path / "junit.xml"), ["tests/test_calc.py::test_add"]
    assert junit_check.main(["--verdict", str(tmp_path / "none.json"), report, *ids]) == 1
    (tmp_path / "bad.json").write_text('{"tests": []}')
    assert junit_check.main(["--verdict", str(tmp_path / "bad.json"), report, *ids]) == 1
    err = capsys.readouterr().err
    assert "no readable verdict" in err and "malformed" in err
