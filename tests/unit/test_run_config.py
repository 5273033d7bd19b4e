"""``harnessrl run`` configs: every malformed one is a clear error naming the file
and the field, exit 2 from the CLI, and nothing is started or created."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from harnessrl.errors import ConfigError
from stack import pool, runconfig
from tests.cli_support import run_cli
from tests.sandbox_support import make_task


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    root = tmp_path / "pool"
    make_task(root, "alpha")
    make_task(root, "beta")
    return root


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def minimal(tasks: Path, extra: str = "", run: str = "") -> str:
    return f'[run]\ntrain_tasks = ["{tasks}"]\nruns_dir = "runs"\n{run}\n{extra}'


def test_minimal_config_fills_every_service(tmp_path: Path, tasks: Path) -> None:
    cfg = runconfig.load(write(tmp_path, minimal(tasks, run='run_id = "r1"\ngroups_per_step = 3')))
    assert cfg.run_id == "r1" and cfg.run_dir == tmp_path / "runs" / "r1"  # relative to the config file
    assert cfg.trainer.run_id == "r1" and cfg.trainer.rollout.groups_per_step == 3
    assert cfg.trainer.output_dir == cfg.run_dir / "trainer"
    assert cfg.capture_store is not None and cfg.capture_store.store_dir == cfg.run_dir / "capture"
    assert cfg.gateway is not None and cfg.gateway.engine == "local" and cfg.gateway.port == 0
    assert cfg.proxy is not None and cfg.sandbox.artifacts_dir == cfg.run_dir / "artifacts"
    assert not cfg.distributed


def test_one_temperature_for_sampling_and_training(tmp_path: Path, tasks: Path) -> None:
    """The proxy samples at [run] temperature and the trainer divides its logits by it."""
    cfg = runconfig.load(write(tmp_path, minimal(tasks, run="temperature = 0.7")))
    assert cfg.proxy is not None and cfg.proxy.temperature == 0.7
    assert cfg.trainer.rollout.temperature == 0.7


def test_run_id_is_generated_and_resume_wins(tmp_path: Path, tasks: Path) -> None:
    path = write(tmp_path, minimal(tasks))
    assert runconfig.load(path).run_id.startswith("run-")
    assert runconfig.load(path, run_id="older").run_id == "older"


def test_resolved_toml_reads_back_and_masks_secrets(tmp_path: Path, tasks: Path) -> None:
    text = minimal(tasks, '[proxy]\nadmin_token = "sekret"\n[trainer.algo]\nloss_mode = "vanilla"\n')
    cfg = runconfig.load(write(tmp_path, text))
    resolved = cfg.resolved_toml()
    assert "sekret" not in resolved
    data = tomllib.loads(resolved)
    assert data["trainer"]["algo"]["loss_mode"] == "vanilla"
    assert data["run"]["run_id"] == cfg.run_id and set(data) >= {"run", "gateway", "proxy", "sandbox", "trainer"}


def test_distributed_addresses_connect_instead_of_starting(tmp_path: Path, tasks: Path) -> None:
    run = 'capture_target = "10.0.0.5:50052"\ngateway_target = "gw:50051"\nsandbox_target = "sb:50053"'
    cfg = runconfig.load(write(tmp_path, minimal(tasks, run=run)))
    assert cfg.distributed
    assert cfg.capture_store is None and cfg.gateway is None and cfg.proxy is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[gateway]\nport = 1\n", "[run] is missing"),
        ("[run]\nsteps = 3\n", "[run]: train_tasks: Field required"),
        ('[run]\ntrain_tasks = ["x"]\ngroup_sise = 4\n', "unknown setting 'group_sise'"),
        ('[run]\ntrain_tasks = ["x"]\ngroup_size = 0\n', "group_size: Input should be greater than or equal to 1"),
        ('[run]\ntrain_tasks = ["x"]\nsteps = "many"\n', "[run]: steps:"),
        ('[run]\ntrain_tasks = ["x"]\nharness = "clod"\n', "unknown harness 'clod'"),
        ('[run]\ntrain_tasks = ["x"]\nrun_id = "a/b"\n', "run_id: String should match pattern"),
        ('[run]\ntrain_tasks = ["x"]\ngateway_target = "nohost"\n', "gateway_target: String should match"),
        ('[run]\ntrain_tasks = ["x"]\nengine = "gpt:"\n', "[gateway]: engine: Value error, unknown engine"),
        ('[run]\ntrain_tasks = ["x"]\n[gateway]\nreplicaz = 2\n', "[gateway]: unknown setting 'replicaz'"),
        ('[run]\ntrain_tasks = ["x"]\n[proxy]\ntop_p = 2\n', "[proxy]: top_p:"),
        ('[run]\ntrain_tasks = ["x"]\n[proxy]\nmax_tokens_cap = 0\n', "[proxy]: max_tokens_cap: Input should"),
        ('[run]\ntrain_tasks = ["x"]\ntemperature = 0\n', "[run]: temperature: Input should be greater than 0"),
        ('[run]\ntrain_tasks = ["x"]\nmalloc_mmap_threshold_mib = -1\n', "[run]: malloc_mmap_threshold_mib: Input"),
        ('[run]\ntrain_tasks = ["x"]\n[proxy]\ntemperature = 0.5\n', "temperature = 0.5 conflicts with the run's 1.0"),
        ('[run]\ntrain_tasks = ["x"]\n[trainer.rollout]\ntemperature = 2\n', "conflicts with the run's 1.0"),
        ('[run]\ntrain_tasks = ["x"]\n[sandbox]\nconcurrency = 0\n', "[sandbox]: concurrency:"),
        ('[run]\ntrain_tasks = ["x"]\n[capture_store]\nbackend = "cloud"\n', "[capture_store]: backend:"),
        ('[run]\ntrain_tasks = ["x"]\n[dashboard]\nport = -3\n', "[dashboard]: port:"),
        ('[run]\ntrain_tasks = ["x"]\n[trainer.algo]\nloss_mode = "magic"\n', "[trainer]: algo.loss_mode:"),
        (
            '[run]\ntrain_tasks = ["x"]\n[trainer.algo]\ndrop_zero_variance_groups = "sometimes"\n',
            "[trainer]: algo.drop_zero_variance_groups:",
        ),
        ('[run]\ntrain_tasks = ["x"]\n[trainer.rollout]\ngroups_per_step = 5\n', "conflicts with the run's 2"),
        ('[run]\ntrain_tasks = ["x"]\n[trainer.rollout]\nmax_steps = 5\n', "max_steps is decided by [run] steps"),
        ('[run]\ntrain_tasks = ["x"]\n[trainer]\nrun_id = "other"\n', "run_id = 'other' conflicts"),
        ('[run]\ntrain_tasks = ["x"]\n[gateway]\nengine = "vllm"\n', "'vllm' conflicts with the run's 'local'"),
        ('[run]\ntrain_tasks = ["x"]\ncapture_target = "h:1"\n[capture_store]\nfsync = false\n', "connects to a"),
        ('[run]\ntrain_tasks = ["x"]\n[eval]\nk = 3\n', "[eval] is not read"),
        ('[run]\ntrain_tasks = ["x"]\nevaluate_only = true\neval_every = 5\n', "evaluate_only needs eval_tasks"),
        ("[rnu]\n", "unknown section(s) ['rnu']"),
        ("[run\n", "not valid TOML"),
        ("run = 3\n", "[run] must be a table"),
    ],
)
def test_malformed_config_names_file_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        runconfig.load(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_pool_expand_tasks_pools_and_families(tmp_path: Path, tasks: Path) -> None:
    (tasks / "alpha" / "task.toml").write_text(
        (tasks / "alpha" / "task.toml").read_text() + '\n[metadata]\ncategory = "files"\n'
    )
    assert [p.name for p in pool.expand([tasks])] == ["alpha", "beta"]
    assert [p.name for p in pool.expand([tasks / "beta", tasks])] == ["beta", "alpha"]
    assert [p.name for p in pool.expand([tasks], ["files"])] == ["alpha"]
    with pytest.raises(ConfigError, match="no task of families"):
        pool.expand([tasks], ["web"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="neither a task"):
        pool.expand([tmp_path / "empty"])
    with pytest.raises(ConfigError, match="does not exist"):
        pool.expand([tmp_path / "nowhere"])
    (tasks / "beta" / "task.toml").write_text("[metadata\n")
    with pytest.raises(ConfigError, match="unreadable task config"):
        pool.expand([tasks], ["files"])


@pytest.mark.parametrize("command", ["run", "preflight", "eval"])
def test_cli_bad_config_exits_2_and_starts_nothing(tmp_path: Path, tasks: Path, command: str) -> None:
    path = write(tmp_path, minimal(tasks, run="group_size = -1"))
    proc = run_cli(command, str(path))
    assert proc.returncode == 2, proc.stderr
    assert "group_size" in proc.stderr and str(path) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--seed", "-1"], "--seed"),
        (["--run-id", "a/b"], "run_id: String should match pattern"),
        (["--run-id", "fresh", "--resume", "old"], "--run-id names a fresh run"),
    ],
)
def test_cli_bad_run_flags_exit_2_and_start_nothing(
    tmp_path: Path, tasks: Path, flags: list[str], expected: str
) -> None:
    path = write(tmp_path, minimal(tasks))
    proc = run_cli("run", str(path), *flags)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_cli_missing_pool_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, '[run]\ntrain_tasks = ["no-such-pool"]\nruns_dir = "runs"\n')
    proc = run_cli("run", str(path))
    assert proc.returncode == 2 and "no-such-pool does not exist" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "name",
    ["quickstart.toml", "distributed.toml", "heldout_curve.toml", "tools_curve.toml", "tools_curve_control.toml"],
)
def test_example_configs_validate(name: str) -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / name
    cfg = runconfig.load(path)
    assert cfg.run.harness == "mini-swe-agent" and cfg.run.steps >= 3 and cfg.run.families == ["echo"]
    assert cfg.distributed == (name == "distributed.toml")
    if name != "distributed.toml":
        assert cfg.run.train_tasks == [path.parents[1] / "tasks" / "builtin" / "train"]
        assert cfg.gateway is not None and cfg.gateway.engine == "local" and cfg.capture_store is not None
    if name.startswith("tools_curve"):
        assert cfg.run.harness_options == {"config": "tools"} and cfg.proxy is not None
        assert (cfg.proxy.chat_template, cfg.proxy.tool_parser) == ("fenced-chatml", "fenced")
        assert cfg.trainer.optim.lr == (0.0 if "control" in name else 1e-5)


@pytest.mark.parametrize("name", ["cline", "gemini-cli", "qwen-code", "copilot-cli", "openclaw", "long-prompt"])
def test_the_runs_through_each_declared_harness_validate(name: str) -> None:
    """examples/through: one run per declared harness, every step's samples from the weights it
    trains (a Pearson per step); the long-prompt capture check widens the engine's and trainer's
    window for the harnesses whose first prompt is past 8,192 tokens (Qwen Code's ~18.4k)."""
    path = Path(__file__).resolve().parents[2] / "examples" / "through" / f"{name}.toml"
    cfg = runconfig.load(path)
    wide = name == "long-prompt"
    assert cfg.run.harness == ("gemini-cli" if wide else name) and cfg.run.families == ["echo"]
    assert cfg.run.train_tasks == [path.parents[2] / "tasks" / "builtin" / "train"]
    assert cfg.trainer.rollout.max_staleness == 0 and cfg.gateway is not None and cfg.gateway.engine == "local"
    assert cfg.gateway.context_window == (24576 if wide else None)
    assert cfg.trainer.optim.max_seq_len == (24576 if wide else 8192)
    assert (cfg.run.steps, cfg.run.group_size) == ((1, 1) if wide else (3, 2))


def test_run_harness_override_picks_the_harness_and_refuses_an_unknown_one() -> None:
    """``harnessrl run --harness NAME`` overrides [run] harness; an unknown name is the config
    error a file naming it gets (exit 2), before anything starts."""
    path = Path(__file__).resolve().parents[2] / "examples" / "through" / "long-prompt.toml"
    assert runconfig.load(path, overrides={"harness": "copilot-cli"}).run.harness == "copilot-cli"
    with pytest.raises(ConfigError, match="unknown harness 'clod'"):
        runconfig.load(path, overrides={"harness": "clod"})


def test_overlapping_train_and_eval_tasks_are_refused_unless_allowed(tmp_path: Path, tasks: Path) -> None:
    from stack.run import check_overlap, resolve_tasks

    heldout = tmp_path / "heldout"
    make_task(heldout, "alpha-copy")  # same instruction and tests as pool/alpha: an instance overlap
    make_task(heldout, "fresh", instruction="Something else entirely.")
    path = write(tmp_path, minimal(tasks, run=f'eval_tasks = ["{heldout}"]'))
    proc = run_cli("run", str(path))
    assert proc.returncode == 2 and "train and eval tasks overlap: instance" in proc.stderr
    assert "allow_overlap = true / --allow-overlap" in proc.stderr and not (tmp_path / "runs").exists()
    cfg = runconfig.load(path, overrides={"allow_overlap": True})
    train, evaluation = resolve_tasks(cfg)
    assert [p.name for p in evaluation] == ["alpha-copy", "fresh"]
    found = check_overlap(cfg, train, evaluation)  # allowed: reported, not refused
    assert len(found) >= 1 and all("alpha-copy" in line for line in found)


def test_proxy_gets_the_service_token_for_remote_services() -> None:
    from services.proxy.settings import Settings as ProxySettings
    from stack.embedded import _with_tokens

    settings = _with_tokens(ProxySettings.model_validate({"capture_token": "own"}), "shared")
    assert settings.gateway_token.get_secret_value() == "shared"
    assert settings.capture_token.get_secret_value() == "own"  # a configured token wins
    assert _with_tokens(ProxySettings.model_validate({}), None).gateway_token is None
