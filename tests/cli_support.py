"""The ``harnessrl`` command in-process, for tests that only check arguments, config
errors or output: the same entry (``stack.cli.main.main``, which maps a HarnessError
to one line and exit 2) under click's CliRunner isolation, without the ~2 s of a new
interpreter importing the CLI and torch. Anything that starts a service, or whose
process environment matters (gRPC's poll settings, signals), still spawns
``python -m stack.cli``."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``harnessrl ARGS`` in this process; the result reads like a subprocess's."""
    from stack.cli.main import main

    runner = CliRunner()
    argv = sys.argv
    code: int = 0
    with runner.isolation(env=env) as (stdout, stderr, _):
        sys.argv = ["harnessrl", *args]
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                sys.stderr.write(e.code + "\n")
        finally:
            sys.argv = argv
            sys.stdout.flush()
            sys.stderr.flush()
        out, err = stdout.getvalue().decode(), stderr.getvalue().decode()
    return subprocess.CompletedProcess([*argv[:1], *args], code, out, err)
