"""The forward divides each row's logits by its own segment's temperature: a batch that
mixes segments sampled at different temperatures scores each as it would alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from services.trainer import tinymoe
from services.trainer.forward import collate, response_logprobs
from services.trainer.inputs import Sample


def _sample(ids: list[int], prompt_len: int, temperature: float | None) -> Sample:
    n = len(ids) - prompt_len
    return Sample(
        trial_id="t",
        segment="main/0",
        input_ids=np.asarray(ids, np.int64),
        prompt_len=prompt_len,
        mask=np.ones(n, np.bool_),
        rollout_logprobs=np.zeros(n, np.float32),
        versions=np.zeros(n, np.int32),
        routes=None,
        temperature=temperature,
    )


@torch.no_grad()
def test_mixed_temperatures_in_one_batch_score_each_row_at_its_own() -> None:
    model = tinymoe.build().eval()
    cold = _sample([1, 5, 9, 14, 3, 7], 2, 0.5)
    hot = _sample([2, 8, 4, 11], 1, 1.7)
    legacy = _sample([6, 3, 12, 5, 9], 2, None)  # recorded no sampling: the run's temperature
    together = response_logprobs(model, collate([cold, hot, legacy]), temperature=0.9)
    alone = [
        response_logprobs(model, collate([dataclasses.replace(s, temperature=None)]), temperature=t)[0]
        for s, t in ((cold, 0.5), (hot, 1.7), (legacy, 0.9))
    ]
    for got, want in zip(together, alone, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # and it matters: the cold row at the run's temperature is another distribution
    other = response_logprobs(model, collate([dataclasses.replace(cold, temperature=None)]), temperature=0.9)[0]
    assert (other - alone[0]).abs().max() > 1e-3
