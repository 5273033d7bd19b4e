"""Reward 1 only when every named test is reported passed in pytest's JUnit XML report.

Copied into each converted SWE task as ``tests/junit_check.py`` (``swe.py``) and run by its
test.sh after pytest, with ``python3 -I`` (no cwd, no PYTHONPATH on sys.path: the
workspace's modules cannot shadow what this script imports). Standard library only.

Why a report and not pytest's exit status: the agent's code runs inside the test process,
and ``os._exit(0)`` at import ends it with status 0 before any test ran. pytest writes the
report at session end (``pytest_sessionfinish``), so such an exit leaves none, and a named
test that is absent from it, failed, errored or skipped is not a pass.

With ``--verdict PATH`` (the converter's test.sh under ``python3 -m pytest``), the verdict
of our pytest plugin (``grade_plugin.py``) must be there too: no plugin registered during
the run that pytest did not register itself (a hook on a ``Config`` found through ``gc``),
and a test case counts as passed only where the plugin saw its setup and call run and no
phase raise (a report rewritten to "passed" disagrees with it). What still gets through is
in grade_plugin.py's docstring: code in the test process that removes or forges our plugin,
or patches how a test runs (``Function.runtest``). The sandbox's suspicious-change detector
(``services/sandbox/defences/suspicious.py``) counts the patterns those need and can zero
the reward. Without ``--verdict`` (a test command that is not ``python -m pytest``), a hook
that reports every test passed gets through the report alone.

Usage: ``python3 -I junit_check.py [--verdict VERDICT] REPORT NODEID...``; exit 0 iff every
node id passed.
A node id that names a file (``tests/test_x.py``) needs at least one test case of that
file and every one of them passed.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET

_NOT_PASSED = ("failure", "error", "skipped")


def case_ids(report: str) -> dict[str, bool]:
    """Node id -> passed, for every test case of a pytest JUnit XML report (its
    ``classname`` is the module path with dots plus the classes; ``name`` the test's)."""
    cases: dict[str, bool] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        passed = not any(case.find(tag) is not None for tag in _NOT_PASSED)
        cases[f"{classname}::{name}"] = passed
    return cases


def _junit_form(node_id: str) -> tuple[str, str]:
    """``tests/test_x.py::TestA::test_b[1]`` -> (``tests.test_x.TestA::test_b[1]``, file
    prefix ``tests.test_x``), as pytest's junitxml names a node (``mangle_test_address``)."""
    path, _, rest = node_id.partition("::")
    module = path.removesuffix(".py").replace("/", ".")
    if not rest:
        return "", module
    head, bracket, params = rest.partition("[")  # a parameter id may hold "::"
    *classes, name = head.split("::")
    return ".".join([module, *classes]) + "::" + name + bracket + params, module


def missing(cases: dict[str, bool], node_ids: list[str]) -> list[str]:
    """The named tests that the report does not show passed (empty: all passed)."""
    out = []
    for node_id in node_ids:
        exact, module = _junit_form(node_id)
        if exact:
            if not cases.get(exact, False):
                out.append(node_id)
            continue
        in_file = [ok for key, ok in cases.items() if _in_module(key.split("::")[0], module)]
        if not in_file or not all(in_file):
            out.append(node_id)
    return out


def _in_module(classname: str, module: str) -> bool:
    return classname == module or classname.startswith(module + ".")


def ran_clean(verdict: dict, key: str) -> bool:
    """The plugin saw the test case ``key``'s setup and call run and no phase raise."""
    phases = verdict.get("tests", {}).get(key)
    if not isinstance(phases, dict) or "setup" not in phases or "call" not in phases:
        return False
    return not any(phases.values())


def read_verdict(path: str, cases: dict[str, bool]) -> dict[str, bool] | None:
    """``cases`` as the plugin's verdict confirms them; None (with the reason printed) when
    the verdict is missing, unreadable or names a plugin that pytest did not register."""
    try:
        with open(path, encoding="utf-8") as f:
            verdict = json.load(f)
    except (OSError, ValueError) as e:
        print(f"junit_check: no readable verdict of the grade plugin ({e}): no test passed", file=sys.stderr)
        return None
    late = verdict.get("late_plugins") if isinstance(verdict, dict) else None
    if not isinstance(late, list) or not isinstance(verdict.get("tests"), dict):
        print("junit_check: the grade plugin's verdict is malformed: no test passed", file=sys.stderr)
        return None
    for plugin in late:
        print(f"junit_check: a plugin pytest did not register: {plugin}", file=sys.stderr)
    if late:
        return None
    confirmed = {}
    for key, passed in cases.items():
        confirmed[key] = passed and ran_clean(verdict, key)
        if passed and not confirmed[key]:
            print(f"junit_check: reported passed, but did not run clean: {key}", file=sys.stderr)
    return confirmed


def main(argv: list[str]) -> int:
    verdict = None
    if argv[:1] == ["--verdict"] and len(argv) > 1:
        verdict, argv = argv[1], argv[2:]
    if len(argv) < 2:
        print("usage: junit_check.py [--verdict VERDICT] REPORT NODEID...", file=sys.stderr)
        return 2
    try:
        cases = case_ids(argv[0])
    except (OSError, ET.ParseError) as e:
        print(f"junit_check: no readable report ({e}): no test is reported passed", file=sys.stderr)
        return 1
    if verdict is not None:
        confirmed = read_verdict(verdict, cases)
        if confirmed is None:
            return 1
        cases = confirmed
    not_passed = missing(cases, argv[1:])
    for node_id in not_passed:
        print(f"junit_check: not reported passed: {node_id}", file=sys.stderr)
    return 1 if not_passed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
