"""The chunked output head (``optim.logit_chunk_tokens``) computes what the
whole-batch head computes: the same logprobs and the same gradients, on the
real SmolLM2-135M-Instruct (tied embeddings) and on a tiny Qwen3-MoE with its
routes replayed; only the memory differs (``harnessrl bench trainer-memory``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harnessrl import paths
from services.trainer import forward, r3, tinymoe
from services.trainer.inputs import Sample
from services.trainer.policy import load_model


def samples(vocab: int, lengths: list[tuple[int, int]], seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for i, (prompt, response) in enumerate(lengths):
        ids = rng.integers(3, vocab, prompt + response).astype(np.int64)
        mask = rng.random(response) < 0.7
        out.append(
            Sample(
                f"t{i}",
                "main/0",
                ids,
                prompt,
                mask,
                np.where(mask, -1.0, 0.0).astype(np.float32),
                np.where(mask, 0, -1).astype(np.int32),
                None,
            )
        )
    return out


def logprobs_and_grads(
    model: torch.nn.Module, batch: list[Sample], chunk: int, routes: forward.RouteContext | None = None
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Logprobs without a graph, then a backward of Σ mask·g·lp (as the trainer does), token budget 64."""
    lps = forward.logprobs_no_grad(model, batch, 64, routes, temperature=0.7, chunk_tokens=chunk)
    grads = [torch.linspace(-1.0, 1.0, s.num_policy_tokens) for s in batch]
    model.zero_grad(set_to_none=True)
    forward.backward_through(model, batch, grads, 64, routes, temperature=0.7, chunk_tokens=chunk)
    return lps, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(model: torch.nn.Module, batch: list[Sample], routes: forward.RouteContext | None = None) -> None:
    """A chunk holding every position is bit-exact; smaller chunks change only the output
    head's matrix-product blocking: fp32 rounding, far below the engine-vs-trainer gap."""
    whole_lp, whole_grad = logprobs_and_grads(model, batch, 0, routes)
    for chunk in (1000, 1, 7):  # more than a micro-batch holds, one position, chunks straddling rows
        lp, grad = logprobs_and_grads(model, batch, chunk, routes)
        atol, rtol = (0.0, 0.0) if chunk == 1000 else (5e-5, 1e-3)
        for a, b in zip(whole_lp, lp, strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=atol)
        assert grad.keys() == whole_grad.keys()
        for name, g in whole_grad.items():
            assert float((grad[name] - g).norm()) <= rtol * float(g.norm()), (chunk, name)


@pytest.mark.skipif(not paths.default_model_dir().exists(), reason="default model not prepared")
def test_chunked_head_matches_the_whole_batch_head_on_smollm2() -> None:
    torch.manual_seed(0)
    model = load_model(paths.default_model_dir(), gradient_checkpointing=False)
    assert forward.decoder_and_head(model) == (model.get_decoder(), model.get_output_embeddings())
    # Rows of different lengths: left padding, two micro-batches, responses of 1 to 9 tokens.
    assert_same(model, samples(model.config.vocab_size, [(5, 9), (3, 4), (8, 1), (2, 6)]))


def test_chunked_head_matches_with_replayed_routes() -> None:
    model = tinymoe.build("tiny", 0)
    model.train()
    batch = samples(model.config.vocab_size, [(6, 8), (4, 5)], seed=1)
    other = tinymoe.build("tiny", 1)  # another model's routes: replay really forces experts
    captured = []
    for s in batch:
        with torch.no_grad(), r3.record(other) as per_layer:
            other(input_ids=torch.from_numpy(s.input_ids)[None], use_cache=False)
        captured.append(r3.stack(per_layer)[s.prompt_len :])
    batch = [
        Sample(s.trial_id, s.segment, s.input_ids, s.prompt_len, s.mask, s.rollout_logprobs, s.versions, routes)
        for s, routes in zip(batch, captured, strict=True)
    ]
    assert_same(model, batch, r3.route_context(model))


def test_a_head_with_logit_postprocessing_takes_the_whole_batch_path() -> None:
    model = tinymoe.build("tiny", 0)
    assert forward.decoder_and_head(model) is not None
    model.config.final_logit_softcapping = 30.0
    assert forward.decoder_and_head(model) is None
