"""The sandbox and the composition root in layers whose imports only point down
(docs/architecture.md, "Layers"). Each module's room is its folder; each room has a floor;
a module imports its own room or a lower floor, never a room beside it or above it, and no
circle of imports spans two rooms. The next change cannot undo it without this failing."""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# services/sandbox: room -> floor. Rooms on one floor do not import each other.
SANDBOX_FLOORS = {
    "common": 0,  # errors, paths, settings, tarsafe, the proxy relay
    "task": 1,  # the Harbor task format: reads and checks a task, runs nothing
    "defences": 2,  # invariant 6 over files, applied by the backends and the verify phase
    "backends.base": 3,  # the backend interface
    "backends": 4,  # each backend
    "harnesses": 4,  # each harness adapter
    "trial": 5,  # a trial's run over a backend
    "service": 6,  # the service: server, worker, executor, queue, factory, bench, conformance...
}
# stack: the composition (run, embedded, config, preflight...) at the bottom, the rooms on it,
# the CLI on top. The two re-exports keep the module names verl's configs already give.
STACK_FLOORS = {"composition": 0, "verl": 1, "bench": 1, "conformance": 1, "cli": 2}
STACK_REEXPORTS = {"stack.verl_agent_loop": "verl", "stack.verl_hooks": "verl"}


def modules(package: str) -> dict[str, Path]:
    base = ROOT / package.replace(".", "/")
    found = {}
    for path in base.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``name`` imports (absolute and relative, at any depth,
    TYPE_CHECKING blocks included: a type is an arrow too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def sandbox_room(name: str) -> str:
    rest = name.removeprefix("services.sandbox").lstrip(".").split(".")
    if rest[0] == "backends" and rest[1:2] == ["base"]:
        return "backends.base"
    return rest[0] if rest[0] in SANDBOX_FLOORS else "service"


def stack_room(name: str) -> str:
    if name in STACK_REEXPORTS:
        return STACK_REEXPORTS[name]
    rest = name.removeprefix("stack").lstrip(".").split(".")
    return rest[0] if rest[0] in STACK_FLOORS else "composition"


def arrows_up(package: str, room_of: Callable[[str], str], floors: dict[str, int]) -> list[str]:
    known = modules(package)
    bad = []
    for name, path in sorted(known.items()):
        mine = room_of(name)
        for target in sorted(imports(name, path, known)):
            theirs = room_of(target)
            if theirs != mine and floors[theirs] >= floors[mine]:
                bad.append(f"{name} ({mine}, floor {floors[mine]}) imports {target} ({theirs}, floor {floors[theirs]})")
    return bad


def circles_across_rooms(package: str, room_of: Callable[[str], str]) -> list[list[str]]:
    """Strongly connected components of the import graph that hold modules of two rooms."""
    known = modules(package)
    graph = {name: imports(name, path, known) for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len({room_of(m) for m in component}) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


@pytest.mark.parametrize(
    ("package", "room_of", "floors"),
    [("services.sandbox", sandbox_room, SANDBOX_FLOORS), ("stack", stack_room, STACK_FLOORS)],
    ids=["sandbox", "stack"],
)
def test_imports_point_down_and_no_circle_spans_two_rooms(
    package: str, room_of: Callable[[str], str], floors: dict[str, int]
) -> None:
    bad = arrows_up(package, room_of, floors)
    assert not bad, "imports that run up or sideways:\n" + "\n".join(bad)
    circles = circles_across_rooms(package, room_of)
    assert not circles, f"circles across rooms: {circles}"


def test_the_task_format_imports_no_backend_and_no_runner() -> None:
    known = modules("services.sandbox")
    bad = [
        f"{name} imports {target}"
        for name, path in known.items()
        if sandbox_room(name) == "task"
        for target in imports(name, path, known)
        if sandbox_room(target) not in ("task", "common")
    ]
    assert not bad, bad


def test_a_trial_runs_over_the_backend_interface_only() -> None:
    """The runner names no backend: ``factory.py`` (the service) chooses one."""
    known = modules("services.sandbox")
    bad = [
        f"{name} imports {target}"
        for name, path in known.items()
        if sandbox_room(name) == "trial"
        for target in imports(name, path, known)
        if sandbox_room(target) == "backends"
    ]
    assert not bad, bad


def test_every_room_says_what_it_is_for() -> None:
    """Every folder of the sandbox and of stack/, found on disk (a new room is held to it too)."""
    rooms = [p.parent for base in ("services/sandbox", "stack") for p in (ROOT / base).glob("*/__init__.py")]
    assert {"task", "trial", "defences", "backends", "verl", "bench", "conformance", "cli"} <= {p.name for p in rooms}
    for room in rooms:
        init = room / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init}: no docstring"


def test_the_checker_catches_an_arrow_up_and_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "pkg"
    for folder, source in {
        "common": "from pkg.task import model\n",  # ground floor importing the task format: up
        "task": "",
        "trial": "",
    }.items():
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
        (pkg / folder / "x.py").write_text(source)
    (pkg / "__init__.py").write_text("")
    (pkg / "task" / "model.py").write_text("from pkg.common import x\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)

    def room(name: str) -> str:
        part = name.split(".")[1] if "." in name else "service"
        return part if part in SANDBOX_FLOORS else "service"

    assert "pkg.common.x (common, floor 0) imports pkg.task.model (task, floor 1)" in arrows_up(
        "pkg", room, SANDBOX_FLOORS
    )
    assert circles_across_rooms("pkg", room) == [["pkg.common.x", "pkg.task.model"]]
