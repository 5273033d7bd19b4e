"""Boundaries are checked, not hoped for. A service imports the common package
and the stubs, never another service or the composition root (``stack/``, which
holds the CLI). The common package (``harnessrl/``, stubs included) imports no
service and no ``stack/``: every arrow points from the composition root down."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "__init__.py").exists())


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def violations(service: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / "services" / service).rglob("*.py")):
        for line, module in imported_modules(path):
            parts = module.split(".")
            other_service = parts[0] == "services" and len(parts) > 1 and parts[1] != service
            if other_service or parts[0] == "stack":
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


def common_violations() -> list[str]:
    bad = []
    for path in sorted((ROOT / "harnessrl").rglob("*.py")):
        for line, module in imported_modules(path):
            if module.split(".")[0] in ("services", "stack"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


def test_every_service_is_checked() -> None:
    assert set(SERVICES) >= {"proxy", "gateway", "sandbox", "capture_store", "trainer", "dashboard"}


def test_services_import_only_common_package_and_stubs() -> None:
    bad = [v for service in SERVICES for v in violations(service)]
    assert not bad, "service boundary violations:\n" + "\n".join(bad)


def test_common_package_imports_no_service_and_no_composition_root() -> None:
    bad = common_violations()
    assert not bad, "the common package depends on what depends on it:\n" + "\n".join(bad)


def test_the_cli_lives_in_the_composition_root() -> None:
    assert not (ROOT / "harnessrl" / "cli").exists()
    assert not (ROOT / "harnessrl" / "__main__.py").exists()
    assert (ROOT / "stack" / "cli" / "main.py").exists()


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text(
        "from services.gateway.server import create_server\nimport stack.cli.main\nfrom stack import run\n"
    )
    modules = [m for _, m in imported_modules(source)]
    assert {"services.gateway.server", "stack.cli.main", "stack", "stack.run"} <= set(modules)
