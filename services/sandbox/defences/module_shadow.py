"""Which top-level module names the verifier's Python can import from outside the workspace,
read from the sandbox itself at verify time (issue 45, section 1).

Under ``python3 -m pytest`` the working directory is first on ``sys.path``: a module the agent
creates there under the name of anything the test process imports (an installed pytest
plugin whose module is not named ``pytest_*``, as anyio, hypothesis and faker ship, any
distribution's package, the standard library) shadows it, and a hook in it passes every test.
A list of names cannot keep up with a task's environment, so the verify phase runs ``PROBE``
in the sandbox with the verifier's identity and env before the verifier (``probe_command``),
and ``runner_guard`` reverts an added module whose top-level name is among those it reports
(route ``module-shadow``), unless the pristine workspace already had that name there.

The probe reads, for every ``python3``/``python`` on the verifier's PATH outside the
workspace: the standard library's and the builtin names; every module, package and namespace
directory in each ``sys.path`` entry outside the workspace (PYTHONPATH's too) and in the site
directories and what their ``.pth`` files add; every distribution's ``top_level.txt``, the
first component of its ``RECORD`` paths and the module of every entry point (``pytest11`` and
every other group). It runs isolated (``-I -S``: no cwd, no PYTHONPATH, no site processing),
so nothing of the agent's runs in it: a planted ``.pth`` is read as data, never executed.
It also reports those directories (``dirs``): on docker the agent's changes in them are
reverted too (``DockerBackend.restore_protected``), where a uid-1000 venv would be written.

What it cannot see: a verifier that brings its own Python at verify time (``uvx pytest``
downloads one); its names are those of that environment, not of the image. The worker's
``sys.stdlib_module_names`` (``runner_guard``'s stdlib route) still covers the standard library.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

ROUTE = "module-shadow"
PROBE_TIMEOUT_S = 60.0
_MARK = "harnessrl-imports:"

PROBE = r"""
import json, os, sys
work = os.path.realpath(sys.argv[1])
def outside(p):
    p = os.path.realpath(p)
    return p != work and not p.startswith(work.rstrip("/") + "/")
import site
dirs = [p for p in sys.path if p] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
sites = list(site.getsitepackages()) + [site.getusersitepackages()]
# -S skips site, which is what reads a venv's pyvenv.cfg for its site-packages: read it here.
exe_dir = os.path.dirname(os.path.abspath(sys.executable))
for cfg in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(os.path.dirname(exe_dir), "pyvenv.cfg")):
    if os.path.isfile(cfg):
        sites += site.getsitepackages([os.path.dirname(cfg)])
dirs += sites
for d in sites:
    try:
        pths = sorted(n for n in os.listdir(d) if n.endswith(".pth"))
    except OSError:
        continue
    for n in pths:
        try:
            lines = open(os.path.join(d, n), encoding="utf-8", errors="replace").read().splitlines()
        except OSError:
            continue
        dirs += [os.path.join(d, l.strip()) for l in lines if l.strip() and not l.startswith(("#", "import"))]
seen, keep = set(), []
for d in dirs:
    r = os.path.realpath(d)
    if r not in seen and outside(r) and os.path.isdir(r):
        seen.add(r)
        keep.append(r)
names = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
for d in keep:
    try:
        entries = os.listdir(d)
    except OSError:
        continue
    for e in entries:
        stem = e.split(".", 1)[0]
        full = os.path.join(d, e)
        if os.path.isdir(full) and e.isidentifier():
            names.add(e)
        elif e.endswith((".py", ".pyc", ".so", ".pyd")) and stem.isidentifier():
            names.add(stem)
try:
    from importlib import metadata
    for dist in metadata.distributions(path=keep):
        for line in (dist.read_text("top_level.txt") or "").split():
            names.add(line.strip().split("/")[0])
        for f in dist.files or ():
            first = f.parts[0] if f.parts else ""
            if first and first != ".." and not first.endswith((".dist-info", ".egg-info", ".data")):
                names.add(first.split(".", 1)[0])
        for ep in dist.entry_points:
            names.add(ep.value.split(":")[0].strip().split(".")[0])
except (OSError, ValueError, ImportError, AttributeError) as e:
    print("probe-metadata-error:", type(e).__name__, e, file=sys.stderr)
names = sorted(n for n in names if n.isidentifier())
print("MARK" + json.dumps({"python": sys.executable, "names": names, "dirs": keep}))
""".replace("MARK", _MARK)


@dataclass(frozen=True)
class VerifierImports:
    """What the verifier's Python(s) can import from outside the workspace: top-level
    ``names`` and the ``dirs`` they are found in (sys.path entries, site directories)."""

    names: frozenset[str] = frozenset()
    dirs: tuple[str, ...] = ()
    pythons: tuple[str, ...] = ()


def probe_command(workdir: PurePosixPath) -> list[str]:
    """The probe for every Python interpreter on PATH (the caller gives the verifier's PATH
    without its workspace entries: a planted ``python3`` there is not asked)."""
    # python and python3 of one directory are usually one interpreter: asked once (a venv's
    # resolve to its base's binary, so the directory is part of what makes it the same).
    script = (
        'seen=""; for py in python3 python; do p=$(command -v "$py") || continue; '
        'k="$(dirname "$p"):$(readlink -f "$p")"; case "$seen" in *"|$k|"*) continue;; esac; seen="$seen|$k|"; '
        f'"$p" -I -S -c {shlex.quote(PROBE)} {shlex.quote(str(workdir))} || true; done; true'
    )
    return ["/bin/sh", "-c", script]


def path_outside(path_value: str, workdir: PurePosixPath) -> str:
    """``PATH`` without its entries inside the workspace (and without relative ones)."""
    keep = [e for e in path_value.split(":") if e.startswith("/") and not PurePosixPath(e).is_relative_to(workdir)]
    return ":".join(keep)


def parse(output: bytes) -> VerifierImports:
    """The probe's report(s): the union over every interpreter that answered."""
    names: set[str] = set()
    dirs: list[str] = []
    pythons: list[str] = []
    for line in output.decode(errors="replace").splitlines():
        if not line.startswith(_MARK):
            continue
        try:
            report = json.loads(line[len(_MARK) :])
        except json.JSONDecodeError:
            continue
        names.update(n for n in report.get("names", ()) if isinstance(n, str) and n.isidentifier())
        dirs += [d for d in report.get("dirs", ()) if isinstance(d, str) and d.startswith("/") and d not in dirs]
        pythons.append(str(report.get("python", "")))
    return VerifierImports(frozenset(names), tuple(dirs), tuple(pythons))
