"""Our graders' pytest plugin: what pytest really ran, beside what it reported (PYTEST_DONT_REWRITE).

Copied into each converted SWE task as ``tests/harnessrl_grade.py`` (``swe.py``). Its test.sh
copies it into the working directory under a name drawn at verify time
(``harnessrl_grade_<random hex>``) and loads it with ``-p NAME``: under ``python3 -m pytest``
the working directory is first on ``sys.path``, so a module the agent planted there (or an
unchecked-hash ``__pycache__`` entry) would win over any fixed name on any later path entry;
a name nobody knew before the verify phase cannot be planted. It writes a verdict
(``--harnessrl-verdict PATH``, JSON) at session end that ``junit_check.py --verdict`` reads:

- ``late_plugins``: plugins registered after this one that pytest did not register itself.
  From this plugin's registration on (``pytest_addhooks``: before entry-point plugins and
  every conftest), ``pluginmanager.register`` is wrapped to note who called it. A
  registration is pytest's own when the caller is pytest's or pluggy's code (builtin
  plugins, ``conftest.py`` modules through ``consider_conftest``, ``pytest_plugins`` and
  entry points through ``import_plugin``), a conftest module's code (a conftest is the
  task's configuration, which the sandbox's runner guard keeps pristine), or code of the
  installed environment (site-packages: a third-party plugin's helpers). A plugin that is
  registered at session end but went through no wrapped ``register`` (pluggy's
  ``PluginManager.register`` called unbound) is late too. A hook on a ``Config`` found
  through ``gc`` and registered from the agent's module is one of these.
- ``tests``: for each test (keyed as pytest's JUnit report names its case), whether its
  setup, call and teardown raised, seen by hook wrappers that run innermost
  (``trylast``): a report that another hook rewrote to "passed" disagrees with them.

Standard library and pytest only; no pytest internals but ``_pytest.junitxml``'s naming
(with a copy as fallback) and ``_conftest_plugins``/``TestCaseFunction._excinfo`` read
where present.

What still gets through: code in the test process can do what this plugin does. It can
unregister this plugin and write a verdict of its own (a hook that runs before ours), patch
``Function.runtest`` (found through ``gc``) so that a failing test does not raise, add a
hook implementation to a hook caller without registering a plugin and also rewrite what
this plugin records, or spoof a caller's file name (``exec`` of code compiled under a
conftest's path). The sandbox's suspicious-change detector (``defences/suspicious.py``)
counts the patterns such code needs. Tests run in other processes (``pytest-xdist -n``)
are not seen: their cases then count as not passed.
"""

from __future__ import annotations

import json
import os
import re
import sys
import sysconfig
from typing import Any

import pluggy
import pytest

_OPTION = "--harnessrl-verdict"
_PHASES = ("setup", "call", "teardown")


class _Watch:
    """Every registration with its caller's file, from this plugin's own registration on."""

    def __init__(self, pluginmanager: Any) -> None:
        self.pm = pluginmanager
        self.before = {id(p) for p in pluginmanager.get_plugins()}
        self.seen: dict[int, tuple[Any, str, str]] = {}  # id -> (plugin, name, caller's file)
        self.trusted = _trusted_dirs()
        original = pluginmanager.register

        def register(plugin: Any, name: str | None = None) -> Any:
            caller = sys._getframe(1).f_code.co_filename
            registered = original(plugin, name)
            if registered is not None:
                self.seen[id(plugin)] = (plugin, registered, caller)
            return registered

        pluginmanager.register = register

    def late(self) -> list[str]:
        """The plugins registered now that pytest did not register itself."""
        conftests = set(getattr(self.pm, "_conftest_plugins", ()))
        conftest_files = {os.path.realpath(getattr(m, "__file__", "") or "") for m in conftests}
        out = []
        for plugin in self.pm.get_plugins():
            if id(plugin) in self.before or plugin in conftests or plugin is sys.modules.get(__name__):
                continue
            name = self.pm.get_name(plugin) or repr(plugin)
            if id(plugin) not in self.seen:
                out.append(f"{name}: registered without the plugin manager's register ({_describe(plugin)})")
                continue
            caller = os.path.realpath(self.seen[id(plugin)][2])
            if caller in conftest_files or any(caller.startswith(d) for d in self.trusted):
                continue
            out.append(f"{name}: registered by {caller} ({_describe(plugin)})")
        return out


def _trusted_dirs() -> list[str]:
    """pytest's and pluggy's own code, and the installed environment's library directories."""
    import _pytest

    dirs = [os.path.dirname(_pytest.__file__), os.path.dirname(pluggy.__file__)]
    paths = sysconfig.get_paths()
    dirs += [paths[k] for k in ("purelib", "platlib") if k in paths]
    return [os.path.realpath(d).rstrip("/") + "/" for d in dirs if d]


def _describe(plugin: Any) -> str:
    return getattr(plugin, "__file__", None) or type(plugin).__qualname__


def _junit_key(nodeid: str) -> str:
    """``classname::name`` as pytest's junitxml writes the test case of ``nodeid``."""
    try:
        from _pytest.junitxml import bin_xml_escape, mangle_test_address

        names = mangle_test_address(nodeid)
        name = bin_xml_escape(names[-1])
        return ".".join(names[:-1]) + "::" + str(getattr(name, "uniobj", name))  # old pytest: a py.xml.raw
    except ImportError:
        path, bracket, params = nodeid.partition("[")
        names = path.split("::")
        names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
        names[-1] += bracket + params
        return ".".join(names[:-1]) + "::" + names[-1]


_watch: _Watch | None = None
_ran: dict[str, dict[str, bool]] = {}


def pytest_addoption(parser: Any) -> None:
    parser.addoption(_OPTION, dest="harnessrl_verdict", default=None, help="where to write the grade's verdict")


def pytest_addhooks(pluginmanager: Any) -> None:
    # Historic: called as this module registers (-p plugins come before entry points and conftests).
    global _watch
    if _watch is None:
        _watch = _Watch(pluginmanager)


def _record(item: Any, when: str, outcome: Any) -> None:
    raised = outcome.excinfo is not None
    # A unittest TestCase's failure is kept on the item, not raised out of runtest().
    raised = raised or (when == "call" and bool(getattr(item, "_excinfo", None)))
    # The last run of a phase counts (a rerun plugin runs a test's protocol again).
    _ran.setdefault(_junit_key(item.nodeid), {})[when] = raised


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_setup(item: Any) -> Any:
    outcome = yield
    _record(item, "setup", outcome)


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_call(item: Any) -> Any:
    outcome = yield
    _record(item, "call", outcome)


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item: Any) -> Any:
    outcome = yield
    _record(item, "teardown", outcome)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: Any) -> None:
    path = session.config.getoption("harnessrl_verdict")
    if not path:
        return
    late = _watch.late() if _watch is not None else ["the plugin was loaded without its registration hook"]
    verdict = {"late_plugins": late, "tests": _ran, "phases": list(_PHASES)}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(verdict, f)
