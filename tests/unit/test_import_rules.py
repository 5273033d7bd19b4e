"""Service boundaries are checked, not hoped for: a service imports the common
package and the stubs, never another service, the CLI or the composition root
(``stack/``)."""

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
            composition = parts[0] == "stack" or module.startswith("harnessrl.cli")
            if other_service or composition:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


def test_every_service_is_checked() -> None:
    assert set(SERVICES) >= {"proxy", "gateway", "sandbox", "capture_store", "trainer", "dashboard"}


def test_services_import_only_common_package_and_stubs() -> None:
    bad = [v for service in SERVICES for v in violations(service)]
    assert not bad, "service boundary violations:\n" + "\n".join(bad)


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text("from services.gateway.server import create_server\nimport harnessrl.cli.main\nimport stack\n")
    modules = [m for _, m in imported_modules(source)]
    assert {"services.gateway.server", "harnessrl.cli.main", "stack"} <= set(modules)
