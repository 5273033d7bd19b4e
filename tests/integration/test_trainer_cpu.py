"""The CPU path on the real SmolLM2-135M-Instruct: it learns a scripted reward,
its checkpoints load as plain HF folders and resume bit-exact, a NaN skips the step.

Sequences are tiny (a 5-token prompt, 2 sampled tokens) so this stays fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from harnessrl import paths
from harnessrl.v1 import records_pb2
from services.trainer.cpu_trainer import CpuTrainer
from services.trainer.settings import Settings
from tests.trainer_support import segment, trajectory

pytestmark = pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")

PROMPT = [1, 9690, 198, 19556, 28]
G, GROUPS, RESPONSE = 4, 2, 2


def settings(
    tmp_path: Path, temperature: float = 1.0, algo: dict[str, object] | None = None, **optim: object
) -> Settings:
    return Settings(
        output_dir=tmp_path,
        optim={"lr": 2e-5, "token_budget": 256, "gradient_checkpointing": False, **optim},
        rollout={"temperature": temperature},
        algo=algo or {},
    )


@torch.no_grad()
def target_probability(model: torch.nn.Module, targets: Sequence[int]) -> float:
    logits = model(input_ids=torch.tensor([PROMPT]), use_cache=False).logits[0, -1].float()
    return float(torch.softmax(logits, -1)[list(targets)].sum())


@torch.no_grad()
def rollouts(
    trainer: CpuTrainer, targets: Sequence[int], gen: torch.Generator, tag: str, temperature: float = 1.0
) -> list[tuple[str, list[records_pb2.Trajectory]]]:
    """G x GROUPS samples from the current policy at ``temperature`` (logprobs of the
    tempered distribution, as an engine records them); reward 1 when the first token is a target."""
    ids = torch.tensor([PROMPT] * (G * GROUPS))
    lps = []
    for _ in range(RESPONSE):
        logits = trainer.model(input_ids=ids, use_cache=False).logits[:, -1].float() / temperature
        logp = torch.log_softmax(logits, -1)
        tok = torch.multinomial(logp.exp(), 1, generator=gen)
        lps.append(logp.gather(-1, tok))
        ids = torch.cat([ids, tok], 1)
    responses, logprobs = ids[:, len(PROMPT) :].tolist(), torch.cat(lps, 1).tolist()
    version = [trainer.policy_version] * RESPONSE
    groups = []
    for g in range(GROUPS):
        trajs = []
        for i in range(g * G, (g + 1) * G):
            reward = float(responses[i][0] in targets)
            seg = segment(PROMPT, responses[i], [1] * RESPONSE, logprobs[i], version)
            trajs.append(trajectory(f"{tag}-{i}", f"{tag}-g{g}", reward, [seg]))
        groups.append((f"{tag}-g{g}", trajs))
    return groups


def test_cpu_trainer_improves_a_scripted_reward(tmp_path: Path) -> None:
    trainer = CpuTrainer(settings(tmp_path))
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([PROMPT]), use_cache=False).logits[0, -1]
    targets = torch.topk(logits, 2).indices.tolist()
    gen = torch.Generator().manual_seed(0)
    probs, rewards = [target_probability(trainer.model, targets)], []
    for step in range(3):
        batch = rollouts(trainer, targets, gen, f"s{step}")
        rewards.append(sum(t.reward for _, ts in batch for t in ts) / (G * GROUPS))
        before = trainer.evaluate(batch)["loss/pg"]
        result = trainer.train_step(batch)
        assert result.updated and result.policy_version == step + 1
        after = trainer.evaluate(batch)["loss/pg"]
        if result.metrics.get("groups/zero_variance", 0) < GROUPS:
            assert after < before - 1e-3, (step, before, after)  # the loss on its own batch went down
        assert result.metrics["agreement/pearson"] > 0.999 and result.metrics["agreement/max_abs_diff"] < 1e-3
        probs.append(target_probability(trainer.model, targets))
    assert probs == sorted(probs) and probs[-1] > probs[0] + 0.2, probs  # expected reward rises every step
    final = rollouts(trainer, targets, gen, "final")
    rewards.append(sum(t.reward for _, ts in final for t in ts) / (G * GROUPS))
    assert rewards[-1] > rewards[0], rewards


def test_learning_rate_zero_is_the_control_every_step_runs_no_weight_moves(tmp_path: Path) -> None:
    """lr 0 (the evaluation-only control of a learning run): the step computes its loss and
    gradient and counts as an update, and every weight stays bit-identical."""
    trainer = CpuTrainer(settings(tmp_path, lr=0.0))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([PROMPT]), use_cache=False).logits[0, -1]
    result = trainer.train_step(
        rollouts(trainer, torch.topk(logits, 2).indices.tolist(), torch.Generator().manual_seed(2), "z")
    )
    assert result.updated and result.policy_version == 1 and result.metrics["optim/lr"] == 0.0
    assert result.metrics["optim/grad_norm"] > 0
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


@pytest.mark.parametrize(("trained", "agrees"), [(0.5, True), (1.0, False)])
def test_a_step_on_tempered_rollouts_agrees_at_the_rollout_temperature(
    tmp_path: Path, trained: float, agrees: bool
) -> None:
    """Rollouts sampled at T = 0.5: the trainer's own step matches their logprobs only
    when its [trainer.rollout] temperature is 0.5."""
    trainer = CpuTrainer(settings(tmp_path, temperature=trained))
    result = trainer.train_step(rollouts(trainer, [0, 1], torch.Generator().manual_seed(1), "t", temperature=0.5))
    assert (result.metrics["agreement/max_abs_diff"] < 1e-3) is agrees, result.metrics["agreement/max_abs_diff"]


def test_dropped_zero_variance_groups_neither_dilute_nor_step(tmp_path: Path) -> None:
    """Gradient norms (before clipping) on one informative group plus an all-fail one:
    the same as on the informative group alone when the all-fail group is dropped, half
    of it when it stays in the loss's mean. A batch of only all-fail groups, dropped,
    makes no optimizer step and raises no alert."""
    (informative, trajs), (flat, flats) = rollouts(CpuTrainer(settings(tmp_path)), [0], torch.Generator(), "z")
    for t, reward in zip(trajs, [1.0, 0.0, 1.0, 0.0], strict=True):
        t.reward = reward
    for t in flats:
        t.reward = 0.0
    drop = {"drop_zero_variance_groups": True}

    def grad_norm(batch: list[tuple[str, list[records_pb2.Trajectory]]], algo: dict[str, object]) -> float:
        result = CpuTrainer(settings(tmp_path, algo=algo)).train_step(batch)
        assert result.updated
        return result.metrics["optim/grad_norm"]

    alone = grad_norm([(informative, trajs)], drop)
    assert grad_norm([(informative, trajs), (flat, flats)], drop) == pytest.approx(alone, rel=1e-3)
    assert grad_norm([(informative, trajs), (flat, flats)], {}) == pytest.approx(alone / 2, rel=1e-3)
    result = CpuTrainer(settings(tmp_path, algo=drop)).train_step([(flat, flats)])
    assert not result.updated and result.policy_version == 0 and result.alerts == []
    assert result.metrics["skipped/zero_variance_groups"] == 1 and result.metrics["reward/mean"] == 0.0


def test_checkpoints_are_hf_folders_and_resume_bit_exact(tmp_path: Path) -> None:
    base = CpuTrainer(settings(tmp_path / "a"))
    gen = torch.Generator().manual_seed(1)
    targets = [339, 284]
    b1, b2 = rollouts(base, targets, gen, "b1"), rollouts(base, targets, gen, "b2")
    base.train_step(b1)
    ckpt = base.save(tmp_path / "ckpt")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in ckpt.iterdir()}
    assert [p.name for p in ckpt.glob("*.safetensors")] == ["model.safetensors"]  # engines load every one
    assert (ckpt / "trainer_state" / "optimizer.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    for (name, p), q in zip(base.model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    del loaded
    straight = base.train_step(b2)

    resumed = CpuTrainer(settings(tmp_path / "b"))
    resumed.restore(ckpt)
    assert (resumed.step, resumed.policy_version) == (1, 1)
    again = resumed.train_step(b2)
    assert again.metrics["loss/total"] == straight.metrics["loss/total"]
    assert again.metrics["optim/grad_norm"] == straight.metrics["optim/grad_norm"]
    for (name, p), q in zip(base.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    del base

    # A NaN in the weights makes the loss NaN: the step is skipped with an alert, nothing changes.
    with torch.no_grad():
        next(resumed.model.parameters())[0, 0] = float("nan")
    version = resumed.policy_version
    bad = resumed.train_step(b1)
    assert not bad.updated and resumed.policy_version == version
    assert bad.metrics["step/skipped_nan"] == 1.0 and any("non-finite" in a for a in bad.alerts)


def test_restore_rejects_a_folder_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    from harnessrl.errors import NotFound

    trainer = CpuTrainer(settings(tmp_path))
    with pytest.raises(NotFound, match="not a trainer checkpoint"):
        trainer.restore(tmp_path)
