"""``harnessrl verl prepare``: everything a verl run needs, from a harnessrl run config.

Writes into ``--out``:

- ``tasks.parquet`` (and ``val_tasks.parquet`` when the config has eval tasks): one
  row per task, the columns verl's ``RLHFDataset`` and ``HarnessAgentLoop`` read
  (``prompt`` a one-message placeholder chat, the harness writes the real prompt;
  ``data_source``, ``agent_name``, ``task_path``, ``task_id``, ``extra_info.index``);
- ``agent_loops.yaml``: verl's ``agent_loop_config_path`` file, the
  ``harnessrl_agent`` entry with the run's harness, options, targets and temperature
  (targets the config does not name, and the service token always, are read from
  the environment of verl's workers: ``HARNESSRL_SANDBOX_TARGET``, ...);
- ``overrides.txt``: the Hydra overrides, one a line, on top of verl's
  ``fully_async_ppo_trainer`` config and ``stack/verl/harnessrl/fully_async.yaml``;
- ``launch.sh``: the launch command.

``dry_run`` composes verl's own Hydra config (the yaml files inside the verl
package) with those overrides through Hydra's compose API and checks the result
against verl's config dataclasses (``omega_conf_to_dataclass``: ActorConfig,
RolloutConfig, AlgoConfig) and verl's own startup check (``validate_config``:
sizes, exclusive options), the advantage estimator against verl's registry and
the agent-loop file as verl's worker loads it. CPU only: no GPU, no Ray.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harnessrl.errors import ConfigError
from stack import pool, runconfig

STACK_VERL = Path(__file__).resolve().parent  # this room: the YAML verl reads lies beside the code
VERL_CONFIG = "fully_async_ppo_trainer"
HOOKS_MODULE = "stack.verl.hooks"
ENTRY = "verl.experimental.fully_async_policy.fully_async_main"
# ``segments`` -> (verl's config, its entry point, the overlay in stack/verl/harnessrl/). One row
# per trial: verl's fully-async trainer (its classic worker takes one output per sample); every
# trainable segment a row: verl's v1 trainer (``main_ppo``, ppo_trainer's trainer.use_v1=true),
# whose AgentLoopWorkerTQ takes a list of outputs per session.
TRAINERS = {
    "last": (VERL_CONFIG, ENTRY, "fully_async"),
    "all": ("ppo_trainer", "verl.trainer.main_ppo", "v1"),
}


@dataclass
class Prepared:
    """What ``prepare`` wrote, and the overrides and command it stands for."""

    out: Path
    tasks: int
    temperature: float
    files: dict[str, Path] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    segments: str = "last"


def task_rows(tasks: list[Path]) -> list[dict[str, Any]]:
    from stack.verl.agent_loop import AGENT_NAME

    return [
        {
            "data_source": "harnessrl",
            "agent_name": AGENT_NAME,
            # verl's dataset needs a chat; the harness writes the trial's real prompt.
            "prompt": [{"role": "user", "content": f"harnessrl task {task.name}"}],
            "task_path": str(task),
            "task_id": task.name,
            "extra_info": {"index": i},
        }
        for i, task in enumerate(tasks)
    ]


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def agent_loop_entry(cfg: runconfig.RunConfig, gateway_bind: str = "127.0.0.1") -> dict[str, Any]:
    """``gateway_bind``: the bind the workers use where HARNESSRL_VERL_GATEWAY_BIND is unset."""
    r = cfg.run

    def env(name: str, value: str | None) -> str:
        return value if value else f"${{oc.env:{name}}}"

    return {
        "name": "harnessrl_agent",
        "_target_": "stack.verl.agent_loop.HarnessAgentLoop",
        "sandbox_target": env("HARNESSRL_SANDBOX_TARGET", r.sandbox_target),
        "capture_target": env("HARNESSRL_CAPTURE_TARGET", r.capture_target),
        "run_id": cfg.run_id,
        "harness": r.harness,
        "harness_options": dict(r.harness_options),
        # Never written to disk: read from the worker's environment.
        "service_token": "${oc.env:HARNESSRL_SERVICE_TOKEN,null}",
        "poll_s": 1.0,
        "segments": "last",
        "temperature": r.temperature,
        "gateway_bind": f"${{oc.env:HARNESSRL_VERL_GATEWAY_BIND,{gateway_bind}}}",
        "gateway_address": '${oc.env:HARNESSRL_VERL_GATEWAY_ADDRESS,""}',
    }


def gateway_bind_for(cfg: runconfig.RunConfig, extra: list[str], env: Mapping[str, str]) -> str:
    """The workers' default gateway bind for this cluster's shape (0.0.0.0 when the proxy may
    be on another node: ``--override trainer.nnodes=N``/``rollout.nnodes=N``, or a sandbox on
    another host), after checking the gateway variables set here against that shape
    (``stack/verl/address.py``): a ConfigError for a loopback bind or address across nodes."""
    from stack.verl import address as verl_address

    nnodes: dict[str, object] = {}
    for override in extra:
        key, _, value = override.partition("=")
        if key.lstrip("+") in verl_address.NNODES:
            nnodes[key.lstrip("+")] = value
    remote = verl_address.cluster_reason(nnodes, cfg.run.sandbox_target or env.get("HARNESSRL_SANDBOX_TARGET"))
    default = "0.0.0.0" if remote else "127.0.0.1"
    bind = env.get("HARNESSRL_VERL_GATEWAY_BIND") or default
    verl_address.check_settings(bind, env.get("HARNESSRL_VERL_GATEWAY_ADDRESS", ""), remote)
    return default


def overrides_for(cfg: runconfig.RunConfig, files: dict[str, Path], segments: str = "last") -> list[str]:
    r = cfg.run
    val = files.get("val_tasks", files["tasks"])
    if segments == "last":  # the fully-async trainer counts rollouts, in its own section
        steps = [f"rollout.n={r.group_size}", f"rollout.total_rollout_steps={r.steps * r.groups_per_step}"]
    else:
        steps = [f"trainer.total_training_steps={r.steps}"]
    return [
        f"+harnessrl@_global_={TRAINERS[segments][2]}",
        f"actor_rollout_ref.model.path={cfg.model_dir}",
        # verl's replicas: vLLM (the engine the gateway and compose use too).
        "actor_rollout_ref.rollout.name=vllm",
        f"data.train_files={files['tasks']}",
        f"data.val_files={val}",
        f"data.train_batch_size={r.groups_per_step}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={r.groups_per_step}",
        f"actor_rollout_ref.rollout.n={r.group_size}",
        *steps,
        f"actor_rollout_ref.rollout.temperature={r.temperature}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={files['agent_loops']}",
        "algorithm.adv_estimator=harnessrl_grpo",
        "trainer.project_name=harnessrl",
        # verl's file logger writes {step, data} lines the harnessrl dashboard reads
        # (VERL_FILE_LOGGER_PATH, set in launch.sh, puts them in the run's directory).
        "trainer.logger=[console,file]",
        f"trainer.experiment_name={cfg.run_id}",
        # verl imports these modules in every process on `import verl`: the estimator and metrics.
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES={HOOKS_MODULE}",
    ]


def prepare(config: Path, out: Path, extra: list[str] | None = None, segments: str = "last") -> Prepared:
    """Writes the files (see the module docstring); ``extra`` overrides go last (they win).
    ``segments``: ``last`` (verl's fully-async trainer, one row per trial) or ``all``
    (verl's v1 trainer, every trainable segment a row); see ``TRAINERS``."""
    if segments not in TRAINERS:
        raise ConfigError(f"segments must be one of {sorted(TRAINERS)}, got {segments!r}")
    cfg = runconfig.load(Path(config))
    if cfg.proxy is not None and cfg.proxy.sampling != "pin":
        # verl's actor divides every row's logits by its one rollout temperature: a harness's
        # own per segment (harnessrl's CPU trainer follows them) would train on another distribution.
        raise ConfigError(
            f"{config}: [proxy] sampling = {cfg.proxy.sampling!r} lets each harness call pick its temperature, "
            "but verl trains every row at its one rollout temperature; use sampling = 'pin' with verl"
        )
    bad = [o for o in extra or [] if "=" not in o or o.startswith("=")]
    if bad:
        raise ConfigError(f"overrides must be KEY=VALUE (Hydra syntax), got {bad}")
    gateway_bind = gateway_bind_for(cfg, list(extra or []), os.environ)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    train = pool.expand(cfg.run.train_tasks, cfg.run.families)
    files = {"tasks": out / "tasks.parquet", "agent_loops": out / "agent_loops.yaml"}
    write_parquet(task_rows(train), files["tasks"])
    if cfg.run.eval_tasks:
        files["val_tasks"] = out / "val_tasks.parquet"
        write_parquet(task_rows(pool.expand(cfg.run.eval_tasks, cfg.run.eval_families)), files["val_tasks"])
    header = "# verl agent-loop config written by `harnessrl verl prepare` (stack/verl/prepare.py).\n"
    entry = agent_loop_entry(cfg, gateway_bind) | {"segments": segments}
    files["agent_loops"].write_text(header + yaml.safe_dump([entry], sort_keys=False))
    overrides = overrides_for(cfg, files, segments) + list(extra or [])
    files["overrides"] = out / "overrides.txt"
    files["overrides"].write_text("".join(o + "\n" for o in overrides))
    command = ["python", "-m", TRAINERS[segments][1], f"--config-dir={STACK_VERL}", *overrides]
    files["launch"] = out / "launch.sh"
    files["launch"].write_text(launch_script(command, cfg.run_dir / "metrics.jsonl"))
    files["launch"].chmod(0o755)
    return Prepared(
        out=out,
        tasks=len(train),
        temperature=cfg.run.temperature,
        files=files,
        overrides=overrides,
        command=command,
        segments=segments,
    )


def launch_script(command: list[str], metrics: Path) -> str:
    repo = STACK_VERL.parent.parent
    lines = [
        "#!/usr/bin/env bash",
        "# Written by `harnessrl verl prepare`. Run on the head node of the Ray cluster with the",
        "# harnessrl sandbox and capture store running; see stack/verl/README.md.",
        "set -euo pipefail",
        f"cd {shlex.quote(str(repo))}  # agent_loop_config_path and stack.* resolve from here",
        f"export VERL_USE_EXTERNAL_MODULES={HOOKS_MODULE}",
        f"mkdir -p {shlex.quote(str(metrics.parent))}",
        f"export VERL_FILE_LOGGER_PATH=${{VERL_FILE_LOGGER_PATH:-{shlex.quote(str(metrics))}}}",
        " \\\n  ".join([" ".join(shlex.quote(c) for c in command[:4]), *(shlex.quote(c) for c in command[4:])]),
    ]
    return "\n".join(lines) + "\n"


def dry_run(prepared: Prepared) -> Any:
    """Composes verl's config with the overrides and checks it against verl's schema;
    returns the composed DictConfig. Any problem is a ConfigError naming it."""
    import verl.experimental.fully_async_policy as fully_async
    import verl.trainer
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    import stack.verl.hooks  # noqa: F401  (registers harnessrl_grpo, as VERL_USE_EXTERNAL_MODULES does)

    package = fully_async if prepared.segments == "last" else verl.trainer
    config_dir = Path(str(package.__file__)).parent / "config"
    search = f"hydra.searchpath=[pkg://verl.trainer.config,file://{STACK_VERL}]"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose(config_name=TRAINERS[prepared.segments][0], overrides=[search, *prepared.overrides])
        OmegaConf.resolve(cfg.actor_rollout_ref)
        _check_schema(cfg)
    except (HydraException, OmegaConfBaseException, ValueError, TypeError, AssertionError) as e:
        raise ConfigError(f"verl rejects the overrides: {type(e).__name__}: {e}") from e
    finally:
        GlobalHydra.instance().clear()
    _check_agent_loop(cfg)
    verl_temperature = float(cfg.actor_rollout_ref.rollout.temperature)
    if verl_temperature != prepared.temperature:
        raise ConfigError(
            f"actor_rollout_ref.rollout.temperature={verl_temperature} differs from the run's temperature="
            f"{prepared.temperature} ([run] temperature): the trainer would train on another distribution "
            "than the one sampled; set it in [run]"
        )
    return cfg


def _check_schema(cfg: Any) -> None:
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import RolloutConfig

    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    if not isinstance(rollout, RolloutConfig):
        raise ValueError(f"actor_rollout_ref.rollout is not verl's RolloutConfig: {type(rollout).__name__}")
    # omega_conf_to_dataclass does not check value types (n=many passes it); OmegaConf's
    # structured merge does, for the sections the overrides set.
    _typed(RolloutConfig, cfg.actor_rollout_ref.rollout, "actor_rollout_ref.rollout")
    _typed(AlgoConfig, cfg.algorithm, "algorithm")
    algo = omega_conf_to_dataclass(cfg.algorithm, dataclass_type=AlgoConfig)
    core_algos.get_adv_estimator_fn(algo.adv_estimator)
    # verl's own startup check of sizes and exclusive options (main_ppo), CPU arithmetic only.
    # It prints its verdict and warns that GRPO runs without a critic; the verdict is ours to say.
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    if not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        raise ValueError(
            "actor_rollout_ref.rollout.calculate_log_probs must be true (the fully-async rollouter's rule)"
        )


def _typed(cls: type, node: Any, where: str) -> None:
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if k != "_target_"}
        return value

    try:
        OmegaConf.merge(OmegaConf.structured(cls), plain(OmegaConf.to_container(node, resolve=True)))
    except ValidationError as e:
        raise ValueError(f"{where}: {e}") from e


def _check_agent_loop(cfg: Any) -> None:
    from omegaconf import OmegaConf

    agent = cfg.actor_rollout_ref.rollout.agent
    path = Path(str(agent.agent_loop_config_path))
    if not path.is_file():
        raise ConfigError(f"agent_loop_config_path {path} does not exist")
    entries: Any = OmegaConf.load(path)  # verl's worker reads it the same way: a list of entries
    names = [str(entry.name) for entry in entries]
    if str(agent.default_agent_loop) not in names:
        raise ConfigError(f"default_agent_loop {agent.default_agent_loop!r} is not in {path} (has {names})")
