"""Settings of the trainer service (``[trainer]`` in a config file, env prefix ``HARNESSRL_TRAINER_``).

The algorithm, optimizer and async knobs are nested tables (``[trainer.algo]``,
``[trainer.optim]``, ``[trainer.rollout]``) so a config file reads like the
design: what is optimised, how, and how far rollouts may run ahead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from harnessrl.config import ServiceSettings
from harnessrl.torchdevice import DEVICE_HELP, check_device_name

ADV_ESTIMATORS = ("grpo", "grpo_vectorized", "rloo", "rloo_vectorized")
LOSS_MODES = ("gspo", "vanilla", "grpo")
AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_TYPES = ("k1", "k2", "k3", "low_var_kl", "abs", "mse")


class AlgoSettings(BaseModel):
    """What is optimised: advantages, the policy loss and its corrections."""

    model_config = ConfigDict(extra="forbid")

    adv_estimator: Literal["grpo", "grpo_vectorized", "rloo", "rloo_vectorized"] = Field(
        "grpo", description="verl advantage estimator (outcome-only ones: a reward per trajectory)."
    )
    norm_adv_by_std: bool = Field(True, description="GRPO: divide by the group std (False = Dr.GRPO).")
    adv_epsilon: float = Field(1e-6, gt=0, description="Added to the group std before dividing.")
    loss_mode: Literal["gspo", "vanilla", "grpo"] = Field(
        "gspo",
        description="gspo: sequence-level ratio over all policy tokens of a trajectory; vanilla/grpo: token-level PPO.",
    )
    loss_agg_mode: (
        Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
        | None
    ) = Field(None, description="verl agg_loss mode; unset = seq-mean-token-mean for gspo, token-mean else.")
    loss_scale_factor: int | None = Field(None, gt=0, description="For seq-mean-token-sum-norm (verl).")
    clip_ratio_low: float | None = Field(None, ge=0, le=1, description="Unset: 3e-4 for gspo, 0.2 else.")
    clip_ratio_high: float | None = Field(None, ge=0, le=10, description="Unset: 4e-4 for gspo, 0.28 else.")
    clip_ratio_c: float = Field(3.0, gt=1, description="Dual-clip bound for negative advantages (token-level PPO).")
    kl_coef: float = Field(0.0, ge=0, description="KL-to-reference loss coefficient; 0 = no reference model.")
    kl_type: Literal["k1", "k2", "k3", "low_var_kl", "abs", "mse"] = "low_var_kl"
    proximal: Literal["recompute", "rollout"] = Field(
        "recompute",
        description="recompute: ratio against the training weights at step start, rollout logprobs corrected by "
        "truncated IS; rollout: ratio directly against the engine's logprobs (no extra correction).",
    )
    tis_cap: float | None = Field(
        2.0, gt=0, description="Truncated importance-sampling cap on exp(train - rollout); unset disables."
    )
    tis_level: Literal["token", "sequence"] = "token"
    routing_replay: bool = Field(
        True, description="R3: force the experts captured at sampling time (MoE models with captured routes)."
    )
    success_threshold: float = Field(1.0, description="A trajectory with reward >= this counts as a success.")
    min_valid_per_group: int = Field(2, ge=1, description="Groups with fewer valid trajectories are skipped.")
    drop_zero_variance_groups: bool = Field(
        False,
        description="DAPO-style filter: a group whose valid rewards are all equal (zero advantage) leaves the "
        "loss instead of diluting its mean; a step left with no group makes no optimizer step.",
    )
    agreement_min_pearson: float = Field(0.98, ge=-1, le=1, description="Alert when train/inference Pearson < this.")
    agreement_min_ess: float = Field(0.5, ge=0, le=1, description="Alert when normalised ESS of IS weights < this.")


class OptimSettings(BaseModel):
    """How it is optimised on the CPU path."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(
        1e-6,
        ge=0,
        le=1,
        description="AdamW's learning rate; 0 is the evaluation-only control (every step runs, no weight moves).",
    )
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    token_budget: int = Field(4096, ge=16, description="Padded tokens per micro-batch.")
    logit_chunk_tokens: int = Field(
        256,
        ge=0,
        description="Positions whose [positions x vocab] logits exist at once (output head and log-softmax in "
        "chunks, recomputed in the backward); 0 = a whole micro-batch's at once.",
    )
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per training step (groups split evenly).")
    gradient_checkpointing: bool = True
    seed: int = 0
    max_seq_len: int = Field(8192, ge=8, description="Samples longer than this are skipped and counted.")


class RolloutSettings(BaseModel):
    """How far rollouts may run ahead of the optimizer."""

    model_config = ConfigDict(extra="forbid")

    groups_per_step: int = Field(8, ge=1, description="Ready groups consumed per optimizer step.")
    temperature: float = Field(
        1.0,
        gt=0,
        le=5,
        description="The run's sampling temperature (the proxy's): train logprobs use logits / temperature for "
        "segments that recorded no sampling; a segment that did is trained at its own.",
    )
    max_staleness: int = Field(1, ge=0, description="k: groups more than k versions behind are dropped; 0 = sync.")
    max_groups_in_flight: int = Field(
        0, ge=0, description="Rollout capacity in groups (fleet slots / G); 0 = only the staleness window limits."
    )
    partial_rollout: bool = Field(True, description="Pause/UpdateWeights/Resume the gateway around a weight sync.")
    sync_every: int = Field(1, ge=1, description="Publish weights to the gateway every N steps.")
    pause_timeout_s: float = Field(30.0, gt=0)
    max_steps: int = Field(
        0, ge=0, description="Stop once the run has this many steps (a resumed trainer counts earlier ones); 0 = never."
    )
    wait_timeout_s: float = Field(0.0, ge=0, description="Give up waiting for groups after this long; 0 = never.")


class Settings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESSRL_TRAINER_", extra="forbid", validate_default=True)

    run_id: str = Field("default", min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    model_path: Path | None = Field(None, description="HF model folder; unset = the default model.")
    output_dir: Path | None = Field(None, description="Checkpoints and TensorBoard files; unset = runs/<run_id>.")
    capture_target: str | None = Field(None, description="host:port of the capture store.")
    gateway_target: str | None = Field(None, description="host:port of the rollout gateway.")
    service_token: SecretStr | None = Field(None, description="Bearer token for calls to other services.")
    consumer_group: str = Field("trainer", min_length=1)
    keep_checkpoints: int = Field(3, ge=1, description="Newest checkpoints kept on disk.")
    device: str = Field("auto", description=f"Where the policy trains: {DEVICE_HELP}.")
    dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="The policy's weights (and optimizer state); logprobs come from fp32 logits either way."
    )
    algo: AlgoSettings = Field(default_factory=AlgoSettings)  # type: ignore[arg-type]
    optim: OptimSettings = Field(default_factory=OptimSettings)  # type: ignore[arg-type]
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)  # type: ignore[arg-type]

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        return check_device_name(value)

    def resolved_model_path(self) -> Path:
        from harnessrl import paths

        return self.model_path or paths.default_model_dir()

    def resolved_output_dir(self) -> Path:
        from harnessrl import paths

        return self.output_dir or paths.runs_dir() / self.run_id / "trainer"
