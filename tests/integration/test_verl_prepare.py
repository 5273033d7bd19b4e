"""``harnessrl verl prepare`` on the quickstart config: the files a verl run needs, and
``--dry-run`` composing verl's own Hydra config (the yaml inside the verl package)
with the overrides and checking verl's config schema, on CPU (no GPU, no Ray)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import hydra
import pytest
import yaml
from hydra.errors import InstantiationException
from omegaconf import OmegaConf

from harnessrl import paths
from harnessrl.errors import ConfigError
from stack.cli.main import main
from stack.verl import prepare as verl_prepare

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.toml"


def cli(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The installed entry point, in-process: (exit code, stdout + stderr)."""
    monkeypatch.setattr(sys, "argv", ["harnessrl", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    out = capsys.readouterr()
    return int(exit_.value.code or 0), out.out + out.err


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> verl_prepare.Prepared:
    return verl_prepare.prepare(QUICKSTART, tmp_path_factory.mktemp("verl"))


def test_dry_run_on_the_quickstart_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = cli(
        ["verl", "prepare", "--config", str(QUICKSTART), "--out", str(tmp_path), "--dry-run"], monkeypatch, capsys
    )
    assert code == 0, out
    assert "dry run ok" in out and "n=8" in out and "temperature=0.7" in out and "harnessrl_grpo" in out
    for name in ("tasks.parquet", "val_tasks.parquet", "agent_loops.yaml", "overrides.txt", "launch.sh"):
        assert (tmp_path / name).is_file(), name


def test_the_composed_config_carries_the_runs_settings(prepared: verl_prepare.Prepared) -> None:
    cfg = verl_prepare.dry_run(prepared)
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.n, rollout.temperature, rollout.agent.default_agent_loop) == (8, 0.7, "harnessrl_agent")
    assert Path(rollout.agent.agent_loop_config_path) == prepared.files["agent_loops"]
    assert cfg.data.train_files == str(prepared.files["tasks"]) and cfg.algorithm.adv_estimator == "harnessrl_grpo"
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == "stack.verl.hooks"
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "gspo", "stack/verl's fully_async.yaml is applied"
    assert prepared.files["overrides"].read_text().splitlines() == prepared.overrides
    launch = prepared.files["launch"].read_text()
    assert verl_prepare.ENTRY in launch and "VERL_USE_EXTERNAL_MODULES=stack.verl.hooks" in launch
    assert all(o in launch for o in prepared.overrides)
    # verl's file logger writes the step metrics (harnessrl/* counts) where the dashboard reads them
    assert list(cfg.trainer.logger) == ["console", "file"]
    exported = subprocess.run(
        [
            "bash",
            "-c",
            "".join(line + "\n" for line in launch.splitlines() if "VERL_FILE_LOGGER_PATH" in line)
            + 'echo "$VERL_FILE_LOGGER_PATH"',
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    ).stdout.strip()
    assert exported.endswith("/metrics.jsonl") and Path(exported).parent.name == cfg.trainer.experiment_name, exported


@pytest.mark.skipif(not (paths.default_model_dir() / "tokenizer.json").exists(), reason="default model not prepared")
def test_verls_dataset_reads_the_tasks_parquet_and_its_worker_builds_the_loop(
    prepared: verl_prepare.Prepared, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from stack.verl.agent_loop import HarnessAgentLoop

    tokenizer = AutoTokenizer.from_pretrained(paths.default_model_dir())
    data = OmegaConf.create({"max_prompt_length": 512, "filter_overlong_prompts": True, "return_raw_chat": True})
    dataset = RLHFDataset(str(prepared.files["tasks"]), tokenizer, data)
    assert len(dataset) == prepared.tasks > 0
    row = dataset[0]
    assert row["agent_name"] == "harnessrl_agent" and Path(row["task_path"], "task.toml").is_file()
    assert row["task_id"] == Path(row["task_path"]).name and row["raw_prompt"][0]["role"] == "user"
    (entry,) = OmegaConf.load(prepared.files["agent_loops"])
    monkeypatch.setenv("HARNESSRL_SANDBOX_TARGET", "127.0.0.1:1")
    monkeypatch.setenv("HARNESSRL_CAPTURE_TARGET", "127.0.0.1:2")
    cfg = verl_prepare.dry_run(prepared)

    def build(config: Any) -> Any:
        return hydra.utils.instantiate(
            config=entry,
            trainer_config=DictConfigWrap(config=config),
            server_manager=None,
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(OmegaConf.create({})),
            tools=ToolListWrap([]),
        )

    loop = build(cfg)
    assert isinstance(loop, HarnessAgentLoop) and loop.harness == "mini-swe-agent" and loop.segments == "last"
    assert loop.harness_options == {"config": "compact"} and loop.sandbox_target == "127.0.0.1:1"
    cfg.actor_rollout_ref.rollout.temperature = 1.0  # verl's setting changed after prepare
    with pytest.raises(InstantiationException, match=r"differs from the run.s temperature=0\.7"):
        build(cfg)


def test_a_bad_config_path_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.toml"
    code, out = cli(["verl", "prepare", "--config", str(missing), "--out", str(tmp_path / "o")], monkeypatch, capsys)
    assert code == 2 and "nope.toml" in out
    broken = tmp_path / "broken.toml"
    broken.write_text("[run]\nsteps = 'three'\n")
    code, out = cli(["verl", "prepare", "--config", str(broken), "--out", str(tmp_path / "o")], monkeypatch, capsys)
    assert code == 2 and "steps" in out


def test_honoured_sampling_is_refused_for_verl(tmp_path: Path) -> None:
    honour = tmp_path / "honour.toml"
    honour.write_text(QUICKSTART.read_text().replace("[proxy]\n", '[proxy]\nsampling = "honour"\n', 1))
    with pytest.raises(ConfigError, match="sampling = 'pin' with verl"):
        verl_prepare.prepare(honour, tmp_path / "o")
    assert not (tmp_path / "o").exists()  # nothing written


def test_a_bad_override_is_refused_naming_it(
    prepared: verl_prepare.Prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["verl", "prepare", "--config", str(QUICKSTART), "--out", str(tmp_path), "--dry-run"]
    code, out = cli([*args, "--override", "actor_rollout_ref.rollout.no_such_setting=1"], monkeypatch, capsys)
    assert code == 2 and "verl rejects" in out and "no_such_setting" in out
    code, out = cli([*args, "--override", "not-an-override"], monkeypatch, capsys)
    assert code == 2 and "KEY=VALUE" in out
    for bad, named in (
        ("actor_rollout_ref.rollout.n=many", "many"),  # a type error
        ("algorithm.adv_estimator=nonsense", "nonsense"),  # not in verl's registry
        ("actor_rollout_ref.rollout.calculate_log_probs=false", "calculate_log_probs"),
        ("actor_rollout_ref.rollout.temperature=1.0", "differs from the run's temperature=0.7"),
    ):
        with pytest.raises(ConfigError, match=r"verl rejects|differs") as e:
            verl_prepare.dry_run(dataclasses.replace(prepared, overrides=[*prepared.overrides, bad]))
        assert named in str(e.value), (bad, str(e.value))


def test_a_written_agent_loop_file_never_holds_the_service_token(prepared: verl_prepare.Prepared) -> None:
    (entry,) = yaml.safe_load(prepared.files["agent_loops"].read_text())
    assert entry["service_token"] == "${oc.env:HARNESSRL_SERVICE_TOKEN,null}"
    assert entry["temperature"] == 0.7 and entry["run_id"]
