"""The verifier's test runner sees nothing of the agent's but source (invariant 6).

A hidden test fails or passes on the code it imports. Everything else the runner
or the interpreter loads *implicitly*, from the files around the tests, decides
how it runs: its configuration, its plugins, what Python executes at start-up,
which module a name resolves to, which bytecode stands in for a source file. A
list of file names cannot keep up with that (pytest 9 alone added three config
names), so this module classifies each of the agent's changes against the
pristine snapshot by the *route* through which it would be loaded, and reverts
it: an added file is removed, a modified or deleted one restored. Each revert is
a tamper event naming the route. Ordinary modules (``helpers.py`` next to
``calc.py``) and edits of source files belong to no route: they stay.

Routes (pytest sources cited from 9.2; older versions read a subset):

config      a file pytest reads configuration from, by name, in any directory
            (``locate_config`` walks up from every argument):
            ``_pytest/config/findpaths.py`` ``CONFIG_LOADERS_BY_NAME``: pytest.toml and
            .pytest.toml (9.0+), pytest.ini, .pytest.ini (7.2+), pyproject.toml
            ([tool.pytest] 9.0+, [tool.pytest.ini_options] 6.0+), tox.ini, setup.cfg.
            ``addopts`` there carries ``-p plugin``, ``-c``, ``--rootdir``, ``-o``.
conftest    ``conftest.py`` in any form (``.py``, a package, an extension module):
            loaded from the rootdir, every argument's directory and their parents up
            to confcutdir (``_pytest/config/__init__.py`` ``_getconftestmodules``),
            and its ``pytest_plugins`` imports more (``consider_module``).
plugin-metadata  ``*.dist-info``/``*.egg-info``/``*.egg``/``*.egg-link``: entry points of
            group ``pytest11`` are loaded from every distribution that
            ``importlib.metadata.distributions()`` finds on sys.path
            (``_preparse`` -> ``load_setuptools_entrypoints``), and ``python -m
            pytest`` puts the cwd first on sys.path.
startup     ``*.pth``, ``sitecustomize``, ``usercustomize``: run by ``site`` at
            interpreter start (a workspace may hold a venv).
environment  anything in a virtual environment in the workspace (a directory with
            ``pyvenv.cfg``) or under ``site-packages``/``dist-packages``: the runner
            itself, its plugins and its interpreter live there. The verifier runs
            the task's environment, not one the agent edited or made.
bytecode    anything under ``__pycache__`` and sourceless ``*.pyc``: Python validates a
            cached pyc by its source's mtime and size (the restore keeps mtimes),
            pytest's assertion rewriter (``_pytest/assertion/rewrite.py`` ``_read_pyc``;
            9.2: by the source's hash) by what the agent can compute from the
            pristine file it reads, so a planted pyc would run instead of a pristine
            conftest or test file. Both read it under PYTHONDONTWRITEBYTECODE (that
            only stops writing).
runner-shadow  a top-level module named like the runner or its dependencies
            (pytest, _pytest, pluggy, unittest, ...) or any ``pytest_*`` plugin:
            the cwd comes first on sys.path.
stdlib-shadow  an *added* top-level module named like a standard-library module
            (``sys.stdlib_module_names`` of the worker's Python): the runner
            imports the stdlib after the cwd is on sys.path. A pristine one the agent
            edits is the task's own module and stays.
module-shadow  an *added* module file whose top-level name (the file's, or that of a
            directory holding it, at any place that can be a sys.path entry) is one the
            verifier's Python can import from outside the workspace, as the sandbox's own
            environment reports it at verify time (``module_shadow``: every installed
            distribution's names, every entry point's module, the stdlib), unless the
            pristine workspace already had that name there (the task's own module). A
            new module of a new name is no route.
unittest    a package ``__init__.py`` defining ``load_tests`` (unittest discovery
            hands it the suite to replace), and added modules matching unittest's
            default discovery pattern ``test*.py``.
runner-state  ``.pytest_cache`` (``--lf``, ``--sw`` and friends read it).
symlink-escape  a symlink the agent made that points out of the workspace: what it
            points at is beyond this guard's sight.

Besides the files, the verify exec's environment is hardened
(``verifier_env``): ``PYTHONPYCACHEPREFIX`` at a fresh, unguessable directory
(Python >= 3.8 and pytest >= 6.0 then read no ``__pycache__`` at all) and
``PYTHONNOUSERSITE=1``. PYTEST_ADDOPTS/PYTEST_PLUGINS reach the verifier only
from the task (its image's ENV and ``[verifier] env``): no backend passes the
worker's environment through, so there is nothing of the agent's to strip.

Why not "grade the patch" (apply the agent's diff of tracked non-test files to a
pristine copy, as SWE-bench does): on these backends it adds a second copy of the
workspace per trial and the diff's own edge cases (binary files, modes,
symlinks), and for what it removes inside the workspace it is this guard plus
the test-file restore. What it would add is the container's files outside the
workspace on Docker (a task image whose site-packages the sandbox user can
write); it is the next step if such images appear.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path

from services.sandbox.common.settings import IntegrityPolicy
from services.sandbox.defences import integrity, module_shadow

CONFIG_FILES = frozenset(
    {"pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg"}
)
_METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg", ".egg-link")
_STARTUP_MODULES = frozenset({"sitecustomize", "usercustomize"})
# The runner and what it imports at start-up (pytest 9.2's requirements, unittest, nose).
RUNNER_MODULES = frozenset(
    {
        "pytest",
        "_pytest",
        "py",
        "pluggy",
        "iniconfig",
        "packaging",
        "pygments",
        "tomli",
        "tomllib",
        "exceptiongroup",
        "colorama",
        "unittest",
        "nose",
        "nose2",
        "xdist",
    }
)
_SITE_DIRS = frozenset({"site-packages", "dist-packages"})
# Routes whose reverts are counted in one event, not listed: common and many.
_COUNTED_ROUTES = ("bytecode", "environment")
_MODULE_SUFFIXES = (".py", ".pyc", ".pyo", ".so", ".pyd", ".pyw")
VERIFY_PYCACHE_PREFIX = "/tmp/harnessrl-pycache-"


def restore_for_verify(
    workspace: Path, pristine: Path, policy: IntegrityPolicy, importable: frozenset[str] = frozenset()
) -> list[str]:
    """Every file defence before verify, as the policy switches them: the test
    files (``integrity.restore_protected``), then the runner's routes (``importable``:
    the verifier's importable names, ``module_shadow``). Returns the tamper events."""
    events: list[str] = []
    if policy.restore_pristine_files:
        events += integrity.restore_protected(workspace, pristine, policy.protected_globs, policy.protected_dirs)
    if policy.guard_runner_routes:
        events += guard_routes(workspace, pristine, importable)
    return events


def verifier_env(env: dict[str, str]) -> dict[str, str]:
    """The verify exec's env with bytecode and the user site cut off (see the module doc)."""
    return {**env, "PYTHONPYCACHEPREFIX": VERIFY_PYCACHE_PREFIX + uuid.uuid4().hex, "PYTHONNOUSERSITE": "1"}


def guard_routes(workspace: Path, pristine: Path, importable: frozenset[str] = frozenset()) -> list[str]:
    """Reverts each of the agent's changes that a route would load implicitly;
    returns one tamper event per file (bytecode and environment: one per route,
    an agent that runs Python or makes a venv writes many). ``importable``: the
    top-level names the verifier's Python imports from outside the workspace."""
    before, now = integrity.walk_files(pristine), integrity.walk_files(workspace)
    environments = _environments([*before, *now])
    events: list[str] = []
    counted = dict.fromkeys(_COUNTED_ROUTES, 0)
    for rel in sorted(now):
        st, added = now[rel], rel not in before
        route = classify(rel, added=added, workspace=workspace, st=st, environments=environments)
        if route is None and added and _shadows(rel, workspace, pristine, importable):
            route = module_shadow.ROUTE
        if route is None or (not added and _unchanged(workspace / rel, pristine / rel, st, before[rel])):
            continue
        if added:
            _remove(workspace, pristine, rel)
        else:
            _restore(workspace, pristine, rel)
        if route in counted:
            counted[route] += 1
        else:
            events.append(f"{'removed' if added else 'restored'} {rel} ({'added' if added else 'modified'}; {route})")
    for rel in sorted(set(before) - set(now)):
        route = classify(rel, added=False, workspace=pristine, st=before[rel], environments=environments)
        if route in counted:
            counted[route] += 1
        elif route is not None:
            events.append(f"restored {rel} (deleted; {route})")
        if route is not None:
            _restore(workspace, pristine, rel)
    events += [f"reverted {n} file(s) the agent phase changed ({route})" for route, n in counted.items() if n]
    return events


def _environments(rels: Iterable[str]) -> frozenset[str]:
    """The virtual environments in the workspace (directories holding ``pyvenv.cfg``;
    not the workspace itself)."""
    return frozenset(rel.rpartition("/")[0] for rel in rels if rel.endswith("/pyvenv.cfg"))


def classify(
    rel: str,
    *,
    added: bool,
    workspace: Path,
    st: os.stat_result | None = None,
    environments: frozenset[str] = frozenset(),
) -> str | None:
    """The route through which the runner or the interpreter would load ``rel``
    implicitly, or None for an ordinary file. ``environments``: the workspace's
    virtual environments (``_environments``). A module that shadows an installed
    one is ``_shadows``'s (it needs the verifier's names and the pristine tree)."""
    parts = rel.split("/")
    name = parts[-1]
    if "__pycache__" in parts[:-1]:
        return "bytecode"
    if _SITE_DIRS & set(parts[:-1]) or any(rel.startswith(env + "/") for env in environments):
        return "environment"
    if ".pytest_cache" in parts[:-1] or name == ".pytest_cache":
        return "runner-state"
    if any(part.endswith(_METADATA_SUFFIXES) for part in parts):
        return "plugin-metadata"
    if st is not None and stat.S_ISLNK(st.st_mode) and _escapes(workspace, rel):
        return "symlink-escape"
    if name in CONFIG_FILES:
        return "config"
    if name.endswith(".pth"):
        return "startup"
    module, is_package = _module_name(parts)
    if module is None:
        return None
    if module == "conftest":
        return "conftest"
    if module in _STARTUP_MODULES:
        return "startup"
    if name.endswith((".pyc", ".pyo")) and not is_package:
        return "bytecode"  # sourceless bytecode: imported where no .py of that name exists
    top_level = _top_level(workspace, parts, is_package)
    if top_level and (module in RUNNER_MODULES or module.startswith("pytest_")):
        return "runner-shadow"
    if top_level and added and module in sys.stdlib_module_names:
        return "stdlib-shadow"
    if name == "__init__.py" and _defines_load_tests(workspace / rel):
        return "unittest"
    if added and not is_package and name.startswith("test") and name.endswith(".py"):
        return "unittest"
    return None


def _shadows(rel: str, workspace: Path, pristine: Path, importable: frozenset[str]) -> bool:
    """Whether the added module file ``rel`` provides, at a directory that can be a
    sys.path entry (``_top_level``), a top-level name of ``importable`` that the
    pristine workspace did not have there: the file itself (``x.py``, ``x.cpython-*.so``)
    or any directory holding it (``x/__init__.py``, ``x/sub/y.py``: a package, or a
    namespace portion of ``x``, which wins over an installed namespace package)."""
    parts = rel.split("/")
    if not importable or not parts[-1].endswith(_MODULE_SUFFIXES):
        return False
    for depth in range(len(parts)):
        holder, name = parts[:depth], parts[depth]
        if depth == len(parts) - 1:
            name = name.split(".", 1)[0]
        if name not in importable:
            continue
        holder_dir = workspace.joinpath(*holder)
        if holder and any((holder_dir / f"__init__{suffix}").exists() for suffix in (".py", ".pyc")):
            continue  # a package's directory: its names are x.name, not top-level
        if not _pristine_provides(pristine.joinpath(*holder), name):
            return True
    return False


def _pristine_provides(directory: Path, name: str) -> bool:
    """Whether the pristine ``directory`` had a module, package or directory named ``name``."""
    if (directory / name).exists() or (directory / name).is_symlink():
        return True
    try:
        return any(e.startswith(name + ".") and e.endswith(_MODULE_SUFFIXES) for e in os.listdir(directory))
    except OSError:
        return False


def _module_name(parts: list[str]) -> tuple[str | None, bool]:
    """The top-level-or-local module name a file provides (``x`` for ``x.py``,
    ``x.cpython-311-x86_64-linux-gnu.so``, or ``x/__init__.py``), and whether it is a package's."""
    name = parts[-1]
    if name.startswith("__init__.") and name.endswith(_MODULE_SUFFIXES) and len(parts) > 1:
        return parts[-2], True
    if name.endswith(_MODULE_SUFFIXES):
        return name.split(".", 1)[0], False
    return None, False


def _top_level(workspace: Path, parts: list[str], is_package: bool) -> bool:
    """Whether the module's directory could itself be a sys.path entry: the
    workdir, or a directory that is not a package (pytest's rootdir insertion
    stops at the first directory without ``__init__.py``). Not seen: a task whose
    PYTHONPATH names a package directory of the workspace."""
    holder = parts[:-2] if is_package else parts[:-1]
    if not holder:
        return True  # the workdir: the cwd of ``python -m``, first on sys.path, package or not
    directory = workspace.joinpath(*holder)
    return not any((directory / f"__init__{suffix}").exists() for suffix in (".py", ".pyc"))


def _defines_load_tests(path: Path) -> bool:
    try:
        return path.is_file() and not path.is_symlink() and b"load_tests" in path.read_bytes()
    except OSError:
        return False


def _escapes(workspace: Path, rel: str) -> bool:
    target = os.readlink(workspace / rel)
    if posixpath.isabs(target):
        return True
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    return resolved == ".." or resolved.startswith("../")


def _unchanged(current: Path, original: Path, st: os.stat_result, st0: os.stat_result) -> bool:
    if stat.S_ISLNK(st.st_mode) != stat.S_ISLNK(st0.st_mode):
        return False
    if not stat.S_ISLNK(st.st_mode) and st.st_size != st0.st_size:
        return False
    return integrity.same_file(original, current)


def _remove(workspace: Path, pristine: Path, rel: str) -> None:
    path = workspace / rel
    if path.is_symlink() or path.exists():
        path.unlink()
    _prune_empty(workspace, pristine, rel.split("/")[:-1])


def _prune_empty(workspace: Path, pristine: Path, parents: Iterable[str]) -> None:
    """Removes the directories a removed file leaves empty (an empty ``x.dist-info``
    is still a distribution to importlib.metadata), up to the workspace or the
    first one the pristine snapshot has."""
    holder = list(parents)
    while holder and not pristine.joinpath(*holder).is_dir():
        directory = workspace.joinpath(*holder)
        try:
            directory.rmdir()
        except OSError:
            return
        holder.pop()


def _restore(workspace: Path, pristine: Path, rel: str) -> None:
    integrity.replace_symlinked_parents(workspace, rel)
    src, dst = pristine / rel, workspace / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_symlink() or dst.is_file():
        dst.unlink()
    elif dst.is_dir():
        shutil.rmtree(dst)
    shutil.copy2(src, dst, follow_symlinks=False)
