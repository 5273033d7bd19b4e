"""R3 on a tiny random Qwen3-MoE built from a config (no download): sampled in
bf16, trained in fp32; replaying the sampler's routes must cut the worst
|Δlogprob| on re-routed tokens at least 5x, and replaying a model's own routes
must reproduce its logits exactly."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen3MoeForCausalLM

from services.trainer import r3, tinymoe
from services.trainer.cpu_trainer import CpuTrainer
from services.trainer.settings import Settings
from tests.trainer_support import segment, trajectory

VOCAB, ROWS, PROMPT, RESPONSE = 1024, 8, 4, 44


def tiny_moe(seed: int = 0) -> Qwen3MoeForCausalLM:
    return tinymoe.build("tiny", seed)


def token_logprobs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, use_cache=False).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]


@torch.no_grad()
def sample_bf16(engine: torch.nn.Module, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 'engine': samples in bf16, then reports its logprobs and routes for the whole sequence."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (ROWS, PROMPT), generator=gen)
    for _ in range(RESPONSE):
        logits = engine(input_ids=ids, use_cache=False).logits[:, -1].float()
        ids = torch.cat([ids, torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)], 1)
    with r3.record(engine) as routes:
        lp = token_logprobs(engine, ids)
    return ids, lp, torch.stack(routes, 1)


@pytest.mark.parametrize("seed", [0, 1])
def test_replay_cuts_the_worst_logprob_gap_on_rerouted_tokens(seed: int) -> None:
    model = tiny_moe(seed)
    assert 1e6 < sum(p.numel() for p in model.parameters()) < 2e7  # a few M parameters
    engine = copy.deepcopy(model).to(torch.bfloat16)
    ids, engine_lp, engine_routes = sample_bf16(engine, seed)
    with torch.no_grad():
        with r3.record(model) as natural:
            natural_lp = token_logprobs(model, ids)
        with r3.replay(model, engine_routes, torch.ones(ids.numel(), dtype=torch.bool)):
            replay_lp = token_logprobs(model, ids)
    own = torch.stack(natural, 1).sort(-1).values
    rerouted = (own != engine_routes.sort(-1).values).any(-1).any(-1).view(ids.shape)[:, 1:]
    assert rerouted.sum() >= 5, "the bf16 engine should pick other experts on some tokens"
    worst_natural = float((natural_lp - engine_lp).abs()[rerouted].max())
    worst_replay = float((replay_lp - engine_lp).abs()[rerouted].max())
    assert worst_natural >= 5 * worst_replay, (worst_natural, worst_replay)


def test_replaying_own_routes_reproduces_logits_exactly() -> None:
    model = tiny_moe()
    ids = torch.randint(0, VOCAB, (3, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        with r3.record(model) as own:
            logits = model(input_ids=ids).logits
        with r3.replay(model, torch.stack(own, 1), torch.ones(ids.numel(), dtype=torch.bool)):
            replayed = model(input_ids=ids).logits
    assert torch.equal(logits, replayed)
    assert r3.stack(own).dtype == np.uint8 and r3.stack(own).shape == (60, 4, 2)


def test_replay_rejects_routes_that_do_not_fit() -> None:
    model = tiny_moe()
    ids = torch.zeros((1, 5), dtype=torch.long)
    with pytest.raises(ValueError, match="layers"), r3.replay(model, torch.zeros(5, 3, 2), torch.ones(5, dtype=bool)):
        model(input_ids=ids)
    with pytest.raises(ValueError, match="tokens"), r3.replay(model, torch.zeros(7, 4, 2), torch.ones(7, dtype=bool)):
        model(input_ids=ids)


def test_cpu_trainer_replays_captured_routes(tmp_path: Path) -> None:
    """Captured segments carrying routes: the training forward with R3 agrees with the
    bf16 engine better than without, and a step trains."""
    model = tiny_moe()
    model.save_pretrained(tmp_path / "moe")
    engine = copy.deepcopy(model).to(torch.bfloat16)
    ids, engine_lp, engine_routes = sample_bf16(engine, 0)
    routes = engine_routes.view(ROWS, PROMPT + RESPONSE, 4, 2).to(torch.uint8).numpy()
    trajs = []
    for row in range(ROWS):
        prompt, response = ids[row, :PROMPT].tolist(), ids[row, PROMPT:].tolist()
        lps = engine_lp[row, PROMPT - 1 :].tolist()
        seg = segment(prompt, response, [1] * RESPONSE, lps, [0] * RESPONSE, routes=routes[row, PROMPT:])
        trajs.append(trajectory(f"t{row}", "g", float(row % 2), [seg]))
    metrics = {}
    for replay in (False, True):
        settings = Settings(
            model_path=tmp_path / "moe",
            output_dir=tmp_path / "out",
            algo={"routing_replay": replay, "tis_cap": 2.0},
            optim={"lr": 1e-4, "gradient_checkpointing": True, "token_budget": 256},
        )
        trainer = CpuTrainer(settings)
        result = trainer.train_step([("g", trajs)])
        assert result.updated
        metrics[replay] = result.metrics
    assert metrics[True]["agreement/max_abs_diff"] < metrics[False]["agreement/max_abs_diff"] / 2
    assert metrics[True]["agreement/ess"] >= metrics[False]["agreement/ess"]


def test_routes_that_do_not_fit_are_not_replayed() -> None:
    from services.trainer.forward import collate
    from services.trainer.samples import StepCounters, build_rows

    bad_shape = np.zeros((2, 3, 2), dtype=np.uint8)
    bad_index = np.full((2, 4, 2), 200, dtype=np.uint8)
    good = np.ones((2, 4, 2), dtype=np.uint8)
    segs = [
        segment([1], [2, 3], [1, 1], [-1.0, -1.0], routes=r, index=i)
        for i, r in enumerate([bad_shape, bad_index, good])
    ]
    (row,) = build_rows([trajectory("t", "g", 1.0, segs)], StepCounters(), 64)
    routes, force = r3.batch_routes(collate(row.samples), num_layers=4, top_k=2, num_experts=16)
    assert force.view(3, 3).tolist() == [[False] * 3, [False] * 3, [False, True, True]]
    assert routes.view(3, 3, 4, 2)[2, 1:].eq(1).all()
