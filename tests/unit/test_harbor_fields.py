"""Every Harbor task field is supported, mapped or refused by name (invariant 9): the
table in services/sandbox/task/harbor_fields.py covers the schema the loader reads, a refused
field fails loading naming the file, the field and why, unknown keys are ignored (as
Harbor ignores them) with a warning naming them, and docs/harbor.md is the table."""

from __future__ import annotations

import logging
import typing
from pathlib import Path

import pytest

from services.sandbox.backends.docker_images import ImageStore
from services.sandbox.common.errors import TaskError
from services.sandbox.task import harbor_fields
from services.sandbox.task.harbor_fields import FIELDS, Status
from services.sandbox.task.model import NetworkMode, TaskConfig, load_task
from tests.sandbox_support import make_task

DOC = Path(__file__).resolve().parents[2] / "docs" / "harbor.md"


def _schema_paths() -> set[str]:
    """Every key the loader's models read, dotted, plus Harbor's legacy spellings."""
    paths = {"version", "environment.memory", "environment.storage"}
    for name, info in TaskConfig.model_fields.items():
        if name in harbor_fields.SECTIONS:
            (model,) = [t for t in typing.get_args(info.annotation) or [info.annotation] if t is not type(None)]
            paths |= {f"{name}.{sub}" for sub in model.model_fields}
        else:
            paths.add(name)
    return paths


def test_the_table_covers_exactly_the_schema() -> None:
    assert set(FIELDS) == _schema_paths()
    for path, rule in FIELDS.items():
        assert rule.note, path
        assert not (rule.status == Status.REFUSED and rule.refuse is not None), path


def test_the_doc_is_the_table() -> None:
    assert DOC.read_text() == harbor_fields.render(), (
        "python -m services.sandbox.task.harbor_fields --write docs/harbor.md"
    )
    assert harbor_fields.main(["--check", str(DOC)]) == 0


def test_a_stale_doc_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "harbor.md"
    stale.write_text("old\n")
    assert harbor_fields.main(["--check", str(stale)]) == 1
    assert str(stale) in capsys.readouterr().err
    assert harbor_fields.main(["--bogus"]) == 2


# One value per refused field, as a task would set it.
REFUSED_TOML = {
    "verifier.environment": "[verifier.environment]\ncpus = 1\n",
    "verifier.collect": "[[verifier.collect]]\ncommand = 'true'\n",
    "agent.user": "[agent]\nuser = 1001\n",
    "environment.gpu_types": "[environment]\ngpu_types = ['H100']\n",
    "environment.tpu": "[environment.tpu]\ntype = 'v6e'\ntopology = '2x4'\n",
}


def test_every_refused_field_has_a_case() -> None:
    assert set(REFUSED_TOML) == {p for p, r in FIELDS.items() if r.status == Status.REFUSED}


def _refused(task: Path, *fragments: str) -> str:
    with pytest.raises(TaskError) as info:
        load_task(task)
    message = str(info.value)
    for fragment in (str(task), *fragments):
        assert fragment in message, message
    return message


@pytest.mark.parametrize("path", sorted(REFUSED_TOML))
def test_a_refused_field_is_named_with_why(tmp_path: Path, path: str) -> None:
    _refused(make_task(tmp_path, toml=REFUSED_TOML[path]), f"task.toml: {path}: ", FIELDS[path].note)


@pytest.mark.parametrize(
    ("toml_text", "fragments"),
    [
        ("[environment]\ngpus = 2\n", ["environment.gpus", "GPU", "got 2"]),
        ("[environment]\nos = 'Windows'\n", ["environment.os", "linux", "'Windows'"]),
        ("[verifier]\nenvironment_mode = 'separate'\n", ["verifier.environment_mode", "shared"]),
        ("[environment.env]\nKEY = '${{KEY}}'\nOK = 'x'\n", ["environment.env", "KEY:", "${VAR}"]),
        ("[verifier.env]\nURL = '${{URL:-http://x}}'\n", ["verifier.env", "URL"]),
        ("[solution.env]\nT = '${{T}}'\n", ["solution.env", "T:"]),
    ],
)
def test_a_refused_value_is_named_with_why(tmp_path: Path, toml_text: str, fragments: list[str]) -> None:
    # make_task formats the text: {{ }} are literal braces.
    _refused(make_task(tmp_path, toml=toml_text), *fragments)


def test_the_same_fields_with_values_that_run(tmp_path: Path) -> None:
    toml = (
        "multi_step_reward_strategy = 'final'\n[environment]\ngpus = 0\nos = 'LINUX'\nskills_dir = ''\n"
        "mcp_servers = []\n[environment.env]\nA = 'literal $HOME ${{not-whole}}x'\n"
        "[verifier]\nenvironment_mode = 'shared'\n"
    )
    task = load_task(make_task(tmp_path, toml=toml))
    assert task.config.environment.os == "linux" and task.config.environment.env["A"].startswith("literal")


def test_all_refusals_are_named_at_once(tmp_path: Path) -> None:
    toml = "[environment]\ngpu_types = ['H100']\n[[steps]]\nname = 'a'\n[steps.agent]\nuser = 'root'\n"
    _refused(make_task(tmp_path, toml=toml), "steps: steps[0].agent.user: every agent", "environment.gpu_types: GPU")


def test_a_compose_file_runs_and_what_it_cannot_do_is_refused_naming_it(tmp_path: Path) -> None:
    task = load_task(
        make_task(tmp_path / "ok", context={"docker-compose.yaml": "services:\n  db:\n    image: redis\n"})
    )
    assert task.compose is not None and [s.name for s in task.compose.services] == ["db"]
    ports = "services:\n  db:\n    image: redis\n    ports: ['6379:6379']\n"
    _refused(make_task(tmp_path / "ports", context={"docker-compose.yaml": ports}), "services.db.ports: not supported")


def test_unknown_keys_are_ignored_with_a_warning_naming_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    toml = "flavour = 'x'\n[agent]\ntimeout_sec = 7\ntimout_sec = 5\n[extra]\na = 1\n"
    with caplog.at_level(logging.WARNING, logger="services.sandbox.task.model"):
        task = load_task(make_task(tmp_path, toml=toml))
    assert task.config.agent.timeout_sec == 7
    (warning,) = task.warnings
    for key in ("flavour", "agent.timout_sec", "extra"):
        assert key in warning and key in caplog.text
    assert "Harbor" in warning


def test_legacy_sizes_become_megabytes(tmp_path: Path) -> None:
    env = load_task(make_task(tmp_path / "a", toml="[environment]\nmemory = '2G'\nstorage = '512M'\n")).config
    assert (env.environment.memory_mb, env.environment.storage_mb) == (2048, 512)
    _refused(make_task(tmp_path / "b", toml="[environment]\nmemory = 'lots'\n"), "environment", "'2G'", "'lots'")
    _refused(make_task(tmp_path / "c", toml="[environment]\nmemory = '1G'\nmemory_mb = 5\n"), "conflicts")


def test_a_bad_reward_strategy_is_named(tmp_path: Path) -> None:
    _refused(make_task(tmp_path, toml="multi_step_reward_strategy = 'max'\n"), "multi_step_reward_strategy")


def test_allow_internet_is_the_phases_policy_and_never_the_builds(tmp_path: Path) -> None:
    """Harbor applies allow_internet / network_mode to the running phases (an egress policy on
    the started environment), never to ``docker compose build``: the build keeps its network."""
    task = load_task(make_task(tmp_path, toml="[environment]\nallow_internet = false\n"))
    assert task.config.environment.network_mode == NetworkMode.NO_NETWORK
    store = ImageStore(None, build_network="host", pull=False, cache_dir=tmp_path / "cache", engine="test")
    assert store.build_kwargs(task, "tag")["network_mode"] == "host"
