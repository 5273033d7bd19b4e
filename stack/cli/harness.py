"""``harnessrl harness``: the harnesses this checkout knows (built in, or declared in TOML
files), installing them, and adding one from a file of your own."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harnessrl.errors import ConfigError

if TYPE_CHECKING:
    from services.sandbox.harnesses.declared import HarnessDeclaration

app = typer.Typer(
    help="Harnesses: list them, install them (setup installs only the default one), add one from a TOML file.",
    no_args_is_help=True,
)
SETUP_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup_harnesses.sh"
# Built-in harnesses setup_harnesses.sh installs (the others need nothing installed).
BUILTIN_INSTALLS = ("claude-code", "opencode", "codex", "mini-swe-agent", "openhands-sdk")
PYTHON_BUILTINS = ("mini-swe-agent", "openhands-sdk")


@app.command("list")
def list_harnesses() -> None:
    """Every harness by name: where it comes from, its package and pinned version, whether it is installed."""
    from services.sandbox.common.errors import EnvSetupError
    from services.sandbox.harnesses import BUILTIN, HARNESSES
    from services.sandbox.harnesses.declared import DeclaredHarness, installed_version

    rows = [["harness", "kind", "package", "pinned", "installed", "protocol"]]
    for name, cls in sorted(HARNESSES.items()):
        if issubclass(cls, DeclaredHarness):
            decl = cls.declaration
            have = installed_version(decl) or "no"
            pin = decl.install
            rows.append([name, "file", f"{pin.registry}:{pin.package}", pin.version, have, decl.harness.protocol])
            continue
        try:
            BUILTIN[name]().check_installed()
            have = "yes"
        except EnvSetupError:
            have = "no"
        rows.append([name, "built in", "-", "-", have if name in BUILTIN_INSTALLS else "-", "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


@app.command()
def install(
    names: Annotated[list[str], typer.Argument(help="Harness names, or 'all'.")],
    force: Annotated[bool, typer.Option("--force", help="Reinstall a declared harness already installed.")] = False,
) -> None:
    """Install harnesses at their pinned versions (a built-in one by scripts/setup_harnesses.sh)."""
    from services.sandbox.harnesses import HARNESSES
    from services.sandbox.harnesses.declared import DeclaredHarness

    wanted = list(HARNESSES) if names == ["all"] else names
    unknown = [n for n in wanted if n not in HARNESSES]
    if unknown:
        raise ConfigError(f"unknown harness(es) {unknown}; valid: {sorted(HARNESSES)} or 'all'")
    builtin = [n for n in wanted if n in BUILTIN_INSTALLS]
    declared = [cls.declaration for n in wanted if issubclass(cls := HARNESSES[n], DeclaredHarness)]
    _install_at_once(builtin, declared)


# Installs at once: each declared harness has a prefix of its own, the built-in script's npm
# harnesses one job (they share a prefix) and its Python ones a job each; an install waits on the
# registry and the disk more than on a core: all 12 from nothing took 340 s one after another
# and 148 s at once here.
INSTALL_JOBS = 6


def _install_at_once(builtin: list[str], declared: list[HarnessDeclaration]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from services.sandbox.common.errors import EnvSetupError
    from services.sandbox.harnesses.declared import runs_on_node
    from services.sandbox.harnesses.npm_harnesses import node_runtime

    with ThreadPoolExecutor(INSTALL_JOBS) as pool:
        # The script's npm harnesses share one prefix (one job); each Python one has a venv.
        npm = [n for n in builtin if n not in PYTHON_BUILTINS]
        parts = [*([npm] if npm else []), *([n] for n in builtin if n in PYTHON_BUILTINS)]
        scripts = {", ".join(part): pool.submit(_setup_script, part) for part in parts}
        jobs = {decl.harness.name: pool.submit(_install_declared, decl) for decl in declared}
    failed = [name for name, job in jobs.items() if job.exception() is not None]
    for name in failed:
        err = jobs[name].exception()
        typer.secho(f"{name}: {err}" if isinstance(err, EnvSetupError) else f"{name}: {err!r}", fg="red", err=True)
    failed += [names for names, job in scripts.items() if job.exception() is not None]
    # The node bundle a declared node harness runs on in a task's container, made once, after.
    bundled = [decl for decl in declared if runs_on_node(decl) and decl.install.node is None]
    if bundled and not (node_runtime() / "bin" / "node").exists() and not failed:
        _setup_script(["node-runtime"])
    if failed:
        typer.secho(f"harness install failed: {', '.join(failed)}", fg="red", err=True)
        raise typer.Exit(1)


def _setup_script(names: list[str]) -> None:
    typer.echo(f"installing {' '.join(names)} (scripts/setup_harnesses.sh)", err=True)
    if subprocess.run(["bash", str(SETUP_SCRIPT), *names], check=False).returncode != 0:
        raise typer.Exit(1)


def _install_declared(decl: HarnessDeclaration) -> None:
    from services.sandbox.harnesses.declared import install

    pin = f"{decl.install.package}@{decl.install.version}"
    typer.echo(f"{decl.harness.name}: {'installed ' + pin if install(decl) else pin + ' already installed'}", err=True)


@app.command()
def add(
    file: Annotated[Path, typer.Argument(help="The harness's TOML file (see services/sandbox/harnesses/declared/).")],
    run: Annotated[bool, typer.Option("--run/--no-run", help="Run its conformance cells on a real proxy.")] = True,
    replace: Annotated[bool, typer.Option("--replace", help="Replace a file you added under the same name.")] = False,
) -> None:
    """Check a harness file (a malformed one names the field, exit 2), install it, run it against a
    real proxy as the conformance matrix does, then register it ($HARNESSRL_HOME/harnesses/NAME.toml)."""
    from services.sandbox.harnesses import BUILTIN
    from services.sandbox.harnesses.declared import SHIPPED_DIR, declared_class, install, user_dir
    from services.sandbox.harnesses.declared_spec import load

    decl = load(file)
    name = decl.harness.name
    shipped = {load(p).harness.name for p in SHIPPED_DIR.glob("*.toml")}
    if name in BUILTIN or name in shipped:
        raise ConfigError(f"harness file {file}: harness.name {name!r} is taken by a harness this checkout ships")
    target = user_dir() / f"{name}.toml"
    if target.exists() and not replace and target.resolve() != file.resolve():
        raise ConfigError(f"harness file {file}: {target} already declares {name!r} (--replace replaces it)")
    cls = declared_class(decl)
    typer.echo(f"{name}: {'installed' if install(decl) else 'already installed'} {decl.install.package}", err=True)
    if run:
        _conformance(cls)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.resolve() != file.resolve():
        shutil.copyfile(file, target)
    typer.echo(f"{name}: registered ({target}); run a trial with --harness {name}")


def _conformance(cls: type) -> None:
    from stack.conformance.declared import DeclaredDriver
    from stack.conformance.matrix import COLUMNS, FAILED, run_cell

    driver = DeclaredDriver(cls())
    failed = False
    with tempfile.TemporaryDirectory(prefix=f"harness-add-{driver.name}-") as tmp:
        for column in COLUMNS:
            cell = run_cell(driver, column, Path(tmp) / column.replace(" ", "-"))
            detail = f": {cell.detail}" if cell.detail else ""
            typer.echo(f"{driver.name:16} {column:11} {cell.status:7} {cell.seconds:5.1f}s{detail}", err=True)
            failed = failed or cell.status == FAILED
    if failed:
        typer.echo(f"{driver.name}: a conformance cell failed; not registered", err=True)
        raise typer.Exit(1)
