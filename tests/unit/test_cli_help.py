"""Every command's ``--help`` as a user reads it keeps its words: nothing in brackets
("[run]", "[sandbox]") is eaten as markup, no raw ``double backticks``, each
sub-command is listed with a line that says what it does, and the top-level help
says where to start."""

from __future__ import annotations

import re
from typing import Any

import pytest

from stack.cli.main import command, walk
from tests.cli_support import run_cli

BRACKETED = re.compile(r"\[[A-Za-z_][A-Za-z0-9_.]*\]")


def commands() -> list[tuple[list[str], Any]]:
    root = command()
    out: list[tuple[list[str], Any]] = []

    def visit(cmd: Any, path: list[str]) -> None:
        out.append((path, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():
            visit(sub, [*path, name])

    visit(root, [])
    return out


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("path", "cmd"), commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_help_keeps_every_bracketed_word(path: list[str], cmd: Any) -> None:
    out = run_cli(*path, "--help")
    assert out.returncode == 0, out.stderr
    shown = flat(out.stdout)
    sources = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
    words = {w for text in sources for w in BRACKETED.findall(text)}
    lost = sorted(w for w in words if w not in shown)
    assert not lost, f"harnessrl {' '.join(path)} --help lost {lost}"
    assert "``" not in out.stdout
    for name, sub in getattr(cmd, "commands", {}).items():
        line = sub.get_short_help_str()
        assert line and line != name and not line.endswith("..."), (name, line)
        assert flat(line) in shown


def test_the_config_option_names_its_section() -> None:
    assert "reads its own [section]" in flat(run_cli("proxy", "serve", "--help").stdout)
    assert "Run config (TOML: [run] plus one table per service)" in flat(run_cli("run", "--help").stdout)
    assert "(default [run] eval_k)" in flat(run_cli("eval", "--help").stdout)


def test_top_level_help_says_where_to_start_and_what_bench_is() -> None:
    shown = flat(run_cli("--help").stdout)
    assert "harnessrl trial run --task tasks/builtin/train/echo-00 --harness mini-swe-agent" in shown
    assert "harnessrl run examples/quickstart.toml" in shown and "harnessrl tasks list" in shown
    assert "bench Benchmarks of each part" in shown


def test_walk_reaches_every_sub_command() -> None:
    names = {" ".join(p) for p, _ in commands()}
    assert {"trial run", "tasks validate", "capture export-parquet", "bench vllm-path"} <= names
    assert len(list(walk(command()))) == len(names)


def test_trial_run_help_names_every_run_field_a_trial_honours() -> None:
    from stack.trialconfig import TRIAL_FIELDS

    shown = flat(run_cli("trial", "run", "--help").stdout)
    missing = [name for name in TRIAL_FIELDS if name not in shown]
    assert not missing, f"trial run --help does not name {missing}"
